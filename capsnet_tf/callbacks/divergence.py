"""Stopping a run whose loss or weights become NaN or infinite, naming where."""

import math

import keras
import numpy as np

__all__ = ["DivergenceGuard", "TrainingDivergedError", "diverged_error"]


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
