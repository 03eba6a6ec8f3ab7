"""Callbacks that make training safe to interrupt, stop it when it diverges, and time it.

`train_and_evaluate` uses all ten callbacks here (`training._make_callbacks`;
`TestSetEvaluation`, `TargetAccuracy` and `ReconstructionImages` only when
the run's options ask for them), besides Keras's `CSVLogger` and
`TensorBoard`. The three that keep a run's state and guard it:

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

The checkpoint files (`capsnet_tf.checkpoints`) are written atomically: into a
temporary file in the same directory, flushed to disk, then renamed over the
old one (`os.replace`), so a kill while saving leaves the previous file as it
was, never a half-written one under the real name. Each file carries, as HDF5
attributes, the epoch and step it was saved at, a fingerprint of the model's
weight shapes, and a SHA-256 checksum of the saved values; `load_weights`
checks them and raises `CheckpointError` naming the file when it is truncated,
corrupted or of another model. The backup keeps the state before the last one
as well, and falls back to it (with a warning naming the bad file) when the
last one does not load.

Files written by Keras (`model.save_weights`, `ModelCheckpoint`,
`BackupAndRestore`) load too, without the checks their attributes allow.

Modules: `saving` (`TrainingStateBackup`, `WeightsCheckpoint`), `divergence`
(`DivergenceGuard`), `interrupt` (`GracefulStop`: SIGTERM and Ctrl-C save
the state and end `fit` with `TrainingInterrupted`), `progress` (speed, wall
clock, test curve, time to a target accuracy), `images` (`ReconstructionImages` for TensorBoard),
`averaging` (`AveragedWeights`: evaluate and save the optimizer's moving average of the
weights).
"""

from capsnet_tf.callbacks.averaging import AveragedWeights, uses_weight_averaging
from capsnet_tf.callbacks.divergence import DivergenceGuard, TrainingDivergedError, diverged_error
from capsnet_tf.callbacks.images import ReconstructionImages
from capsnet_tf.callbacks.interrupt import GracefulStop, TrainingInterrupted
from capsnet_tf.callbacks.progress import EpochTimer, TargetAccuracy, TestSetEvaluation, WallClock
from capsnet_tf.callbacks.saving import TrainingStateBackup, WeightsCheckpoint
from capsnet_tf.checkpoints import (
    CheckpointError,
    CheckpointWriteError,
    load_weights,
    read_checkpoint_metadata,
    remove_stale_temporaries,
    save_weights_atomically,
    weights_fingerprint,
)

__all__ = [
    "AveragedWeights",
    "CheckpointError",
    "CheckpointWriteError",
    "DivergenceGuard",
    "EpochTimer",
    "GracefulStop",
    "ReconstructionImages",
    "TargetAccuracy",
    "TestSetEvaluation",
    "TrainingDivergedError",
    "TrainingInterrupted",
    "TrainingStateBackup",
    "WallClock",
    "WeightsCheckpoint",
    "diverged_error",
    "load_weights",
    "read_checkpoint_metadata",
    "remove_stale_temporaries",
    "save_weights_atomically",
    "uses_weight_averaging",
    "weights_fingerprint",
]
