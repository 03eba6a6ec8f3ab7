"""Callbacks that make training safe to interrupt and stop it when it diverges.

`train_and_evaluate` uses three of them (see `training._make_callbacks`):

- `TrainingStateBackup`: backs up the whole training state (weights,
  optimizer variables, epoch and step inside the epoch) at every epoch end
  and every `save_every_steps` steps, and restores it when `fit` starts
  again. A run killed at any moment (SIGKILL included) and started again
  with the same command continues from the last backup and runs the same
  total number of optimizer steps as an uninterrupted run: the epoch it
  resumes in is cut short by the steps done before the interruption.
- `WeightsCheckpoint`: the model weights (no optimizer state: a third of
  the size) after every epoch, or only when a monitored value improves.
- `DivergenceGuard`: raises `TrainingDivergedError`, naming the epoch and
  step, as soon as the loss is NaN or infinite, before anything from that
  step is saved.

Every file is written atomically: into a temporary file in the same
directory, flushed to disk, then renamed over the old one (`os.replace`), so
a kill while saving leaves the previous file as it was, never a half-written
one under the real name. Each file carries, as HDF5 attributes, the epoch and
step it was saved at, a fingerprint of the model's weight shapes, and a
SHA-256 checksum of the saved values; `load_weights` checks them and raises
`CheckpointError` naming the file when it is truncated, corrupted or of
another model. The backup keeps the state before the last one as well, and
falls back to it (with a warning naming the bad file) when the last one does
not load.

Files written by Keras (`model.save_weights`, `ModelCheckpoint`,
`BackupAndRestore`) load too, without the checks their attributes allow.
"""

import contextlib
import glob
import hashlib
import json
import math
import os
import tempfile

import keras
import numpy as np
from absl import logging

__all__ = [
    "CheckpointError",
    "DivergenceGuard",
    "TrainingDivergedError",
    "TrainingStateBackup",
    "WeightsCheckpoint",
    "load_weights",
    "read_checkpoint_metadata",
    "save_weights_atomically",
    "weights_fingerprint",
]

# HDF5 attribute of the root group holding the JSON metadata of a checkpoint.
_METADATA_ATTRIBUTE = "capsnet_tf_checkpoint"
_SUFFIX = ".weights.h5"
_TEMPORARY_SUFFIX = ".tmp" + _SUFFIX


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used: truncated, corrupted or of another model.

    Attributes:
        path: the file.
    """

    def __init__(self, message, path):
        super().__init__(message)
        self.path = path


class TrainingDivergedError(ValueError):
    """The loss (or the weights) became NaN or infinite during training.

    Attributes:
        epoch: the epoch, counted from 1 as Keras prints it.
        step: the step inside that epoch, counted from 1 (None: unknown).
        global_step: the optimizer step, counted from 1 since the start of the run.
        quantity: what was not finite (`"loss"`, `"val_loss"`, `"weights"`).
        value: its value.
    """

    def __init__(self, message, epoch, step, global_step, quantity, value):
        super().__init__(message)
        self.epoch = epoch
        self.step = step
        self.global_step = global_step
        self.quantity = quantity
        self.value = value


def weights_fingerprint(model):
    """A short hash of the shapes of `model.weights`, in order.

    Two models whose weights can be loaded into each other have the same
    fingerprint; a different architecture (other shapes or number of
    weights) has another.
    """
    shapes = [[int(size) for size in variable.shape] for variable in model.weights]
    return hashlib.sha256(json.dumps(shapes).encode()).hexdigest()[:16]


def _saved_variables(model, include_optimizer):
    variables = list(model.weights)
    if include_optimizer and getattr(model, "optimizer", None) is not None:
        variables += list(model.optimizer.variables)
    return variables


def _checksum(variables):
    digest = hashlib.sha256()
    for variable in variables:
        value = np.ascontiguousarray(keras.ops.convert_to_numpy(variable))
        digest.update(str(value.dtype).encode())
        digest.update(value.tobytes())
    return digest.hexdigest()


def _all_finite(variables):
    for variable in variables:
        value = keras.ops.convert_to_numpy(variable)
        if value.dtype.kind == "f" and not np.all(np.isfinite(value)):
            return False
    return True


def _umask():
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fsync_file(path):
    with open(path, "rb") as file:
        os.fsync(file.fileno())


def _fsync_directory(directory):
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. platforms that cannot open directories
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def _temporary_pattern(filepath):
    directory, name = os.path.split(os.path.abspath(filepath))
    return directory, f".{name[:-len(_SUFFIX)]}.", _TEMPORARY_SUFFIX


def remove_stale_temporaries(filepath):
    """Deletes temporary files that a killed `save_weights_atomically(filepath)` left."""
    directory, prefix, suffix = _temporary_pattern(filepath)
    for path in glob.glob(os.path.join(glob.escape(directory), f"{glob.escape(prefix)}*{suffix}")):
        with contextlib.suppress(OSError):
            os.remove(path)


def save_weights_atomically(
    model, filepath, include_optimizer=False, metadata=None, previous=None
):
    """Saves `model`'s weights to `filepath` so that the file is never half written.

    The weights go to a temporary file in the same directory, which is
    flushed to disk and then renamed to `filepath` (`os.replace`, atomic on
    POSIX and Windows): whenever the process is killed, `filepath` is either
    the old complete file or the new complete file.

    Args:
        model: a built Keras model.
        filepath: the target, ending in `.weights.h5`.
        include_optimizer: also save the optimizer's variables (iterations,
            Adam's moments), as `model.save_weights` does for a compiled model.
        metadata: JSON-serialisable dict stored in the file (see
            `read_checkpoint_metadata`); the weight fingerprint and a
            checksum of the saved values are added to it.
        previous: keep the file that `filepath` held under this name
            (replacing what was there) instead of deleting it. Both renames
            come after the new file is complete; a kill between them leaves
            only `previous`, the newest complete state but one.

    Returns:
        The metadata written.
    """
    filepath = os.fspath(filepath)
    if not filepath.endswith(_SUFFIX):
        raise ValueError(f"`filepath` must end in {_SUFFIX}. Received: filepath={filepath}")
    import h5py

    directory, prefix, suffix = _temporary_pattern(filepath)
    os.makedirs(directory, exist_ok=True)
    optimizer = getattr(model, "optimizer", None)
    skip = None if include_optimizer or optimizer is None else [optimizer]
    metadata = dict(metadata or {})
    metadata["fingerprint"] = weights_fingerprint(model)
    metadata["includes_optimizer"] = bool(include_optimizer and optimizer is not None)
    metadata["checksum"] = _checksum(_saved_variables(model, include_optimizer))
    descriptor, temporary = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=directory)
    os.close(descriptor)
    try:
        # mkstemp makes the file private (0600): give it the usual permissions.
        os.chmod(temporary, 0o666 & ~_umask())
        keras.saving.save_weights(model, temporary, objects_to_skip=skip)
        with h5py.File(temporary, "a") as file:
            file.attrs[_METADATA_ATTRIBUTE] = json.dumps(metadata)
        _fsync_file(temporary)
        if previous is not None and os.path.exists(filepath):
            os.replace(filepath, previous)
        os.replace(temporary, filepath)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise
    _fsync_directory(directory)
    return metadata


def _describe(error):
    text = str(error).strip() or type(error).__name__
    return " ".join(text.split())[:300]


def read_checkpoint_metadata(filepath):
    """The metadata stored by `save_weights_atomically` (`{}` for other files).

    Raises:
        CheckpointError: the file is not a readable HDF5 file (truncated,
            corrupted); the message names it.
    """
    import h5py

    try:
        with h5py.File(filepath, "r") as file:
            text = file.attrs.get(_METADATA_ATTRIBUTE)
    except Exception as error:  # h5py raises OSError, sometimes others
        raise CheckpointError(
            f"The checkpoint {filepath} is truncated or corrupted: it is not a readable "
            f"HDF5 weights file ({_describe(error)}).",
            filepath,
        ) from None
    if text is None:
        return {}
    if isinstance(text, bytes):
        text = text.decode()
    try:
        return json.loads(text)
    except ValueError:
        raise CheckpointError(
            f"The checkpoint {filepath} is corrupted: its metadata is not valid JSON.",
            filepath,
        ) from None


def load_weights(model, filepath, include_optimizer=False):
    """Loads a checkpoint into `model`, checking that it is complete and fits.

    Args:
        model: a built Keras model (compiled, for `include_optimizer`).
        filepath: a `.weights.h5` file.
        include_optimizer: also restore the optimizer's variables; the
            optimizer is built first when it is not. Otherwise the
            optimizer is left as it is, whatever the file holds.

    Returns:
        The file's metadata (`read_checkpoint_metadata`).

    Raises:
        FileNotFoundError: no such file.
        CheckpointError: the file is truncated or corrupted (not readable,
            or its values do not match the checksum saved with them), holds
            no optimizer state when `include_optimizer` is asked for, or is
            of a model with other weight shapes. The message names the file;
            `model` may then hold part of the file's values.
    """
    filepath = os.fspath(filepath)
    if not os.path.exists(filepath):
        raise FileNotFoundError(f"The checkpoint {filepath} does not exist.")
    metadata = read_checkpoint_metadata(filepath)
    fingerprint = metadata.get("fingerprint")
    if fingerprint is not None and fingerprint != weights_fingerprint(model):
        raise CheckpointError(
            f"The checkpoint {filepath} holds the weights of a different model (other "
            "weight shapes) and cannot be loaded into this one.",
            filepath,
        )
    optimizer = getattr(model, "optimizer", None)
    if include_optimizer and metadata and not metadata.get("includes_optimizer"):
        raise CheckpointError(
            f"The checkpoint {filepath} holds no optimizer state, so training cannot "
            "resume from it.",
            filepath,
        )
    if include_optimizer and optimizer is not None and not optimizer.built:
        strategy = getattr(model, "distribute_strategy", None)  # TensorFlow backend
        if strategy is not None:
            with strategy.scope():
                optimizer.build(model.trainable_variables)
        else:
            optimizer.build(model.trainable_variables)
    skip = None if include_optimizer or optimizer is None else [optimizer]
    try:
        if skip:
            model.load_weights(filepath, objects_to_skip=skip)
        else:
            model.load_weights(filepath)
    except Exception as error:
        raise CheckpointError(
            f"The checkpoint {filepath} is truncated, corrupted or of a different model: "
            f"loading it failed ({_describe(error)}).",
            filepath,
        ) from None
    expected = metadata.get("checksum")
    if expected is not None:
        actual = _checksum(_saved_variables(model, metadata.get("includes_optimizer", False)
                                            and include_optimizer))
        if actual != expected:
            raise CheckpointError(
                f"The checkpoint {filepath} is corrupted: the values read from it do not "
                "match the checksum written with them.",
                filepath,
            )
    return metadata


def _format_step(step, steps):
    if step is None:
        return ""
    return f", step {step}" + (f" of {steps}" if steps else "")


class DivergenceGuard(keras.callbacks.Callback):
    """Stops training with `TrainingDivergedError` when the loss is NaN or infinite.

    Checks the loss after every training step and `loss`/`val_loss` at every
    epoch end, and raises at once: `fit` ends without running the other
    callbacks' epoch-end or train-end methods, so no checkpoint or backup is
    written from the diverged step. Place it first in the callback list, so
    that it runs before the callbacks that save.

    Args:
        backup: the run's `TrainingStateBackup`, to name its last backup in
            the message (optional).
        advice: the sentence that tells the user what to do.
    """

    def __init__(self, backup=None, advice=None):
        super().__init__()
        self.backup = backup
        self.advice = advice or (
            "Lower the learning rate (or check the input data) and run again: a rerun "
            "in the same work directory continues from the last backup."
        )
        self._epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if logs and logs.get("loss") is not None:
            self._check("loss", logs["loss"], batch)

    def on_epoch_end(self, epoch, logs=None):
        for name in ("loss", "val_loss"):
            if logs and logs.get(name) is not None:
                self._check(name, logs[name], None)

    def _check(self, name, value, batch):
        value = float(np.asarray(value))
        if math.isfinite(value):
            return
        if self.backup is not None:
            # A training loss comes from the weights before the step's update, a
            # validation loss from the current ones: a backup of those weights
            # led to the divergence, so the one before it is the last good state.
            iterations = _iterations(self.model)
            self.backup.discard_since(iterations - 1 if batch is not None else iterations)
        raise diverged_error(self.model, self._epoch, batch, name, value, self.backup, self.advice)


def _iterations(model):
    return int(keras.ops.convert_to_numpy(model.optimizer.iterations))


def diverged_error(model, epoch, batch, quantity, value, backup=None, advice=""):
    """The `TrainingDivergedError` for `quantity` at `epoch` (0-based) and `batch`."""
    global_step = _iterations(model)
    steps = step = None
    if backup is not None:
        steps = backup.steps_per_epoch
        if batch is not None:
            step = backup.step_in_epoch(epoch, batch)
    elif batch is not None:
        step = batch + 1
    where = f"epoch {epoch + 1}{_format_step(step, steps)} (global step {global_step})"
    if quantity == "val_loss":
        what = f"the validation loss is {value} after {where}"
    elif quantity == "weights":
        what = f"the weights are not finite after {where}"
    else:
        what = f"the loss is {value} at {where}"
    kept = ""
    if backup is not None and backup.last_saved is not None:
        saved = backup.last_saved
        if saved["step_in_epoch"]:
            when = f"epoch {saved['epoch'] + 1}, step {saved['step_in_epoch']}"
        else:
            when = f"the end of epoch {saved['epoch']}"
        kept = (
            f" The last backup, {backup.state_path}, is from global step "
            f"{saved['global_step']} ({when})."
        )
    message = (
        f"Training diverged: {what}. Training was stopped there; nothing from that step "
        f"was saved, so the checkpoints and the training backup hold the last good state."
        f"{kept} {advice}"
    ).strip()
    return TrainingDivergedError(message, epoch + 1, step, global_step, quantity, value)


class WeightsCheckpoint(keras.callbacks.Callback):
    """Saves the model weights (no optimizer state) atomically at epoch ends.

    Like `keras.callbacks.ModelCheckpoint(save_weights_only=True)`, but the
    file is replaced atomically (`save_weights_atomically`), holds the model
    weights only (a third of the size with Adam), and records the epoch and
    monitored value. Loads with `model.load_weights` or `load_weights`.

    Args:
        filepath: the `.weights.h5` file.
        monitor: save only when this log value improves (None: every epoch).
        mode: `"max"` or `"min"`: what improving means.
        initial_value_threshold: the value to beat at the start (e.g. the
            best of an interrupted earlier run); ignored when the existing
            file is of a different model.
    """

    def __init__(self, filepath, monitor=None, mode="max", initial_value_threshold=None):
        super().__init__()
        if mode not in ("max", "min"):
            raise ValueError(f'`mode` must be "max" or "min". Received: mode={mode!r}')
        self.filepath = os.fspath(filepath)
        self.monitor = monitor
        self.mode = mode
        self.initial_value_threshold = initial_value_threshold
        self.best = initial_value_threshold
        self._warned = False

    def on_train_begin(self, logs=None):
        remove_stale_temporaries(self.filepath)
        if self.monitor and self.best is not None and os.path.exists(self.filepath):
            try:
                saved = read_checkpoint_metadata(self.filepath).get("fingerprint")
            except CheckpointError:
                saved = None
            if saved is not None and saved != weights_fingerprint(self.model):
                # A run of another model was overwritten (--overwrite): start afresh.
                self.best = None

    def _improved(self, value):
        if self.best is None:
            return True
        return value > self.best if self.mode == "max" else value < self.best

    def on_epoch_end(self, epoch, logs=None):
        metadata = {"epoch": epoch + 1}
        if self.monitor:
            value = (logs or {}).get(self.monitor)
            if value is None:
                if not self._warned:
                    logging.warning(
                        "%s is not saved: %r is not in the epoch logs (%s).",
                        self.filepath, self.monitor, ", ".join(sorted(logs or {})),
                    )
                    self._warned = True
                return
            value = float(np.asarray(value))
            if not math.isfinite(value) or not self._improved(value):
                return
            self.best = value
            metadata[self.monitor] = value
        if not _all_finite(self.model.trainable_variables):
            raise diverged_error(self.model, epoch, None, "weights", float("nan"))
        save_weights_atomically(self.model, self.filepath, include_optimizer=False,
                                metadata=metadata)


class TrainingStateBackup(keras.callbacks.Callback):
    """Backs up and restores the training state so that a killed run resumes exactly.

    The state (weights, optimizer variables including the step counter that
    drives the learning-rate schedule, epoch, step inside the epoch) is
    written atomically to `<backup_dir>/training_state.weights.h5` at every
    epoch end and every `save_every_steps` optimizer steps; the state before
    it is kept as `training_state.previous.weights.h5`.

    When `fit` starts, the last state is restored; if it does not load (a
    truncated or corrupted file), a warning names it, it is renamed to
    `*.corrupt` and the previous state is used. Training then continues in the
    saved epoch, which is cut short by the steps already done in it, so the
    run ends with as many optimizer steps as an uninterrupted one. (The
    resumed epoch sees the first batches of a new pass over the data, not the
    ones the interrupted run would have seen next.) A finished run stays
    finished: fitting again trains no further epochs. The rows of the CSV log
    (`csv_log`) of epochs that are redone are removed, so that it keeps one
    row per epoch. A state saved from a model with other weight shapes (the
    work directory was overwritten) is deleted with a warning, and training
    starts afresh.

    Put it last in the callback list: its epoch-end backup then records an
    epoch as done only after the other callbacks have saved that epoch's
    checkpoints and logs.

    Args:
        backup_dir: directory of the backup files (created when needed).
        save_every_steps: also back up every this many optimizer steps
            (None: at epoch ends only).
        csv_log: the `keras.callbacks.CSVLogger` file of the run, if any.

    Raises (from `fit`):
        CheckpointError: every backup in `backup_dir` is unreadable.
    """

    STATE_FILE = "training_state.weights.h5"
    PREVIOUS_FILE = "training_state.previous.weights.h5"
    # Keras BackupAndRestore's files, read when there is no state of ours.
    _KERAS_FILES = (("latest.weights.h5", "training_metadata.json"),
                    ("latest.weights.h5.bkp", "training_metadata.json.bkp"))

    def __init__(self, backup_dir, save_every_steps=None, csv_log=None):
        super().__init__()
        if save_every_steps is not None and (
            not isinstance(save_every_steps, int) or save_every_steps < 1
        ):
            raise ValueError(
                "`save_every_steps` must be None or a positive integer. "
                f"Received: save_every_steps={save_every_steps!r}"
            )
        self.backup_dir = os.fspath(backup_dir)
        self.save_every_steps = save_every_steps
        self.csv_log = csv_log
        self.state_path = os.path.join(self.backup_dir, self.STATE_FILE)
        self.previous_path = os.path.join(self.backup_dir, self.PREVIOUS_FILE)
        self.restored = None
        self.last_saved = None
        self.steps_per_epoch = None
        self._resume_epoch = 0
        self._resume_step = 0
        self._epoch = 0
        self._offset = 0
        self._step = 0
        self._stop_after = None
        self._stopped_epoch = False

    # --- Restoring -------------------------------------------------------

    def on_train_begin(self, logs=None):
        remove_stale_temporaries(self.state_path)
        self.steps_per_epoch = self.params.get("steps") if self.params else None
        state = self._restore()
        self.restored = state
        epoch = step = 0
        if state is not None:
            self.last_saved = state
            epoch, step = int(state["epoch"]), int(state["step_in_epoch"])
            known = self.steps_per_epoch or state.get("steps_per_epoch")
            if self.steps_per_epoch is None and known:
                self.steps_per_epoch = known
            if step and known and step >= known:
                epoch, step = epoch + 1, 0
            elif step and not known:
                logging.warning(
                    "Resuming in epoch %d after step %d, but the number of steps per epoch "
                    "is unknown: that epoch runs in full.", epoch + 1, step,
                )
            self.model._initial_epoch = epoch  # as keras.callbacks.BackupAndRestore does
            logging.info(
                "Resumed training from %s at global step %d: %d epoch(s) done, and %d "
                "step(s) of the next.", state["path"], state["global_step"], epoch, step,
            )
        self._resume_epoch, self._resume_step = epoch, step
        self._trim_csv_log(epoch)

    def _candidates(self):
        ours = [path for path in (self.state_path, self.previous_path) if os.path.exists(path)]
        if ours:
            return [(path, None) for path in ours]
        return [
            (os.path.join(self.backup_dir, weights), os.path.join(self.backup_dir, metadata))
            for weights, metadata in self._KERAS_FILES
            if os.path.exists(os.path.join(self.backup_dir, weights))
        ]

    def _restore(self):
        """Loads the newest usable backup; returns its metadata, or None."""
        failed = []
        for path, keras_metadata in self._candidates():
            try:
                metadata = read_checkpoint_metadata(path)
                fingerprint = metadata.get("fingerprint")
                if fingerprint is not None and fingerprint != weights_fingerprint(self.model):
                    logging.warning(
                        "The training backup in %s is of a different model (the work "
                        "directory was overwritten); deleting it and starting afresh.",
                        self.backup_dir,
                    )
                    for stale in (self.state_path, self.previous_path):
                        if os.path.exists(stale):
                            os.remove(stale)
                    return None
                metadata = load_weights(self.model, path, include_optimizer=True)
                if keras_metadata is not None:
                    metadata = self._keras_metadata(keras_metadata)
            except CheckpointError as error:
                logging.warning(
                    "%s Trying the previous training backup instead.", error
                )
                failed.append(path)
                continue
            for bad in failed:
                # Keep it for inspection, out of the rotation of backups.
                os.replace(bad, bad + ".corrupt")
                logging.warning("Renamed the unusable backup %s to %s.", bad, bad + ".corrupt")
            metadata = dict(metadata, path=path)
            metadata.setdefault("global_step", int(
                keras.ops.convert_to_numpy(self.model.optimizer.iterations)))
            return metadata
        if failed:
            raise CheckpointError(
                "Cannot resume training: every training backup is truncated or corrupted ("
                + ", ".join(failed)
                + "). Nothing was changed. Move these files away to restart training from the "
                "first epoch (the checkpoints in the work directory are kept), or use "
                "another work directory.",
                failed[0],
            )
        return None

    def _keras_metadata(self, path):
        """Epoch of a Keras `BackupAndRestore` backup (it restarts epochs from step 0)."""
        epoch = 0
        if os.path.exists(path):
            with open(path) as file:
                epoch = int(json.load(file).get("epoch", 0))
        return {"epoch": epoch, "step_in_epoch": 0}

    def _trim_csv_log(self, first_redone_epoch):
        """Drops the CSV rows of the epochs that will be trained again, in place.

        In place (truncation, not a new file), because `CSVLogger` may already
        hold the file open for appending.
        """
        if not self.csv_log or not os.path.exists(self.csv_log):
            return
        with open(self.csv_log, "rb+") as file:
            lines = file.readlines()
            offset = len(lines[0]) if lines else 0
            for line in lines[1:]:
                first = line.split(b",", 1)[0].strip()
                if first.isdigit() and int(first) >= first_redone_epoch:
                    file.truncate(offset)
                    logging.info(
                        "Removed the rows of epochs >= %d from %s: they are trained again.",
                        first_redone_epoch + 1, self.csv_log,
                    )
                    return
                offset += len(line)

    def discard_since(self, global_step):
        """Sets the last backup aside if it was saved at `global_step` or later.

        Used when training diverges: the weights of such a backup gave a NaN
        or infinite loss. The backup is renamed to
        `training_state.diverged.weights.h5` (kept for inspection) and the
        previous one becomes the last backup again.

        Returns:
            Whether a backup was set aside.
        """
        saved = self.last_saved
        if saved is None or saved["global_step"] < global_step:
            return False
        if not os.path.exists(self.state_path):
            return False
        diverged = os.path.join(self.backup_dir, "training_state.diverged.weights.h5")
        os.replace(self.state_path, diverged)
        self.last_saved = None
        if os.path.exists(self.previous_path):
            os.replace(self.previous_path, self.state_path)
            with contextlib.suppress(CheckpointError):
                self.last_saved = dict(read_checkpoint_metadata(self.state_path),
                                       path=self.state_path)
        _fsync_directory(self.backup_dir)
        logging.warning(
            "Set the training backup of global step %d aside as %s: the loss diverged "
            "from its weights.", saved["global_step"], diverged,
        )
        return True

    # --- Training --------------------------------------------------------

    def step_in_epoch(self, epoch, batch):
        """The step inside `epoch` (from 1) of `fit`'s `batch` index."""
        offset = self._resume_step if epoch == self._resume_epoch else 0
        return offset + batch + 1

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._offset = self._resume_step if epoch == self._resume_epoch else 0
        self._step = self._offset
        self._stop_after = None
        if self._offset and self.steps_per_epoch:
            self._stop_after = self.steps_per_epoch - self._offset
        self._stopped_epoch = False

    def on_train_batch_end(self, batch, logs=None):
        self._step = self._offset + batch + 1
        if self._stop_after is not None and batch + 1 >= self._stop_after:
            # The steps done before the interruption complete this epoch.
            if not self.model.stop_training:
                self._stopped_epoch = True
                self.model.stop_training = True
            return
        if self.steps_per_epoch and self._step >= self.steps_per_epoch:
            return  # the epoch-end backup follows
        if self.save_every_steps:
            global_step = _iterations(self.model)
            if global_step % self.save_every_steps == 0:
                self._save(self._epoch, self._step, batch)

    def on_epoch_end(self, epoch, logs=None):
        if self._stopped_epoch:
            self.model.stop_training = False  # only this epoch was cut short
        if self.steps_per_epoch is None and self._offset == 0:
            self.steps_per_epoch = self._step
        self._save(epoch + 1, 0, None)

    def _save(self, epoch, step_in_epoch, batch):
        if not _all_finite(self.model.trainable_variables):
            raise diverged_error(
                self.model, self._epoch, batch, "weights", float("nan"), backup=self,
            )
        global_step = _iterations(self.model)
        metadata = {
            "epoch": epoch,
            "step_in_epoch": step_in_epoch,
            "global_step": global_step,
            "steps_per_epoch": self.steps_per_epoch,
        }
        save_weights_atomically(
            self.model, self.state_path, include_optimizer=True, metadata=metadata,
            previous=self.previous_path,
        )
        self.last_saved = dict(metadata, path=self.state_path)
