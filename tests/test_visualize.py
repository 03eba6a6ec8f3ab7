"""Figures of a trained work directory, the perturbation grid and the TensorBoard callback."""

import glob
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from matplotlib import image as mpimg

from capsnet_tf import FlooredExponentialDecay, figures
from capsnet_tf.callbacks import ReconstructionImages
from tests.conftest import REPO_ROOT

SCRIPT = os.path.join(REPO_ROOT, "experiments", "visualize.py")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tfds_data_dir):
    """A tiny trained work directory, made once for the module (~15 s)."""
    from capsnet_tf.config import ExperimentConfig
    from capsnet_tf.training import train_and_evaluate

    path = str(tmp_path_factory.mktemp("visualize") / "run")
    config = ExperimentConfig(
        epochs=1, steps_per_epoch=2, batch_size=8, eval_examples=16, train_examples=64, verbose=0
    )
    train_and_evaluate(config, path)
    return path


@pytest.fixture(scope="module")
def model(workdir):
    from capsnet_tf.workdir import load_trained_model

    return load_trained_model(workdir)[0]


@pytest.fixture(scope="module")
def sample_images(tfds_data_dir):
    return figures.load_test_images("mnist", 24)


def _pixels(name, dpi):
    width, height = figures.FIGURE_SIZES[name]
    return round(height * dpi), round(width * dpi)


@pytest.mark.large
def test_script_writes_every_figure_as_a_png_of_the_expected_size(workdir, tmp_path):
    output_dir = tmp_path / "figures"
    # From another directory: the script finds the repository by itself.
    result = subprocess.run(
        [sys.executable, SCRIPT, f"--workdir={workdir}", f"--output_dir={output_dir}",
         "--eval_examples=24", "--perturbation_digits=0,1", "--routing_example=2", "--dpi=50"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "MPLBACKEND": ""},  # headless without help from the environment
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Wrote 6 figures" in result.stdout
    expected = {
        "reconstructions.png": "reconstructions",
        "perturbations_0.png": "perturbations",
        "perturbations_1.png": "perturbations",
        "training_curves.png": "training_curves",
        "confusion_matrix.png": "confusion_matrix",
        "routing.png": "routing",
    }
    assert sorted(os.listdir(output_dir)) == sorted(expected)
    for filename, name in expected.items():
        path = output_dir / filename
        with open(path, "rb") as file:
            assert file.read(8) == b"\x89PNG\r\n\x1a\n", filename
        pixels = mpimg.imread(path)
        assert pixels.shape[:2] == _pixels(name, 50), filename
        assert pixels[..., :3].std() > 0.01, f"{filename} is blank"
    # The documented default size, at 100 dpi.
    assert _pixels("perturbations", figures.DPI) == (950, 800)


def test_a_missing_work_directory_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing.config.json does not exist"):
        figures.write_figures(str(tmp_path / "nothing"))


@pytest.mark.large
def test_perturbation_grid_changes_along_every_row(model, sample_images):
    images, _ = sample_images
    outputs = figures.predict(model, images[:4])
    class_id = int(outputs["predictions"][0])
    capsules = outputs["capsules"][0]
    values = figures.PERTURBATION_VALUES
    grid = figures.perturbation_grid(model, capsules, class_id)
    assert grid.shape == (16, 11, 28, 28, 1)
    np.testing.assert_allclose(values, np.arange(-0.25, 0.26, 0.05), atol=1e-9)

    # The column of 0.0 is the plain reconstruction of the predicted capsule.
    middle = list(values).index(0.0)
    for row in range(16):
        np.testing.assert_allclose(grid[row, middle], outputs["reconstruction"][0], atol=1e-5)
    # Along every row the image changes, step by step (not one image copied).
    steps = np.abs(np.diff(grid, axis=1)).max(axis=(2, 3, 4))  # [16, 10]
    assert (steps > 1e-6).all(), steps.min()
    assert (np.abs(grid[:, -1] - grid[:, 0]).mean(axis=(1, 2, 3)) > 1e-5).all()
    # Rows differ from each other: each perturbs its own dimension.
    assert np.abs(grid[0, 0] - grid[1, 0]).max() > 1e-6

    # One cell by hand: dimension 4 of the class capsule + 0.25, other classes zero.
    masked = np.zeros_like(capsules)
    masked[class_id] = capsules[class_id]
    masked[class_id, 4] += 0.25
    expected = model.get_layer("decoder")(masked[None], training=False)[0]
    np.testing.assert_allclose(grid[4, -1], expected, atol=1e-5)


@pytest.mark.large
def test_routing_couplings_over_the_primary_grid(model, sample_images):
    images, _ = sample_images
    routing = figures.routing_couplings(model, images[0])
    couplings = routing["couplings"]
    assert couplings.shape == (3, 32, 6, 6, 10)
    np.testing.assert_allclose(couplings.sum(-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(couplings[0], 0.1, atol=1e-6)  # uniform before any agreement
    assert routing["prediction"] == int(figures.predict(model, images[:1])["predictions"][0])
    # Type-major order: capsule index t*36 + row*6 + column.
    primary = model.get_layer("primary_capsules")(model.get_layer("conv1")(images[:1]))
    lengths = np.linalg.norm(np.asarray(primary)[0], axis=-1)
    assert routing["primary_lengths"][5, 2, 3] == pytest.approx(lengths[5 * 36 + 2 * 6 + 3])


def test_confusion_matrix_and_learning_rates():
    matrix = figures.confusion_matrix([3, 3, 1, 0], [3, 1, 1, 0], 4)
    assert matrix.sum() == 4 and np.trace(matrix) == 3 and matrix[3, 1] == 1

    schedule = FlooredExponentialDecay(1e-3, 2000, 0.96, 1e-6)
    config = {"learning_rate": 1e-3, "decay_steps": 2000, "decay_rate": 0.96,
              "minimum_learning_rate": 1e-6, "batch_size": 128,
              "steps_per_epoch": None, "train_examples": None}
    rates = figures.learning_rates(config, [0, 1, 9], 60000)
    # ceil(60000 / 128) = 469 steps per epoch.
    np.testing.assert_allclose(rates, [float(schedule(469 * n)) for n in (1, 2, 10)], rtol=1e-6)
    rates = figures.learning_rates({**config, "steps_per_epoch": 2}, [0, 2], 60000)
    np.testing.assert_allclose(rates, [float(schedule(2)), float(schedule(6))], rtol=1e-6)
    rates = figures.learning_rates({**config, "train_examples": 64, "batch_size": 8},
                                         [0], 60000)
    np.testing.assert_allclose(rates, [float(schedule(8))], rtol=1e-6)


def test_training_curves_of_many_epochs_and_of_an_empty_log(tmp_path):
    epochs = np.arange(5.0)
    log = {"epoch": epochs, "loss": 0.3 / (epochs + 1), "length_loss": 0.2 / (epochs + 1),
           "reconstruction_loss": 40 / (epochs + 1), "length_accuracy": 0.9 + epochs / 100,
           "val_loss": 0.25 / (epochs + 1), "val_length_accuracy": 0.95 + epochs / 200}
    path = figures.plot_training_curves(
        log, str(tmp_path / "curves.png"), rates=np.linspace(1e-3, 5e-4, 5),
        reconstruction_weight=0.0005, dpi=40,
    )
    assert mpimg.imread(path).shape[:2] == _pixels("training_curves", 40)
    path = figures.plot_training_curves({}, str(tmp_path / "empty.png"), dpi=40)
    assert mpimg.imread(path).shape[:2] == _pixels("training_curves", 40)


def test_matplotlib_runs_headless():
    import matplotlib

    assert matplotlib.get_backend().lower() == "agg"


def _image_summaries(log_dir):
    """{step: decoded image} of the "reconstructions" summaries in log_dir."""
    found = {}
    for path in glob.glob(os.path.join(log_dir, "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == "reconstructions":
                    assert value.metadata.plugin_data.plugin_name == "images"
                    width, height, png = tf.make_ndarray(value.tensor)[:3]
                    image = tf.io.decode_png(png).numpy()
                    assert image.shape[:2] == (int(height), int(width))
                    found[event.step] = image
    return found


@pytest.mark.large
def test_reconstruction_images_callback_writes_an_image_summary_each_epoch(
    model, sample_images, tmp_path
):
    images, labels = sample_images
    log_dir = str(tmp_path / "logs")
    callback = ReconstructionImages(images, labels, log_dir, max_images=16)
    assert callback.images.shape == (16, 28, 28, 1)
    callback.set_model(model)
    callback.on_train_begin()
    callback.on_epoch_end(0)
    callback.on_epoch_end(1)
    callback.on_train_end()
    found = _image_summaries(log_dir)
    assert sorted(found) == [0, 1]
    # Inputs (top) over reconstructions (bottom), 16 tiles 2 px apart.
    assert found[0].shape == (2 * 28 + 2, 16 * 28 + 15 * 2, 1)
    top = found[0][:28, :28, 0] / 255.0
    np.testing.assert_allclose(top, images[0, ..., 0], atol=1 / 255 + 1e-6)

    with pytest.raises(ValueError, match="max_images"):
        ReconstructionImages(images, labels, log_dir, max_images=0)
    with pytest.raises(ValueError, match="labels"):
        ReconstructionImages(images, labels[:3], log_dir)


@pytest.mark.large
def test_reconstruction_images_callback_inside_fit(workdir, sample_images, tmp_path):
    from capsnet_tf.training import compile_model
    from capsnet_tf.workdir import load_trained_model

    model, config = load_trained_model(workdir)
    compile_model(model, config)
    images, labels = sample_images
    log_dir = str(tmp_path / "logs")
    model.fit(
        {"image": images[:8], "label": labels[:8]},
        {"length": labels[:8], "reconstruction": images[:8]},
        batch_size=8, epochs=2, verbose=0,
        callbacks=[ReconstructionImages(images, labels, log_dir, max_images=4)],
    )
    found = _image_summaries(log_dir)
    assert sorted(found) == [0, 1]
    assert found[1].shape == (2 * 28 + 2, 4 * 28 + 3 * 2, 1)


@pytest.fixture(scope="module")
def saved_model(model, tmp_path_factory):
    """The tiny model exported by its developer's capsnet_tf.export (serving_float, decode)."""
    export = pytest.importorskip("capsnet_tf.export")
    return export.export_saved_model(model, str(tmp_path_factory.mktemp("export")), verify=False)


@pytest.mark.large
def test_saved_model_draws_what_the_checkpoint_draws(model, saved_model, workdir, sample_images,
                                                    tmp_path):
    images, _ = sample_images
    from_keras = figures.predict(model, images[:6])
    from_export = figures.predict(saved_model, images[:6])
    for name in ("length", "capsules", "reconstruction", "predictions"):
        np.testing.assert_allclose(from_export[name], from_keras[name], atol=1e-5, err_msg=name)
    class_id = int(from_keras["predictions"][0])
    np.testing.assert_allclose(
        figures.perturbation_grid(saved_model, from_keras["capsules"][0], class_id),
        figures.perturbation_grid(model, from_keras["capsules"][0], class_id),
        atol=1e-5,
    )
    written = figures.write_figures(
        workdir, str(tmp_path), figures=["reconstructions", "perturbations", "confusion_matrix"],
        eval_examples=24, perturbation_digits=[1], dpi=30, saved_model=saved_model,
        log=lambda message: None,
    )
    assert sorted(written) == ["confusion_matrix", "perturbations_1", "reconstructions"]
    for name, path in written.items():
        kind = name if name in figures.FIGURE_SIZES else "perturbations"
        assert mpimg.imread(path).shape[:2] == _pixels(kind, 30), name
