"""Saving callbacks: model weights every epoch or on improvement, and the whole
training state for a resume after any interruption."""

import contextlib
import json
import math
import os

import keras
import numpy as np
from absl import logging

from capsnet_tf.callbacks.divergence import _iterations, diverged_error
from capsnet_tf.checkpoints import (
    CheckpointError,
    _all_finite,
    _fsync_directory,
    load_weights,
    read_checkpoint_metadata,
    remove_stale_temporaries,
    save_weights_atomically,
    weights_fingerprint,
)

__all__ = ["TrainingStateBackup", "WeightsCheckpoint"]


def _of_model(metadata, model):
    """Whether a backup's metadata belong to `model` (same weight names and shapes).

    Backups written before fingerprints existed carry none and are taken.
    """
    fingerprint = metadata.get("fingerprint")
    return fingerprint is None or fingerprint == weights_fingerprint(model)


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
        # The global step the training data were positioned after (set by
        # the caller from `resume_point`); checked against what is restored.
        self.data_position = None
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
        restored_step = int(state["global_step"]) if state is not None else 0
        if self.data_position is not None and restored_step != self.data_position:
            logging.warning(
                "The training data were positioned after global step %d, but the backup "
                "restored is of global step %d: from here on the batches differ from those "
                "of an uninterrupted run.", self.data_position, restored_step,
            )
        self._trim_csv_log(epoch)

    def resume_point(self, model):
        """The global step the next `fit` will resume after, read before `fit` starts.

        The metadata of the backup that `on_train_begin` will restore (the
        last one, else the one before it), without loading its weights: the
        training data can then be positioned (`resumable_training_data`) at
        the batch the interrupted run would have read next. 0 when there is
        no usable backup of this model.
        """
        for path, keras_metadata in self._candidates():
            if keras_metadata is not None:
                return 0  # Keras' own backups restart their epoch from step 0
            try:
                metadata = read_checkpoint_metadata(path)
            except CheckpointError:
                continue
            if not _of_model(metadata, model):
                return 0
            return int(metadata.get("global_step", 0))
        return 0

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
                if not _of_model(metadata, self.model):
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

    def _completes_resumed_epoch(self, batch):
        """Whether `batch` completes an epoch resumed in its middle."""
        return self._stop_after is not None and batch + 1 >= self._stop_after

    def on_train_batch_end(self, batch, logs=None):
        self._step = self._offset + batch + 1
        if self._completes_resumed_epoch(batch):
            # The steps done before the interruption complete this epoch.
            if not self.model.stop_training:
                self._stopped_epoch = True
                self.model.stop_training = True
            return
        if self.epoch_end_follows(batch):
            return  # the epoch-end backup follows
        if self.save_every_steps:
            global_step = _iterations(self.model)
            if global_step % self.save_every_steps == 0:
                self._save(self._epoch, self._step, batch)

    def epoch_end_follows(self, batch):
        """Whether `fit`'s `batch` (just finished) is the last training step of its epoch."""
        if self._completes_resumed_epoch(batch):
            return True
        return bool(self.steps_per_epoch) and self._offset + batch + 1 >= self.steps_per_epoch

    def save_now(self, batch):
        """Backs up the state after `fit`'s `batch` of the current epoch; returns its metadata.

        For a stop between two steps (`GracefulStop`): the resumed run
        continues with the next step of this epoch.
        """
        self._save(self._epoch, self.step_in_epoch(self._epoch, batch), batch)
        return self.last_saved

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
