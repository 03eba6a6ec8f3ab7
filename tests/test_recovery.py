"""Interruption safety: backups, resuming, atomic checkpoints, divergence.

The unit tests train a tiny dense model in-process; the end-to-end test kills
experiments/mnist.py with SIGKILL in the middle of an epoch and runs the same
command again.
"""

import csv
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import time

import h5py
import keras
import numpy as np
import pytest

from capsnet_tf.callbacks import (
    CheckpointError,
    DivergenceGuard,
    TrainingDivergedError,
    TrainingStateBackup,
    WeightsCheckpoint,
    load_weights,
    read_checkpoint_metadata,
    save_weights_atomically,
)
from tests.conftest import REPO_ROOT

SCRIPT = os.path.join(REPO_ROOT, "experiments", "mnist.py")
STEPS = 4  # steps per epoch of the tiny model: 32 examples, batch 8


def tiny_model(seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(5, activation="relu"), keras.layers.Dense(2)]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(
            keras.optimizers.schedules.ExponentialDecay(0.01, decay_steps=3, decay_rate=0.5)
        ),
        loss="mse",
    )
    return model


def tiny_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * 8, 6)).astype("float32")
    y = rng.normal(size=(STEPS * 8, 2)).astype("float32")
    return x, y


def iterations(model):
    return int(keras.ops.convert_to_numpy(model.optimizer.iterations))


class Interrupt(Exception):
    pass


class StopAt(keras.callbacks.Callback):
    """Raises `Interrupt` after the optimizer step `step` (like a kill)."""

    def __init__(self, step):
        super().__init__()
        self.step = step

    def on_train_batch_end(self, batch, logs=None):
        if iterations(self.model) == self.step:
            raise Interrupt()


class Record(keras.callbacks.Callback):
    """Records the weights at train begin and the epochs / batches run."""

    def on_train_begin(self, logs=None):
        self.start_weights = [np.array(w) for w in self.model.get_weights()]
        self.epochs, self.batches = [], 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs.append(epoch)

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1


def fit(model, callbacks, epochs=3, data=None):
    x, y = data or tiny_data()
    return model.fit(x, y, batch_size=8, epochs=epochs, shuffle=False, verbose=0,
                     callbacks=callbacks)


def file_hash(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_resume_mid_epoch_restores_state_and_runs_the_uninterrupted_step_count(tmp_path):
    backup_dir = str(tmp_path / "backup")
    csv_log = str(tmp_path / "log.csv")
    model = tiny_model()
    backup = TrainingStateBackup(backup_dir, save_every_steps=3, csv_log=csv_log)
    with pytest.raises(Interrupt):
        # Backups at steps 3 and 4 (end of epoch 1), then 6; interrupted at 7.
        fit(model, [keras.callbacks.CSVLogger(csv_log, append=True), StopAt(7), backup])
    saved = read_checkpoint_metadata(backup.state_path)
    assert (saved["epoch"], saved["step_in_epoch"], saved["global_step"]) == (1, 2, 6)
    previous = read_checkpoint_metadata(backup.previous_path)
    assert (previous["epoch"], previous["step_in_epoch"], previous["global_step"]) == (1, 0, 4)
    reference = tiny_model(seed=5)
    load_weights(reference, backup.state_path, include_optimizer=True)
    assert iterations(reference) == 6

    resumed = tiny_model(seed=1)  # other initial weights: they must be replaced
    record = Record()
    backup = TrainingStateBackup(backup_dir, save_every_steps=3, csv_log=csv_log)
    history = fit(resumed, [keras.callbacks.CSVLogger(csv_log, append=True), record, backup])
    # Restored in on_train_begin, which runs after Record's: check through the backup.
    assert backup.restored["global_step"] == 6 and backup.restored["path"] == backup.state_path
    assert record.epochs == [1, 2]
    # Epoch 2 is cut to the 2 steps not done before the interruption: 12 steps in all,
    # as an uninterrupted 3-epoch run, and the learning-rate schedule is where it would be.
    assert record.batches == 2 + STEPS
    assert iterations(resumed) == 3 * STEPS
    assert float(resumed.optimizer.learning_rate) == pytest.approx(0.01 * 0.5 ** (12 / 3))
    assert len(history.history["loss"]) == 2
    with open(csv_log) as file:
        assert [row["epoch"] for row in csv.DictReader(file)] == ["0", "1", "2"]
    final = read_checkpoint_metadata(backup.state_path)
    assert (final["epoch"], final["step_in_epoch"], final["global_step"]) == (3, 0, 12)

    assert read_checkpoint_metadata(backup.previous_path)["global_step"] == 9

    # A finished run stays finished.
    record = Record()
    fit(tiny_model(seed=3), [record, TrainingStateBackup(backup_dir, csv_log=csv_log)])
    assert record.epochs == [] and record.batches == 0


def test_epochs_logged_but_not_backed_up_are_trained_and_logged_once(tmp_path):
    """Killed after the CSV row of epoch 2 was written, before its backup: no duplicate row."""

    class KillAtEpochEnd(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                raise Interrupt()

    csv_log = str(tmp_path / "log.csv")
    with pytest.raises(Interrupt):
        fit(tiny_model(), [keras.callbacks.CSVLogger(csv_log, append=True), KillAtEpochEnd(),
                           TrainingStateBackup(str(tmp_path), save_every_steps=3, csv_log=csv_log)])
    with open(csv_log) as file:
        assert [row["epoch"] for row in csv.DictReader(file)] == ["0", "1"]
    backup = TrainingStateBackup(str(tmp_path), save_every_steps=3, csv_log=csv_log)
    record = Record()
    fit(tiny_model(), [keras.callbacks.CSVLogger(csv_log, append=True), record, backup])
    assert backup.restored["global_step"] == 6 and record.epochs == [1, 2]
    with open(csv_log) as file:
        assert [row["epoch"] for row in csv.DictReader(file)] == ["0", "1", "2"]
    assert iterations(backup.model) == 3 * STEPS


def test_restore_gives_the_exact_saved_weights(tmp_path):
    model = tiny_model()
    backup = TrainingStateBackup(str(tmp_path), save_every_steps=2)
    with pytest.raises(Interrupt):
        fit(model, [backup, StopAt(2)])  # backup after step 2, then interrupted
    saved_weights = model.get_weights()
    saved_moments = [np.array(v) for v in model.optimizer.variables]

    class Capture(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.weights = self.model.get_weights()
            self.moments = [np.array(v) for v in self.model.optimizer.variables]

    capture = Capture()
    with pytest.raises(Interrupt):
        fit(tiny_model(seed=9), [TrainingStateBackup(str(tmp_path)), capture, StopAt(3)])
    for actual, expected in zip(capture.weights, saved_weights):
        np.testing.assert_array_equal(actual, expected)
    for actual, expected in zip(capture.moments, saved_moments):
        np.testing.assert_array_equal(actual, expected)


def test_corrupted_latest_backup_is_reported_and_the_previous_one_used(tmp_path, caplog):
    backup_dir = str(tmp_path)
    with pytest.raises(Interrupt):
        fit(tiny_model(), [StopAt(7), TrainingStateBackup(backup_dir, save_every_steps=3)])
    state = os.path.join(backup_dir, TrainingStateBackup.STATE_FILE)
    previous = os.path.join(backup_dir, TrainingStateBackup.PREVIOUS_FILE)
    size = os.path.getsize(state)
    with open(state, "r+b") as file:
        file.truncate(size // 2)
    previous_hash = file_hash(previous)

    backup = TrainingStateBackup(backup_dir, save_every_steps=3)
    record = Record()
    with caplog.at_level(logging.WARNING):
        fit(tiny_model(seed=1), [record, backup])
    warnings = " ".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    assert state in warnings and "truncated or corrupted" in warnings
    assert "previous training backup" in warnings
    # Resumed from the previous backup (end of epoch 1, step 4); the broken file is kept aside.
    assert backup.restored["global_step"] == 4 and backup.restored["path"] == previous
    assert record.epochs == [1, 2] and int(backup.model.optimizer.iterations) == 3 * STEPS
    assert os.path.exists(state + ".corrupt")
    assert read_checkpoint_metadata(state)["global_step"] == 12
    # The good previous backup was rotated normally, never replaced by the broken one.
    assert file_hash(previous) != previous_hash
    assert read_checkpoint_metadata(previous)["global_step"] == 9


def test_all_backups_corrupted_is_an_error_that_changes_nothing(tmp_path):
    with pytest.raises(Interrupt):
        fit(tiny_model(), [StopAt(7), TrainingStateBackup(str(tmp_path), save_every_steps=3)])
    for name in (TrainingStateBackup.STATE_FILE, TrainingStateBackup.PREVIOUS_FILE):
        with open(tmp_path / name, "r+b") as file:
            file.seek(0)
            file.write(b"garbage!" * 8)
    before = {name: file_hash(tmp_path / name) for name in os.listdir(tmp_path)}
    with pytest.raises(CheckpointError, match="every training backup is truncated or corrupted"
                       ) as error:
        fit(tiny_model(), [TrainingStateBackup(str(tmp_path))])
    assert TrainingStateBackup.PREVIOUS_FILE in str(error.value)
    assert {name: file_hash(tmp_path / name) for name in os.listdir(tmp_path)} == before


def test_state_of_another_model_is_discarded_after_overwrite(tmp_path, caplog):
    """--overwrite with another model: its backup and best score do not carry over."""
    best = str(tmp_path / "best.weights.h5")
    x, y = tiny_data()
    tiny_model().fit(x, y, batch_size=8, epochs=1, verbose=0, validation_data=(x, y), callbacks=[
        WeightsCheckpoint(best, monitor="val_loss", mode="min"),
        TrainingStateBackup(str(tmp_path / "backup"))])

    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(7), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    record = Record()
    backup = TrainingStateBackup(str(tmp_path / "backup"))
    # The old run's best val_loss (~1) is unbeatable here: it must not count.
    checkpoint = WeightsCheckpoint(best, monitor="val_loss", mode="min",
                                   initial_value_threshold=-1.0)
    with caplog.at_level(logging.WARNING):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, validation_data=(x, y),
                  callbacks=[record, checkpoint, backup])
    assert "is of a different model" in caplog.text
    assert backup.restored is None and record.epochs == [0]
    assert read_checkpoint_metadata(backup.state_path)["global_step"] == STEPS
    load_weights(model, best)  # replaced by the new model's weights


def test_checkpoint_writes_are_atomic(tmp_path, monkeypatch):
    model = tiny_model()
    fit(model, [], epochs=1)
    path = str(tmp_path / "latest.weights.h5")
    save_weights_atomically(model, path, metadata={"epoch": 1})
    before = file_hash(path)
    real_save = keras.saving.save_weights

    def killed_while_saving(model, filepath, **kwargs):
        real_save(model, filepath, **kwargs)
        with open(filepath, "r+b") as file:  # half written ...
            file.truncate(os.path.getsize(filepath) // 2)
        raise KeyboardInterrupt  # ... when the process dies

    monkeypatch.setattr(keras.saving, "save_weights", killed_while_saving)
    with pytest.raises(KeyboardInterrupt):
        save_weights_atomically(model, path, metadata={"epoch": 2})
    monkeypatch.undo()
    assert file_hash(path) == before and os.listdir(tmp_path) == ["latest.weights.h5"]
    assert load_weights(tiny_model(seed=4), path)["epoch"] == 1

    # A temporary file left by a real kill is removed by the next run's checkpoint callback.
    stale = tmp_path / ".latest.abc123.tmp.weights.h5"
    stale.write_bytes(b"partial")
    fit(model, [WeightsCheckpoint(path)], epochs=1)
    assert sorted(os.listdir(tmp_path)) == ["latest.weights.h5"]


def test_weights_checkpoints_hold_weights_only_and_report_damage(tmp_path):
    model = tiny_model()
    best = str(tmp_path / "best.weights.h5")
    latest = str(tmp_path / "latest.weights.h5")
    x, y = tiny_data()
    model.fit(x, y, batch_size=8, epochs=3, verbose=0, validation_data=(x, y), callbacks=[
        WeightsCheckpoint(latest), WeightsCheckpoint(best, monitor="val_loss", mode="min")])
    full = str(tmp_path / "full.weights.h5")
    model.save_weights(full)  # Keras: weights and Adam's two moments
    assert datasets(full) > datasets(latest) == datasets(full, under="layers")
    assert datasets(latest, under="optimizer") == 0
    assert read_checkpoint_metadata(latest)["epoch"] == 3
    assert read_checkpoint_metadata(best)["val_loss"] <= read_checkpoint_metadata(latest).get(
        "val_loss", np.inf)
    # Loads with plain Keras into an uncompiled model and with load_weights into a compiled one.
    plain = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(5, activation="relu"), keras.layers.Dense(2)]
    )
    plain.load_weights(latest)
    for actual, expected in zip(plain.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(actual, expected)
    load_weights(tiny_model(seed=3), latest)

    truncated = str(tmp_path / "truncated.weights.h5")
    with open(latest, "rb") as source, open(truncated, "wb") as target:
        target.write(source.read()[: os.path.getsize(latest) // 2])
    with pytest.raises(CheckpointError, match=r"truncated\.weights\.h5 is truncated or corrupted"):
        load_weights(tiny_model(), truncated)

    # A flipped value inside the data passes HDF5 but not the checksum.
    corrupted = str(tmp_path / "corrupted.weights.h5")
    with open(latest, "rb") as source:
        data = bytearray(source.read())
    kernel = np.asarray(model.get_weights()[0], dtype="float32").tobytes()
    where = bytes(data).find(kernel[:16])
    assert where > 0
    data[where + 3] ^= 0xFF
    with open(corrupted, "wb") as target:
        target.write(bytes(data))
    with pytest.raises(CheckpointError, match=r"corrupted\.weights\.h5 is corrupted.*checksum"):
        load_weights(tiny_model(), corrupted)

    other = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3), keras.layers.Dense(2)])
    with pytest.raises(CheckpointError, match="different model"):
        load_weights(other, latest)


def test_nan_loss_stops_with_the_step_and_keeps_the_last_good_state(tmp_path):
    backup_dir = str(tmp_path / "backup")
    latest = str(tmp_path / "latest.weights.h5")
    model = tiny_model()
    backup = TrainingStateBackup(backup_dir, save_every_steps=2)

    class PoisonBefore(keras.callbacks.Callback):
        """Makes a weight NaN before global step 7 (the 3rd of epoch 2) runs."""

        def on_train_batch_begin(self, batch, logs=None):
            if iterations(self.model) == 6:
                bias = self.model.layers[-1].bias
                bias.assign(np.full(bias.shape, np.nan, "float32"))

    callbacks = [PoisonBefore(), DivergenceGuard(backup=backup), WeightsCheckpoint(latest),
                 backup]
    with pytest.raises(TrainingDivergedError) as error:
        fit(model, callbacks)
    error = error.value
    assert (error.epoch, error.step, error.global_step, error.quantity) == (2, 3, 7, "loss")
    message = str(error)
    assert "loss is nan at epoch 2, step 3 of 4 (global step 7)" in message
    # The backup of step 6 gave the NaN loss: it is set aside, and the one before it,
    # of the end of epoch 1, is the last backup again.
    assert "global step 4 (the end of epoch 1)" in message and backup.state_path in message
    saved = read_checkpoint_metadata(backup.state_path)
    assert saved["global_step"] == 4
    diverged = os.path.join(backup_dir, "training_state.diverged.weights.h5")
    assert read_checkpoint_metadata(diverged)["global_step"] == 6
    check = tiny_model(seed=3)
    load_weights(check, backup.state_path, include_optimizer=True)
    assert all(np.all(np.isfinite(w)) for w in check.get_weights())
    assert read_checkpoint_metadata(latest)["epoch"] == 1


def datasets(path, under=""):
    """Number of arrays in an HDF5 file (under a group)."""
    names = []
    with h5py.File(path, "r") as file:
        file.visititems(
            lambda name, item: names.append(name) if isinstance(item, h5py.Dataset) else None
        )
    return len([name for name in names if name.startswith(under)])


def read_state(path):
    with h5py.File(path, "r") as file:
        return json.loads(file.attrs["capsnet_tf_checkpoint"])


@pytest.mark.large
def test_sigkill_mid_epoch_then_same_command_finishes_the_run(tfds_data_dir, tmp_path):
    """experiments/mnist.py killed in epoch 1, run again: 2 epochs, 2 x 8 optimizer steps."""
    workdir = tmp_path / "run"
    command = [
        sys.executable, SCRIPT, f"--workdir={workdir}", "--train_examples=64",
        "--batch_size=8", "--eval_examples=16", "--epochs=2", "--backup_every_steps=3",
        "--primary_capsule_types=2", "--verbose=2",
    ]
    state = workdir / "backup" / TrainingStateBackup.STATE_FILE
    process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and process.poll() is None:
            if state.exists():
                try:
                    saved = read_state(state)
                except (OSError, KeyError):  # being renamed into place
                    saved = None
                if saved and saved["step_in_epoch"] > 0:
                    break
            time.sleep(0.05)
        assert process.poll() is None, "the run ended before a mid-epoch backup:\n" + (
            process.stdout.read()[-3000:])
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    killed_at = read_state(state)
    assert killed_at["step_in_epoch"] > 0 and killed_at["global_step"] < 2 * 8
    assert not (workdir / "results.json").exists()

    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Resumed training from" in result.stderr
    assert f"global step {killed_at['global_step']}" in result.stderr
    final = read_state(state)
    # As many optimizer steps as an uninterrupted run: 2 epochs x 64 / 8.
    assert (final["epoch"], final["step_in_epoch"], final["global_step"]) == (2, 0, 16)
    with h5py.File(state, "r") as file:
        iterations = [np.asarray(file[name]).item() for name in _find(file, "iteration")]
    assert iterations == [16]
    with open(workdir / "training_log.csv") as file:
        assert [row["epoch"] for row in csv.DictReader(file)] == ["0", "1"]
    results = json.loads((workdir / "results.json").read_text())
    assert results["epochs_run_this_call"] == 2 - killed_at["epoch"]
    assert np.isfinite(results["test_loss"])
    assert sorted(os.listdir(workdir / "checkpoints")) == ["best.weights.h5", "latest.weights.h5"]


def _find(file, word):
    """Datasets of an HDF5 file whose variable is the optimizer's iteration counter."""
    names = []

    def visit(name, item):
        if isinstance(item, h5py.Dataset) and name.startswith("optimizer") and item.shape == ():
            names.append(name)

    file.visititems(visit)
    return names
