"""Time to accuracy: the validation split, the stop at a target, the cosine schedule, the clock."""

import csv
import dataclasses
import hashlib
import json
import os

import numpy as np
import pytest

from capsnet_tf.config import ExperimentConfig

TINY = dict(
    steps_per_epoch=2, batch_size=8, eval_examples=16, train_examples=64, primary_capsule_types=2,
    verbose=0,
)


def digests(dataset):
    """SHA-1 of every image of a batched pipeline, in order."""
    found = []
    for inputs, _ in dataset:
        images = np.asarray(inputs["image"])
        found += [hashlib.sha1(image.tobytes()).hexdigest() for image in images]
    return found


@pytest.mark.large
def test_validation_split_is_the_last_training_images_unaugmented_and_disjoint(tfds_data_dir):
    from capsnet_tf.data import load_tfds_split
    from capsnet_tf.training import _load_split

    held_out = 500
    config = ExperimentConfig(validation_examples=held_out, batch_size=500, shift=2)
    validation, spec = _load_split(config, "validation")
    raw, _ = load_tfds_split("mnist", "train")
    raw_images = np.stack([image for image, _ in raw.as_numpy_iterator()])
    expected = raw_images[-held_out:].astype(np.float32) / 255.0
    got = np.concatenate([np.asarray(inputs["image"]) for inputs, _ in validation])
    # Exactly the last 500 training images, in order: neither shuffled nor shifted.
    np.testing.assert_array_equal(got, expected)
    assert spec.num_examples == held_out

    # The training split (shifts off, to compare pixels) is exactly the other
    # 59,500 images, each once, shuffled: as index sets, the two are disjoint.
    unshifted = ExperimentConfig(validation_examples=held_out, batch_size=500, shift=0)
    train, train_spec = _load_split(unshifted, "train")
    assert train_spec.num_examples == len(raw_images) - held_out
    raw_train = [
        hashlib.sha1((image.astype(np.float32) / 255.0).tobytes()).hexdigest()
        for image in raw_images[:-held_out]
    ]
    assert sorted(digests(train)) == sorted(raw_train)


def test_validation_split_is_refused_for_data_sets_it_cannot_split():
    with pytest.raises(ValueError, match="validation_examples"):
        ExperimentConfig(dataset="cifar10", validation_examples=100).validate()


def read_log(workdir):
    with open(os.path.join(workdir, "training_log.csv"), newline="") as file:
        return list(csv.DictReader(file))


@pytest.mark.parametrize("validation_examples, chosen_on", [(None, "test"), (16, "validation")])
@pytest.mark.large
def test_target_accuracy_stops_at_the_first_epoch_that_reaches_it(
    tfds_data_dir, tmp_path, validation_examples, chosen_on
):
    from capsnet_tf.training import train_and_evaluate

    workdir = str(tmp_path / "run")
    # A tiny target: the run must stop at the first epoch whose watched
    # accuracy is above zero (16 held-out images, an untrained model may
    # score 0/16 on its first epoch), before the last of four.
    config = ExperimentConfig(
        epochs=4, target_accuracy=1e-6, validation_examples=validation_examples, **TINY
    )
    results = train_and_evaluate(config, workdir)
    rows = read_log(workdir)
    # The stop watches the data the checkpoint is chosen on (`val_*`: the
    # test set, or the validation split where there is one), never the test
    # set beside a validation split (`test_*`).
    watched = [float(row["val_length_accuracy"]) for row in rows]
    assert all(accuracy < 1e-6 for accuracy in watched[:-1]) and watched[-1] >= 1e-6
    epoch = len(rows)
    assert epoch < config.epochs
    hit = results["time_to_target"]
    with open(os.path.join(workdir, "time_to_target.json")) as file:
        assert json.load(file) == hit
    assert hit["epoch"] == epoch and hit["global_step"] == epoch * TINY["steps_per_epoch"]
    assert hit["monitor"] == "val_length_accuracy"
    assert hit["accuracy"] == pytest.approx(watched[-1])
    # The clock counts from the call, compilation and the evaluation included.
    assert 0 < hit["seconds"] <= float(rows[-1]["wall_seconds"]) + 1.0
    assert results["checkpoint_chosen_on"] == chosen_on
    final_test = rows[-1]["test_length_accuracy" if validation_examples else "val_length_accuracy"]
    assert results["final_epoch_test_accuracy"] == pytest.approx(float(final_test))


@pytest.mark.large
def test_unreached_target_trains_every_epoch_and_validation_selects(tfds_data_dir, tmp_path):
    from capsnet_tf.training import train_and_evaluate

    workdir = str(tmp_path / "run")
    config = ExperimentConfig(epochs=2, target_accuracy=1.0, validation_examples=16, **TINY)
    results = train_and_evaluate(config, workdir)
    rows = read_log(workdir)
    assert [int(row["epoch"]) for row in rows] == [0, 1]
    assert "time_to_target" not in results
    assert not os.path.exists(os.path.join(workdir, "time_to_target.json"))
    # Beside a validation split the test set is logged every epoch and selects nothing.
    assert all(row["test_length_accuracy"] for row in rows)
    assert results["checkpoint_chosen_on"] == "validation"
    assert results["final_epoch_test_accuracy"] == pytest.approx(
        float(rows[-1]["test_length_accuracy"])
    )
    assert results["validation_accuracy"] == pytest.approx(
        max(float(row["val_length_accuracy"]) for row in rows)
    )
    clock = [float(row["wall_seconds"]) for row in rows]
    assert clock[0] < clock[1]


def test_cosine_schedule_warms_up_then_anneals_to_the_minimum():
    from capsnet_tf.schedules import make_schedule

    config = ExperimentConfig(
        schedule="cosine", learning_rate=2e-3, warmup_epochs=0.5, epochs=3,
        minimum_learning_rate=1e-5,
    )
    schedule = make_schedule(config, steps_per_epoch=100)
    rates = np.array([float(schedule(step)) for step in range(0, 301)])
    np.testing.assert_allclose(rates[0], 2e-4, rtol=1e-6)  # a tenth of the peak
    np.testing.assert_allclose(rates[25], 2e-4 + (2e-3 - 2e-4) * 25 / 50, rtol=1e-5)
    np.testing.assert_allclose(rates[50], 2e-3, rtol=1e-6)
    # Cosine from the peak to the minimum over the remaining 250 steps.
    t = (np.arange(50, 301) - 50) / 250
    expected = 1e-5 + (2e-3 - 1e-5) * 0.5 * (1 + np.cos(np.pi * t))
    np.testing.assert_allclose(rates[50:], expected, rtol=1e-4)
    assert np.all(np.diff(rates[:51]) > 0) and np.all(np.diff(rates[50:]) < 0)


def test_wall_clock_continues_from_the_log_of_a_resumed_run(tmp_path):
    from capsnet_tf.callbacks import WallClock

    log = tmp_path / "training_log.csv"
    log.write_text("epoch,wall_seconds\n0,100.0\n1,250.5\n")
    import time

    clock = WallClock(time.time() - 10.0, str(log))
    clock.on_train_begin()
    assert 260.0 <= clock.elapsed() < 262.0
    fresh = WallClock(time.time(), str(tmp_path / "none.csv"))
    fresh.on_train_begin()
    assert fresh.elapsed() < 1.0


def test_error_against_time_figure_draws_each_run_and_names_a_bad_log(tmp_path):
    from matplotlib import image as mpimg

    from capsnet_tf.figures import FIGURE_SIZES, plot_error_against_time

    fast = {"wall_seconds": np.array([400.0, 800.0, 1200.0]),
            "val_length_accuracy": np.array([0.984, 0.992, 0.9952])}
    split = {"wall_seconds": np.array([500.0, 1000.0]),
             "test_length_accuracy": np.array([0.99, 0.996]),
             "val_length_accuracy": np.array([0.2, 0.3])}
    path = plot_error_against_time([("fast", fast), ("split", split)], str(tmp_path / "e.png"),
                                   dpi=50)
    picture = mpimg.imread(path)
    width, height = FIGURE_SIZES["error_against_time"]
    assert picture.shape[:2] == (round(height * 50), round(width * 50))
    assert picture[..., :3].std() > 0.05  # something was drawn
    with pytest.raises(ValueError, match="wall_seconds"):
        plot_error_against_time([("old", {"val_length_accuracy": np.array([0.9])})],
                                str(tmp_path / "bad.png"))


def test_error_curve_takes_hours_or_one_based_epochs():
    from capsnet_tf.figures.plots import error_curve

    log = {"epoch": np.array([0, 1, 2]), "wall_seconds": np.array([1800.0, 3600.0, 9000.0]),
           "val_length_accuracy": np.array([0.99, 0.995, 0.996])}
    hours, error = error_curve("run", log)
    np.testing.assert_allclose(hours, [0.5, 1.0, 2.5])
    np.testing.assert_allclose(error, [1.0, 0.5, 0.4], atol=1e-9)
    epochs, _ = error_curve("run", log, x_axis="epoch")
    np.testing.assert_array_equal(epochs, [1, 2, 3])
    with pytest.raises(ValueError, match="`epoch`"):
        error_curve("old", {"wall_seconds": log["wall_seconds"],
                            "val_length_accuracy": log["val_length_accuracy"]}, x_axis="epoch")
    with pytest.raises(ValueError, match="Received: 'steps'"):
        error_curve("run", log, x_axis="steps")


def test_test_accuracy_column_prefers_the_test_set_beside_a_validation_split():
    from capsnet_tf.figures.plots import test_accuracy_column

    assert test_accuracy_column({"val_length_accuracy": 1, "test_length_accuracy": 1}) == (
        "test_length_accuracy"
    )
    assert test_accuracy_column({"val_length_accuracy": 1}) == "val_length_accuracy"
    assert test_accuracy_column({"val_accuracy": 1}) == "val_accuracy"
    assert test_accuracy_column({"loss": 1}) is None


def test_unshifted_final_epochs_train_on_the_same_images_unshifted_and_resume(tfds_data_dir):
    from capsnet_tf.data import load_tfds_split
    from capsnet_tf.training import _load_split, _training_stream

    raw, _ = load_tfds_split("mnist", "train[:32]")
    raw = sorted(
        hashlib.sha1((image.astype(np.float32) / 255.0).tobytes()).hexdigest()
        for image, _ in raw.as_numpy_iterator()
    )

    def epochs_of(config, resume_step=0):
        train, _ = _load_split(config, "train")
        stream = _training_stream(config, train, resume_step).take(12 - resume_step)
        found = digests(stream)
        return [found[start:start + 32] for start in range(0, len(found), 32)], found

    config = ExperimentConfig(
        train_examples=32, batch_size=8, shift=2, epochs=3, unshifted_final_epochs=1
    )
    (first, second, last), stream = epochs_of(config)
    # The last epoch is the 32 training images, each once, as they are.
    assert sorted(last) == raw
    # The first two are shifted: a shift of (0, 0) has probability 1/25 per image.
    for epoch in (first, second):
        assert len(set(epoch) & set(raw)) < 8
    # Resumed inside the unshifted epoch, the stream continues with the same batches.
    _, resumed = epochs_of(config, resume_step=9)
    assert resumed == stream[9 * 8:]
    # Without the option every epoch is shifted.
    (*_, shifted_last), _ = epochs_of(dataclasses.replace(config, unshifted_final_epochs=0))
    assert len(set(shifted_last) & set(raw)) < 8


def test_unshifted_final_epochs_are_at_most_the_epochs():
    with pytest.raises(ValueError, match="unshifted_final_epochs.*Received"):
        ExperimentConfig(epochs=2, unshifted_final_epochs=3).validate()
