"""Every experiment of the paper and the official release runs end to end.

A few steps each, through `experiments/mnist.py`'s `main` with the real
flagfiles: MultiMNIST (two targets), expanded MNIST with the affNIST-style
evaluation for CapsNet and the baseline CNN, Fashion-MNIST, and CIFAR-10 /
smallNORB on `tfds.testing.mock_data` (they cannot be downloaded here), the
CIFAR-10 one as a 2-model ensemble. Plus the MultiMNIST figure (paper's
Figure 5).
"""

import json
import os

import numpy as np
import pytest
from absl import flags
from absl.testing import flagsaver

from capsnet_tf.config import MODEL_FIELDS
from capsnet_tf.schedules import make_schedule
from tests.test_mnist_experiment import load_script

TINY = [
    "--steps_per_epoch=2",
    "--batch_size=8",
    "--eval_examples=16",
    "--train_examples=32",
    "--verbose=0",
    "--backup_every_steps=1000",
]


def run_main(argv):
    """Parses `argv` (flagfiles expanded as the script does) and runs main."""
    script = load_script()
    with flagsaver.flagsaver():
        flags.FLAGS(script.resolve_flagfiles(["mnist", *argv]))
        script.main(["mnist"])


def parsed(flagfile, as_config=False):
    """The flag values a flagfile resolves to, or the script's `ExperimentConfig` of them."""
    script = load_script()
    with flagsaver.flagsaver():
        flags.FLAGS(script.resolve_flagfiles(["mnist", f"--flagfile={flagfile}"]))
        if as_config:
            return script.config_from_flags()
        return {name: flags.FLAGS[name].value for name in flags.FLAGS}


def read_json(workdir, name):
    with open(os.path.join(workdir, name)) as file:
        return json.load(file)


@pytest.mark.parametrize(
    "flagfile, expected",
    [
        ("mnist.flags", {"dataset": "mnist", "shift": 2, "model": "capsnet"}),
        ("fashion_mnist.flags", {"dataset": "fashion_mnist", "shift": 2, "routing_iterations": 3}),
        ("multi_mnist.flags", {"dataset": "multi_mnist", "shift": 4, "reconstruction": True}),
        ("affnist.flags", {"dataset": "expanded_mnist", "shift": 6, "model": "capsnet"}),
        ("affnist_baseline.flags", {"dataset": "expanded_mnist", "shift": 6, "model": "baseline"}),
        # The official CIFAR-10 override: num_prime_capsules=64, padding=SAME,
        # leaky=true, remake=false, 7 trials.
        ("cifar10.flags", {"dataset": "cifar10", "primary_capsule_types": 64, "padding": "same",
                           "leaky_routing": True, "reconstruction": False, "num_trials": 7}),
        ("smallnorb.flags", {"dataset": "smallnorb", "primary_capsule_types": 32,
                             "padding": "valid"}),
    ],
)
def test_flagfiles_hold_the_official_settings(flagfile, expected):
    values = parsed(flagfile)
    # Every flagfile keeps the official optimiser and loss settings.
    common = {"batch_size": 128, "learning_rate": 0.001, "decay_steps": 2000,
              "decay_rate": 0.96, "reconstruction_weight": 0.0005}
    for name, value in {**common, **expected}.items():
        assert values[name] == value, (flagfile, name, values[name], value)


@pytest.mark.large
def test_multi_mnist_experiment_and_figure_5(tfds_data_dir, tmp_path):
    from capsnet_tf.figures import FIGURE_SIZES, write_figures

    workdir = str(tmp_path / "multi")
    run_main(["--flagfile=multi_mnist.flags", f"--workdir={workdir}", *TINY])
    config = read_json(workdir, "config.json")
    model = read_json(workdir, "model.json")
    results = read_json(workdir, "results.json")
    assert config["dataset"] == "multi_mnist" and config["shift"] == 4
    assert model["image_shape"] == [36, 36, 1] and model["num_targets"] == 2
    metrics = results["test_metrics"]
    # "correct" (both) can never exceed "almost" (at least one).
    assert 0.0 <= metrics["length_accuracy"] <= metrics["length_accuracy_any"] <= 1.0
    assert results["test_accuracy"] == pytest.approx(metrics["length_accuracy"])

    written = write_figures(workdir, figures=("multimnist", "training_curves", "routing"),
                            dpi=50, log=lambda message: None)
    assert set(written) == {"multimnist", "training_curves", "routing"}
    import matplotlib.image

    picture = matplotlib.image.imread(written["multimnist"])
    width, height = FIGURE_SIZES["multimnist"]
    assert picture.shape[:2] == (round(height * 50), round(width * 50))


def test_figure_5_draws_each_digit_in_its_own_colour(tmp_path):
    import matplotlib.image

    from capsnet_tf.figures import plot_multimnist_separations, two_colour

    # Two digit-like blocks: the first reconstruction on the left half, the
    # second on the right, overlapping in one column.
    first = np.zeros((36, 36, 1), "float32")
    second = np.zeros((36, 36, 1), "float32")
    first[8:28, 4:19] = 1.0
    second[8:28, 18:32] = 1.0
    colour = two_colour(first, second)
    assert colour.shape == (36, 36, 3)
    np.testing.assert_array_equal(colour[10, 5], [1, 0, 0])   # first only: red
    np.testing.assert_array_equal(colour[10, 25], [0, 1, 0])  # second only: green
    np.testing.assert_array_equal(colour[10, 18], [1, 1, 0])  # both: yellow
    np.testing.assert_array_equal(colour[2, 2], [0, 0, 0])

    images = np.minimum(first + second, 1.0)[None].repeat(4, axis=0)
    reconstructions = np.stack([first, second])[None].repeat(4, axis=0)
    labels = np.array([[3, 7]] * 4)
    predictions = np.array([[3, 7], [7, 3], [3, 1], [3, 7]])
    path = plot_multimnist_separations(images, labels, reconstructions, predictions,
                                       str(tmp_path / "figure5.png"), dpi=60)
    picture = matplotlib.image.imread(path)[..., :3]
    red = (picture[..., 0] > 0.9) & (picture[..., 1] < 0.1) & (picture[..., 2] < 0.1)
    green = (picture[..., 1] > 0.9) & (picture[..., 0] < 0.1) & (picture[..., 2] < 0.1)
    # Four examples x a 15x20-pixel block each, scaled into the figure.
    assert red.sum() > 4 * 50 and green.sum() > 4 * 50


@pytest.mark.large
@pytest.mark.parametrize("flagfile", ["affnist.flags", "affnist_baseline.flags"])
def test_affnist_experiment_reports_both_test_sets(tfds_data_dir, tmp_path, flagfile):
    workdir = str(tmp_path / "run")
    run_main([f"--flagfile={flagfile}", f"--workdir={workdir}", *TINY])
    results = read_json(workdir, "results.json")
    config = read_json(workdir, "config.json")
    model = read_json(workdir, "model.json")
    assert model["image_shape"] == [40, 40, 1]
    assert config["model"] == ("baseline" if "baseline" in flagfile else "capsnet")
    for key in ("test_accuracy", "affnist_accuracy"):
        # 16 examples: a multiple of 1/16.
        assert 0.0 <= results[key] <= 1.0
        assert results[key] * 16 == pytest.approx(round(results[key] * 16))
    assert os.path.exists(os.path.join(workdir, "checkpoints", "latest.weights.h5"))


@pytest.mark.large
def test_fashion_mnist_experiment(tfds_data_dir, tmp_path):
    workdir = str(tmp_path / "fashion")
    run_main(["--flagfile=fashion_mnist.flags", f"--workdir={workdir}", *TINY])
    assert read_json(workdir, "config.json")["dataset"] == "fashion_mnist"
    assert 0.0 <= read_json(workdir, "results.json")["test_accuracy"] <= 1.0


@pytest.mark.large
def test_cifar10_official_configuration_as_an_ensemble_on_mock_data(tmp_path):
    import tensorflow_datasets as tfds

    workdir = str(tmp_path / "cifar10")
    with tfds.testing.mock_data(num_examples=16):
        run_main(["--flagfile=cifar10.flags", f"--workdir={workdir}", "--num_trials=2", *TINY])
    results = read_json(workdir, "results.json")
    assert results["num_trials"] == 2 and len(results["member_accuracies"]) == 2
    for trial in range(2):
        trial_dir = os.path.join(workdir, f"trial_{trial}")
        model = read_json(trial_dir, "model.json")
        assert model["image_shape"] == [24, 24, 3]
        assert model["primary_capsule_types"] == 64 and model["padding"] == "same"
        assert model["leaky_routing"] and not model["reconstruction"]
        assert read_json(trial_dir, "config.json")["seed"] == trial
        # The ensemble's view of each member agrees with the member's own evaluation.
        member = read_json(trial_dir, "results.json")["test_accuracy"]
        assert results["member_accuracies"][trial] == pytest.approx(member, abs=1e-6)
    assert 0.0 <= results["test_accuracy"] <= 1.0


@pytest.mark.large
def test_smallnorb_experiment_on_mock_data(tmp_path):
    import tensorflow_datasets as tfds

    workdir = str(tmp_path / "smallnorb")
    with tfds.testing.mock_data(num_examples=16):
        run_main(["--flagfile=smallnorb.flags", f"--workdir={workdir}", *TINY])
    model = read_json(workdir, "model.json")
    assert model["image_shape"] == [32, 32, 2] and model["num_classes"] == 5
    assert model["reconstruction"]
    assert 0.0 <= read_json(workdir, "results.json")["test_accuracy"] <= 1.0


def test_export_refuses_the_baseline_and_two_target_models_clearly(tmp_path):
    from capsnet_tf import BaselineCNN, CapsNet
    from capsnet_tf.export import export_saved_model

    small = dict(image_shape=(12, 12, 1), conv_filters=4, conv_kernel_size=3,
                 primary_capsule_types=2, primary_kernel_size=3, decoder_units=(8, 8))
    cases = [
        (BaselineCNN(image_shape=(8, 8, 1), conv_filters=(2, 2, 2), dense_units=(4, 4)),
         "baseline CNN"),
        (CapsNet(num_targets=2, **small), "num_targets > 1"),
    ]
    for model, words in cases:
        with pytest.raises(ValueError, match=words):
            export_saved_model(model, str(tmp_path / "export"))
        assert not os.path.exists(tmp_path / "export" / "1")


# The options that define the model (`MODEL_FIELDS`), its loss and the data it
# sees: a training recipe (issue 19) may change how the paper's CapsNet is
# trained, never these.
_RECIPE_FIXED_FIELDS = (
    *MODEL_FIELDS, "reconstruction_weight", "margin_class_reduction", "shift",
    "train_examples", "eval_examples",
)


@pytest.mark.parametrize("flagfile", ["mnist_fast.flags", "mnist_long.flags"])
def test_recipes_train_the_papers_model(flagfile):
    recipe, official = parsed(flagfile, as_config=True), parsed("mnist.flags", as_config=True)
    for name in _RECIPE_FIXED_FIELDS:
        assert getattr(recipe, name) == getattr(official, name), (
            flagfile, name, getattr(recipe, name), getattr(official, name))
    # What a recipe does change: a schedule that anneals over its whole run
    # (to at most a tenth of its peak by the last step), whose unshifted
    # epochs come last and leave shifted ones before them.
    steps = recipe.epochs * 60_000 // recipe.batch_size
    final_rate = float(make_schedule(recipe, steps_per_epoch=steps // recipe.epochs)(steps))
    assert final_rate <= 0.1 * recipe.learning_rate, (flagfile, final_rate)
    assert 0 < recipe.unshifted_final_epochs < recipe.epochs
    assert recipe.validation_examples is None  # the test set is the one reported
