"""The paper's protocols beyond MNIST (issue 42): the affNIST-style set of 32
transformations per digit, the MultiMNIST metric, the comparison CNN and the
scoring of a tiny run of each model."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from capsnet_tf.config import ExperimentConfig
from capsnet_tf.data.affnist import affine_transform, affnist_parameters, make_affnist_dataset
from capsnet_tf.data.multimnist import load_mnist_arrays
from capsnet_tf.paper import (
    affnist_breakdown,
    affnist_by_transformation,
    multimnist_scores,
    single_label_accuracy,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def collect(dataset):
    images, labels = [], []
    for inputs, targets in dataset:
        images.append(np.asarray(inputs["image"]))
        labels.append(np.asarray(targets["length"]))
    return np.concatenate(images), np.concatenate(labels)


# ------------------------------------------------------------------ affNIST-style set


def test_affnist_set_has_32_distinct_in_range_transformations_per_digit(tfds_data_dir):
    copies, digits = 32, 3
    dataset, spec = make_affnist_dataset(
        50, seed=5, copies=copies, take=copies * digits, reconstruction=False
    )
    assert spec.num_examples == 320_000
    images, labels = collect(dataset)
    mnist_images, mnist_labels = load_mnist_arrays("test")
    # Example k is digit k // 32, with its own transformation.
    np.testing.assert_array_equal(labels, np.repeat(mnist_labels[:digits], copies))
    # The generator's own record of each transformation, for the same examples.
    warped, record = affine_transform(
        np.repeat(mnist_images[:digits], copies, axis=0), seed=5, return_parameters=True
    )
    np.testing.assert_allclose(images, warped.numpy(), atol=1e-6)
    assert np.abs(record["rotation"]).max() <= 20.0
    assert np.abs(record["shear"]).max() <= 0.2
    for axis in ("scale_y", "scale_x"):
        assert record[axis].min() >= 0.8 and record[axis].max() <= 1.2
    for digit in range(digits):
        rows = slice(digit * copies, (digit + 1) * copies)
        drawn = np.stack([record[name][rows] for name in sorted(record)], axis=1)
        assert len(np.unique(drawn.round(6), axis=0)) == copies  # 32 distinct transformations
        flat = images[rows].reshape(copies, -1)
        assert len(np.unique(flat.round(4), axis=0)) == copies  # and 32 distinct images
        # The whole digit stays inside the frame: as much ink as the digit
        # scaled by the transformation's area factor (scale_x * scale_y),
        # within interpolation's blur at the digit's edge.
        ink = images[rows].sum(axis=(1, 2, 3))
        expected = mnist_images[digit].sum() / 255.0 * record["scale_x"][rows] * record[
            "scale_y"
        ][rows]
        np.testing.assert_allclose(ink, expected, rtol=0.08)
        # No ink on the outermost ring of pixels: nothing touches the border.
        border = np.concatenate(
            [images[rows][:, 0], images[rows][:, -1], images[rows][:, :, 0], images[rows][:, :, -1]]
        )
        assert border.max() < 0.05
    # The same seed gives the same set; another seed another.
    again, _ = collect(make_affnist_dataset(50, seed=5, copies=copies, take=64,
                                            reconstruction=False)[0])
    np.testing.assert_array_equal(again, images[:64])
    other, _ = collect(make_affnist_dataset(50, seed=6, copies=copies, take=64,
                                            reconstruction=False)[0])
    assert not np.allclose(other, images[:64])


def test_affnist_parameters_are_the_data_sets_own_transformations(tfds_data_dir):
    """The record the breakdown reads is the transformation of each example, in order."""
    copies, count = 32, 70  # crosses from the second digit into the third
    drawn = affnist_parameters(seed=5, copies=copies, take=count)
    mnist_images, _ = load_mnist_arrays("test")
    _, record = affine_transform(
        np.repeat(mnist_images[:3], copies, axis=0)[:count], seed=5, return_parameters=True
    )
    assert sorted(drawn) == sorted(record)
    for name in record:
        np.testing.assert_allclose(drawn[name], record[name], atol=1e-6)


def test_affnist_breakdown_by_hand():
    parameters = {
        "translate_y": np.array([0.0, 7.5, -2.0, 3.0, -6.0]),
        "translate_x": np.array([6.0, 1.0, -9.0, 0.0, 0.0]),
        "rotation": np.array([5.0, -15.0, 10.0, -3.0, 19.0]),
    }
    correct = np.array([True, False, False, True, True])
    groups = affnist_breakdown(correct, parameters, trained_shift=6)
    # Within 6 px: examples 0, 3, 4 (all right); beyond: 1 (7.5) and 2 (9), both wrong.
    assert groups["shift_within_training"] == {"accuracy": 1.0, "examples": 3}
    assert groups["shift_beyond_training"] == {"accuracy": 0.0, "examples": 2}
    # |rotation| <= 10: examples 0, 2, 3 (2 of 3 right); beyond: 1 and 4 (1 of 2).
    assert groups["rotation_up_to_10"]["examples"] == 3
    assert groups["rotation_up_to_10"]["accuracy"] == pytest.approx(2 / 3)
    assert groups["rotation_beyond_10"] == {"accuracy": 0.5, "examples": 2}
    empty = affnist_breakdown(correct, parameters, trained_shift=100)
    assert empty["shift_beyond_training"] == {"accuracy": None, "examples": 0}
    with pytest.raises(ValueError, match="Received: 4 scores, 5 transformations"):
        affnist_breakdown(correct[:4], parameters)


def test_affnist_by_transformation_by_hand():
    parameters = {
        "translate_y": np.array([0.0, 7.5, -2.0, 3.0, -6.0, 25.0]),
        "translate_x": np.array([6.0, 1.0, -9.0, 0.0, 0.0, 0.0]),
        "rotation": np.array([5.0, -15.0, 10.0, -3.0, 19.0, 0.0]),
        "shear": np.array([0.0, -0.2, 0.1, 0.12, 0.05, 0.0]),
        "scale_y": np.array([0.8, 1.2, 1.0, 0.9, 1.1, 1.0]),
        "scale_x": np.array([0.8, 1.0, 1.2, 0.9, 0.9, 1.0]),
    }
    correct = np.array([True, False, False, True, True, True])
    curves = affnist_by_transformation(
        correct, parameters,
        edges={"shift": (0, 6, 8, 20), "rotation": (0, 10, 20), "shear": (0, 0.1, 0.2),
               "scale": (0.8, 1.0, 1.2)},
    )
    # Shifts 6, 7.5, 9, 3, 6, 25: [0, 6] holds 0, 3, 4 (all right); (6, 8] holds 1
    # (wrong); (8, 20] holds 2 (wrong); 25 lies outside every bin.
    assert curves["shift"] == {
        "edges": [0.0, 6.0, 8.0, 20.0], "accuracy": [1.0, 0.0, 0.0], "examples": [3, 1, 1],
    }
    # |rotation| 5, 15, 10, 3, 19, 0: [0, 10] holds 0, 2, 3, 5 (3 of 4 right); (10, 20] 1, 4.
    assert curves["rotation"]["examples"] == [4, 2]
    assert curves["rotation"]["accuracy"] == [0.75, 0.5]
    # |shear| 0, 0.2, 0.1, 0.12, 0.05, 0: [0, 0.1] holds 0, 2, 4, 5; (0.1, 0.2] holds 1, 3.
    assert curves["shear"]["examples"] == [4, 2]
    assert curves["shear"]["accuracy"] == [0.75, 0.5]
    # Mean scales 0.8, 1.1, 1.1, 0.9, 1.0, 1.0: [0.8, 1.0] holds 0, 3, 4, 5; (1.0, 1.2] 1, 2.
    assert curves["scale"]["examples"] == [4, 2]
    assert curves["scale"]["accuracy"] == [1.0, 0.0]
    empty = affnist_by_transformation(correct, parameters, edges={"shift": (30, 40)})
    assert empty["shift"] == {"edges": [30.0, 40.0], "accuracy": [None], "examples": [0]}
    with pytest.raises(ValueError, match="Received: 5 scores, 6 transformations"):
        affnist_by_transformation(correct[:5], parameters)


def test_affnist_copies_are_checked():
    with pytest.raises(ValueError, match="Received: copies=0"):
        make_affnist_dataset(8, copies=0)
    with pytest.raises(ValueError, match="generated set only"):
        make_affnist_dataset(8, copies=32, path="test.mat")


# ---------------------------------------------------------------- MultiMNIST metric


def test_multimnist_metric_on_hand_made_capsule_lengths():
    labels = np.array([[3, 7], [3, 7], [3, 7], [3, 7], [3, 7], [0, 9]])
    lengths = np.full((6, 10), 0.1)
    lengths[0, [3, 7]] = [0.9, 0.8]                   # right
    lengths[1, [3, 7, 5]] = [0.9, 0.2, 0.8]            # one wrong: 5 beats 7
    lengths[2, [3, 7, 5, 1]] = [0.3, 0.2, 0.8, 0.9]    # both wrong
    lengths[3, [3, 7, 5]] = [0.9, 0.6, 0.6]            # tie with another class: wrong
    lengths[4, [3, 7]] = [0.6, 0.6]                    # the two labels tie: right
    lengths[5, [0, 9, 4]] = [0.5, 0.7, 0.95]           # 0 is third: one wrong
    result = multimnist_scores(lengths, labels)
    assert result["examples"] == 6
    assert result["pair_accuracy"] == pytest.approx(2 / 6)
    assert result["pair_error"] == pytest.approx(4 / 6)
    # At least one label among the two longest: all but row 2.
    assert result["any_accuracy"] == pytest.approx(5 / 6)
    # Labels not found: row 1 one, row 2 two, row 3 one, row 5 one.
    assert result["digit_error"] == pytest.approx(5 / 12)
    assert result["ties"] == 2  # rows 3 and 4
    # The project's Keras metric agrees wherever no tie is broken by class id.
    from capsnet_tf.metrics import multi_label_correct

    untied = [0, 1, 2, 5]
    keras_right = np.asarray(multi_label_correct(labels[untied], lengths[untied]))
    np.testing.assert_array_equal(keras_right, [1, 0, 0, 0])


def test_multimnist_metric_rejects_bad_shapes_and_equal_labels():
    with pytest.raises(ValueError, match="Received shapes"):
        multimnist_scores(np.zeros((2, 10)), np.zeros((2,), int))
    with pytest.raises(ValueError, match="must differ"):
        multimnist_scores(np.zeros((1, 10)), np.array([[4, 4]]))


def test_single_label_accuracy():
    assert single_label_accuracy([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]], [1, 1, 1]) == 2 / 3
    with pytest.raises(ValueError, match="Received shapes"):
        single_label_accuracy([[0.1, 0.9]], [1, 0])


# ---------------------------------------------------------------- the comparison CNN


def test_pooled_cnn_is_the_official_conv_model_with_a_pinned_parameter_count():
    from capsnet_tf.models.baseline import build_cnn

    model = build_cnn("pooled_cnn", (40, 40, 1), 10)
    # By hand: conv 5x5x1x512 + 512, conv 5x5x512x256 + 256 on the 18x18 pooled
    # map, 7x7x256 flattened into 1024 units, 10 logits.
    by_hand = (25 * 512 + 512) + (25 * 512 * 256 + 256) + (7 * 7 * 256 * 1024 + 1024) + (
        1024 * 10 + 10
    )
    assert model.count_params() == by_hand == 16_146_698
    kinds = [type(layer).__name__ for layer in model.layers]
    assert kinds.count("MaxPooling2D") == 2 and kinds.count("Dropout") == 1
    assert [layer.padding for layer in model.conv_layers] == ["valid", "valid"]
    # CapsNet at 40x40 for comparison: "a similar number of parameters".
    from capsnet_tf.models.capsnet import CapsNet

    capsnet = CapsNet(image_shape=(40, 40, 1))
    assert 0.8 < capsnet.count_params() / model.count_params() < 1.25


# ---------------------------------------------------------------- tiny runs, scored

TINY = dict(
    steps_per_epoch=2, batch_size=8, eval_examples=16, train_examples=64, primary_capsule_types=2,
    verbose=0,
)


@pytest.mark.large
@pytest.mark.parametrize("model", ["capsnet", "pooled_cnn"])
def test_tiny_expanded_mnist_run_stops_at_target_and_is_scored(tfds_data_dir, tmp_path, model):
    from capsnet_tf.paper import evaluate_affnist_protocol
    from capsnet_tf.training import train_and_evaluate

    workdir = str(tmp_path / model)
    config = ExperimentConfig(
        dataset="expanded_mnist", shift=6, model=model, epochs=3, target_accuracy=1e-6,
        **TINY,
    )
    results = train_and_evaluate(config, workdir)
    # Stopped at the first epoch whose accuracy reached the target.
    assert results["time_to_target"]["epoch"] <= 3
    result = evaluate_affnist_protocol(workdir, copies=32, take=64, progress=False)
    assert result["model"] == model
    assert result["affnist_examples"] == result["test_examples"] == 64
    assert result["centred_examples"] == 64
    assert 0.0 <= result["affnist_accuracy"] <= 1.0
    assert result["epochs"] == results["time_to_target"]["epoch"]
    assert result["training_images"] == result["epochs"] * 2 * 8
    assert result["parameters"] > 0
    assert result["scored_in"] == "float32"  # the run trained in float32
    breakdown = result["affnist_breakdown"]
    for pair in (("shift_within_training", "shift_beyond_training"),
                 ("rotation_up_to_10", "rotation_beyond_10")):
        assert sum(breakdown[name]["examples"] for name in pair) == 64
    # Every generated image falls in one bin of each curve (the edges span the ranges).
    for curve in result["affnist_by_transformation"].values():
        assert sum(curve["examples"]) == 64
    # A run that trained in mixed bfloat16 is scored in it by default, in float32 on
    # request, and the global policy is left as it was.
    import keras

    with open(os.path.join(workdir, "config.json")) as file:
        saved = json.load(file)
    saved["mixed_precision_resolved"] = "bfloat16"
    with open(os.path.join(workdir, "config.json"), "w") as file:
        json.dump(saved, file)
    before = keras.config.dtype_policy().name
    for precision, scored_in in (("trained", "bfloat16"), ("float32", "float32")):
        result = evaluate_affnist_protocol(
            workdir, copies=32, take=16, progress=False, precision=precision
        )
        assert result["scored_in"] == scored_in
        assert 0.0 <= result["affnist_accuracy"] <= 1.0
        assert keras.config.dtype_policy().name == before
    with pytest.raises(ValueError, match="Received: precision='half'"):
        evaluate_affnist_protocol(workdir, take=16, progress=False, precision="half")


@pytest.mark.large
def test_paper_eval_script_on_a_tiny_multimnist_run(tfds_data_dir, tmp_path):
    from capsnet_tf.training import train_and_evaluate

    workdir = str(tmp_path / "multi")
    train_and_evaluate(ExperimentConfig(dataset="multi_mnist", shift=4, **TINY), workdir)
    out = tmp_path / "evidence"
    # The real command line, which picks the protocol from the run's data set.
    command = [
        sys.executable, os.path.join(REPO, "experiments", "paper_eval.py"),
        f"--workdir={workdir}", f"--output_dir={out}", "--take=40", "--batch_size=16",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    with open(out / "results.json") as file:
        result = json.load(file)
    assert result["test_examples"] == 40 and result["model"] == "capsnet"
    assert 0.0 <= result["test_pair_accuracy"] <= result["test_any_accuracy"] <= 1.0
    assert result["paper"]["capsnet_error"] == 0.052
    assert sorted(os.listdir(out)) == ["config.json", "results.json", "training_log.csv"]


# ------------------------------------------------------------------ the figure


def _curves_result(scale):
    """A hand-made paper_eval result whose accuracies are `scale` times a fixed curve."""
    from capsnet_tf.paper import AFFNIST_CURVE_EDGES

    curves = {}
    for name, edges in AFFNIST_CURVE_EDGES.items():
        bins = len(edges) - 1
        curves[name] = {
            "edges": list(edges),
            "accuracy": [scale * (1 - 0.05 * k) for k in range(bins - 1)] + [None],
            "examples": [100] * (bins - 1) + [0],
        }
    return {"affnist_accuracy": 0.9 * scale, "affnist_examples": 320_000,
            "cpu": "Test CPU", "affnist_by_transformation": curves}


def test_affnist_figure_script_draws_each_model_and_names_a_result_without_curves(tmp_path):
    from matplotlib import image as mpimg

    from capsnet_tf.figures import FIGURE_SIZES

    paths = []
    for name, scale in (("capsnet", 1.0), ("cnn", 0.9)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(_curves_result(scale)))
    output = tmp_path / "figure.png"
    script = os.path.join(REPO, "experiments", "plot_affnist.py")
    done = subprocess.run(
        [sys.executable, script, f"--result=CapsNet={paths[0]}", f"--result=CNN={paths[1]}",
         f"--output={output}"],
        capture_output=True, text=True, check=False, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    picture = mpimg.imread(output)
    width, height = FIGURE_SIZES["affnist_by_transformation"]
    assert picture.shape[:2] == (round(height * 100), round(width * 100))
    assert picture[..., :3].std() > 0.05  # something was drawn
    paths[1].write_text(json.dumps({"affnist_accuracy": 0.7, "cpu": "Test CPU"}))
    done = subprocess.run(
        [sys.executable, script, f"--result=CapsNet={paths[0]}", f"--result=real={paths[1]}",
         f"--output={tmp_path / 'bad.png'}"],
        capture_output=True, text=True, check=False, timeout=120,
    )
    assert done.returncode != 0
    assert "'real' has no `affnist_by_transformation`" in done.stderr
    assert not (tmp_path / "bad.png").exists()
