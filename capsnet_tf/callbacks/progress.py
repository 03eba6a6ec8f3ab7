"""Callbacks that measure a run's progress: speed, wall clock, test accuracy, time to a target.

- `EpochTimer`: training images per second of each epoch (evaluation excluded).
- `WallClock`: seconds since the command started, carried across resumed runs,
  so that a log row says when on the run's clock that epoch ended.
- `TestSetEvaluation`: the test set's metrics as `test_*` epoch logs, for runs
  whose `validation_data` is a held-out validation split (model selection on
  validation, the test curve reported beside it).
- `TargetAccuracy`: stops training at the first evaluation at or above a
  target accuracy and records when (DAWNBench-style time to accuracy: from the
  command's start, start-up, data loading, compilation and evaluations
  included).

They write into the epoch `logs` dict, so they must come before
`keras.callbacks.CSVLogger` in the callback list for their values to be logged.
"""

import json
import os
import time

import keras

from capsnet_tf.workdir import last_logged

__all__ = ["EpochTimer", "TargetAccuracy", "TestSetEvaluation", "WallClock"]


class EpochTimer(keras.callbacks.Callback):
    """Adds `train_seconds` and `train_images_per_second` to the epoch logs.

    Training time only: the evaluation at the end of the epoch is not
    counted. The first epoch includes tracing and compilation.

    Args:
        batch_size: examples per training batch.
        examples_per_epoch: training examples in one pass (caps the count of
            the last, possibly smaller batch).
    """

    def __init__(self, batch_size, examples_per_epoch):
        super().__init__()
        self.batch_size = batch_size
        self.examples_per_epoch = examples_per_epoch

    def on_epoch_begin(self, epoch, logs=None):
        self._start = self._end = time.perf_counter()
        self._batches = 0

    def on_train_batch_end(self, batch, logs=None):
        self._batches = batch + 1
        self._end = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or self._batches == 0:
            return
        seconds = self._end - self._start
        images = min(self._batches * self.batch_size, self.examples_per_epoch)
        logs["train_seconds"] = seconds
        logs["train_images_per_second"] = images / seconds


class WallClock(keras.callbacks.Callback):
    """Adds `wall_seconds`: the run's wall clock at the end of each epoch.

    The clock starts at `start_time` (the command's start, `time.time()`)
    and, in a resumed run, continues from the last `wall_seconds` of the CSV
    log, so the time between the kill and the restart is not counted but
    every second the run spent is.

    Args:
        start_time: `time.time()` when the command started.
        csv_log: the run's CSV log (None: a run without one starts at 0).
    """

    def __init__(self, start_time, csv_log=None):
        super().__init__()
        self.start_time = start_time
        self.csv_log = csv_log
        self.offset = 0.0

    def on_train_begin(self, logs=None):
        self.offset = (last_logged(self.csv_log, "wall_seconds") or 0.0) if self.csv_log else 0.0

    def elapsed(self):
        """Seconds on the run's clock now."""
        return self.offset + time.time() - self.start_time

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["wall_seconds"] = self.elapsed()


class TestSetEvaluation(keras.callbacks.Callback):
    """Evaluates the test set after each epoch and logs its metrics as `test_<name>`.

    For runs that validate (and choose checkpoints) on a held-out split: the
    test curve is still recorded every epoch, but nothing selects on it.

    Args:
        test_data: the test `tf.data.Dataset`.
        every_epochs: evaluate after every this many epochs (and not before
            `first_epoch`); other epochs log nothing.
        first_epoch: the first (1-based) epoch evaluated.
        prefix: the prefix of the logged names (e.g. `"val_trained_"` for the
            validation split evaluated with the trained rather than the
            averaged weights, `AveragedWeights`).
    """

    def __init__(self, test_data, every_epochs=1, first_epoch=1, prefix="test_"):
        super().__init__()
        self.test_data = test_data
        self.every_epochs = every_epochs
        self.first_epoch = first_epoch
        self.prefix = prefix

    def on_epoch_end(self, epoch, logs=None):
        done = epoch + 1
        if done < self.first_epoch or (done - self.first_epoch) % self.every_epochs:
            return
        metrics = self.model.evaluate(self.test_data, return_dict=True, verbose=0)
        if logs is not None:
            logs.update({self.prefix + name: float(value) for name, value in metrics.items()})


class TargetAccuracy(keras.callbacks.Callback):
    """Stops training once `monitor` reaches `target`, and records when.

    The record (`seconds` on the `WallClock`, the 1-based `epoch`, the
    optimizer's `global_step`, the `accuracy` reached) goes to `record_path`
    as JSON at once, so a later resumed call still reports it.

    Args:
        monitor: the epoch-log key of the held-out accuracy to watch
            (`"val_length_accuracy"`: the test set, or the validation split
            where there is one).
        target: accuracy in (0, 1].
        clock: the run's `WallClock`.
        record_path: where to write the record.
    """

    def __init__(self, monitor, target, clock, record_path):
        super().__init__()
        if not 0 < target <= 1:
            raise ValueError(f"`target` must be in (0, 1]. Received: target={target}")
        self.monitor = monitor
        self.target = target
        self.clock = clock
        self.record_path = record_path

    def on_epoch_end(self, epoch, logs=None):
        value = (logs or {}).get(self.monitor)
        if value is None or value < self.target or os.path.exists(self.record_path):
            return
        record = {
            "target_accuracy": self.target,
            "accuracy": float(value),
            "seconds": self.clock.elapsed(),
            "epoch": epoch + 1,
            "global_step": int(self.model.optimizer.iterations.numpy()),
            "monitor": self.monitor,
        }
        with open(self.record_path, "w") as file:
            json.dump(record, file, indent=2, sort_keys=True)
        print(
            f"Reached {100 * self.target:.2f}% ({self.monitor} {100 * value:.2f}%) after "
            f"{record['seconds']:.0f} s, epoch {record['epoch']}, step {record['global_step']}: "
            "stopping."
        )
        self.model.stop_training = True
