"""Checkpoint files written atomically and read with checks: weights, optimizer, metadata.

Every file is written into a temporary file in the same directory, flushed to
disk, then renamed over the old one (`os.replace`), so a kill while saving
leaves the previous file as it was, never a half-written one under the real
name. Each file carries, as HDF5 attributes, the epoch and step it was saved
at, a fingerprint of the model's weight shapes, and a SHA-256 checksum of the
saved values; `load_weights` checks them and raises `CheckpointError` naming
the file when it is truncated, corrupted or of another model.

Files written by Keras (`model.save_weights`, `ModelCheckpoint`,
`BackupAndRestore`) load too, without the checks their attributes allow.
"""

import contextlib
import glob
import hashlib
import json
import os
import tempfile

import keras
import numpy as np

__all__ = [
    "CheckpointError",
    "CheckpointWriteError",
    "load_weights",
    "read_checkpoint_metadata",
    "remove_stale_temporaries",
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


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, file-size limit, I/O error).

    The file it would have replaced is intact. Attributes: `path`, the file;
    `cause`, the underlying error.
    """

    def __init__(self, message, path, cause):
        super().__init__(getattr(cause, "errno", None), message)
        self.message = message
        self.path = path
        self.cause = cause

    def __str__(self):
        return self.message


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
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        if isinstance(error, (OSError, RuntimeError)):  # h5py reports failed writes as either
            raise CheckpointWriteError(
                f"Could not write {filepath}: {_describe(error)}. "
                + ("The previous file is intact. " if os.path.exists(filepath) else "")
                + "Free some space there (or raise the file-size limit) and run the same "
                "command again to continue.",
                filepath,
                error,
            ) from error
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
