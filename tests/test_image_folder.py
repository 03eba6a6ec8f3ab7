"""Your own images (`--image_folder`) end to end, and the folder and TFDS pipelines.

A generated folder of 20x20 PNG and JPEG images (three classes, RGB with some
grayscale) is trained on for two steps with the real script, exported, and
classified by predict.py, which prints the folder's class names. The
bad-input cases are in test_image_folder_errors.py.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from tests.conftest import REPO_ROOT
from tests.image_folder_helpers import CLASSES, write_folder

MNIST = os.path.join(REPO_ROOT, "experiments", "mnist.py")
EXPORT = os.path.join(REPO_ROOT, "experiments", "export.py")
PREDICT = os.path.join(REPO_ROOT, "experiments", "predict.py")


def run(script, args, cwd=REPO_ROOT):
    return subprocess.run([sys.executable, script, *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.large
def test_folder_trains_exports_and_predicts_with_its_class_names(tmp_path):
    folder = write_folder(tmp_path / "images")
    workdir = tmp_path / "run"
    # The flagfile's --dataset=mnist is replaced by --image_folder.
    result = run(MNIST, [
        "--flagfile=mnist.flags", f"--image_folder={folder}", f"--workdir={workdir}",
        "--epochs=1", "--steps_per_epoch=2", "--batch_size=4", "--primary_capsule_types=2",
        "--verbose=2",
    ])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Estimated peak memory of a training step at batch size 4" in result.stderr
    assert "converted to RGB" in result.stderr  # the grayscale images, said once
    assert (workdir / "labels.txt").read_text().splitlines() == list(CLASSES)
    config = json.loads((workdir / "config.json").read_text())
    assert config["dataset"] == "image_folder" and config["image_folder"] == folder
    results = json.loads((workdir / "results.json").read_text())
    assert np.isfinite(results["test_loss"])
    model = json.loads((workdir / "model.json").read_text())
    assert model["image_shape"] == [20, 20, 3] and model["num_classes"] == 3
    assert model["vote_scaling"] == "capsule_count"  # --vote_scaling=auto on a folder

    serving = tmp_path / "serving"
    result = run(EXPORT, [f"--workdir={workdir}", f"--export_dir={serving}"])
    assert result.returncode == 0, result.stderr[-3000:]
    labels = serving / "1" / "assets" / "labels.txt"
    assert labels.read_text().splitlines() == list(CLASSES)

    image = os.path.join(folder, "square", "001.jpg")
    other_size = str(tmp_path / "larger.png")  # resized to 20x20 by --resize
    Image.fromarray(np.full((30, 24), 128, np.uint8)).save(other_size)
    result = run(PREDICT, [f"--model={serving}", "--resize", image, other_size])
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()[-2:]
    for name, line in zip((image, other_size), lines):
        assert line.startswith(f"{name}: class "), line
        assert any(f"({label})" in line for label in CLASSES), line


def test_scan_splits_each_class_and_reads_train_test_folders(tmp_path):
    from capsnet_tf.data.folder import scan_image_folder

    folder = scan_image_folder(write_folder(tmp_path / "a", per_class=10), seed=3)
    assert folder.class_names == CLASSES and folder.layout == "split"
    assert folder.image_shape == (20, 20, 3)
    train, test = (folder.splits[split] for split in ("train", "test"))
    assert (len(train[0]), len(test[0])) == (24, 6)
    assert sorted(np.bincount(test[1])) == [2, 2, 2]
    assert not set(train[0]) & set(test[0])
    again = scan_image_folder(str(tmp_path / "a"), seed=3)
    assert again.splits["test"][0] == test[0]  # seeded

    write_folder(tmp_path / "b" / "train", per_class=4, grayscale_every=1)
    write_folder(tmp_path / "b" / "test", per_class=2, grayscale_every=1)
    given = scan_image_folder(str(tmp_path / "b"), image_size=(12, 16))
    assert given.layout == "train/test" and given.image_shape == (12, 16, 1)
    assert (len(given.splits["train"][0]), len(given.splits["test"][0])) == (12, 6)


def test_folder_pipeline_decodes_resizes_and_scales(tmp_path):
    from capsnet_tf.data.registry import load_experiment_data

    folder = write_folder(tmp_path / "images")
    data, spec = load_experiment_data(
        "image_folder", "train", 5, training=True, image_folder=folder, image_size=(16, 16),
        shift=2, horizontal_flip=True, reconstruction=True,
    )
    assert spec.image_shape == (16, 16, 3) and spec.class_names == CLASSES
    assert spec.num_examples == 15
    inputs, targets = next(iter(data))
    assert inputs["image"].shape == (5, 16, 16, 3) and inputs["image"].dtype == "float32"
    assert float(np.min(inputs["image"])) >= 0.0 and float(np.max(inputs["image"])) <= 1.0
    assert set(np.asarray(targets["length"]).tolist()) <= {0, 1, 2}
    test, _ = load_experiment_data(
        "image_folder", "test", 100, training=False, image_folder=folder, image_size=16,
        reconstruction=False,
    )
    first, second = (np.asarray(next(iter(test))[0]["image"]) for _ in range(2))
    np.testing.assert_array_equal(first, second)  # evaluation: fixed order, no augmentation


def test_any_tfds_image_data_set_by_name(tfds_data_dir):
    from capsnet_tf.data.tfds_images import make_tfds_image_dataset

    data, spec = make_tfds_image_dataset(
        "fashion_mnist", "test", 8, training=False, take=16, image_size=(20, 20),
        reconstruction=False,
    )
    assert spec.image_shape == (20, 20, 1) and spec.num_classes == 10
    assert spec.class_names[0] == "T-shirt/top"
    inputs, targets = next(iter(data))
    assert inputs["image"].shape == (8, 20, 20, 1)


def test_config_lets_image_folder_replace_the_dataset():
    from capsnet_tf.config import ExperimentConfig

    config = ExperimentConfig(dataset="mnist", image_folder="/data/pets", image_size=("64",))
    assert config.dataset == "image_folder" and config.image_size == (64,)
    config.validate()
    ExperimentConfig(dataset="kmnist").validate()
    ExperimentConfig(dataset="eurosat/rgb").validate()
    with pytest.raises(ValueError, match="needs --image_folder"):
        ExperimentConfig(dataset="image_folder").validate()
    # auto: the paper's votes on the paper's data sets, scaled on anything else.
    from capsnet_tf.config import capsnet_options

    assert capsnet_options(ExperimentConfig())["vote_scaling"] == "none"
    assert capsnet_options(ExperimentConfig(dataset="cifar10"))["vote_scaling"] == "none"
    assert capsnet_options(config)["vote_scaling"] == "capsule_count"
    assert capsnet_options(ExperimentConfig(dataset="kmnist"))["vote_scaling"] == (
        "capsule_count"
    )
    explicit = ExperimentConfig(image_folder="/data/pets", vote_scaling="none")
    assert capsnet_options(explicit)["vote_scaling"] == "none"
    with pytest.raises(ValueError, match="image_size"):
        ExperimentConfig(image_folder="x", image_size=("big",)).validate()
