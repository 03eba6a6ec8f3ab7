"""experiments/predict.py and experiments/serving_benchmark.py on a tiny export.

The scripts define absl flags that clash with experiments/mnist.py's
(`--batch_size`), so they run in subprocesses.
"""

import json
import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from capsnet_tf.export import export_saved_model
from tests.conftest import REPO_ROOT
from tests.test_model import small_model

PREDICT = os.path.join(REPO_ROOT, "experiments", "predict.py")
BENCHMARK = os.path.join(REPO_ROOT, "experiments", "serving_benchmark.py")
LINE = re.compile(r"^(?P<name>.+): class (?P<id>\d+) \((?P<label>.*)\) probability (?P<p>[\d.]+)$")


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    keras.utils.set_random_seed(7)
    base = tmp_path_factory.mktemp("serving")
    model = small_model(image_shape=(28, 28, 1))
    export_saved_model(model, str(base), version=1, verify=False)
    export_saved_model(model, str(base), version=2, verify=False,
                       class_names=[f"c{i}" for i in range(10)])
    return str(base)


def run(script, args, cwd):
    return subprocess.run(
        [sys.executable, script, *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


@pytest.mark.large
def test_predict_prints_classes_and_writes_reconstructions(export_dir, tmp_path):
    rng = np.random.default_rng(0)
    gray = rng.integers(0, 256, (28, 28), dtype=np.uint8)
    rgb = rng.integers(0, 256, (28, 28, 3), dtype=np.uint8)
    batch = rng.random((3, 28, 28, 1)).astype("float32")
    Image.fromarray(gray).save(tmp_path / "gray.png")
    Image.fromarray(rgb).save(tmp_path / "rgb.png")
    np.save(tmp_path / "one.npy", gray)
    np.save(tmp_path / "batch.npy", batch)
    files = ["gray.png", "rgb.png", "one.npy", "batch.npy"]
    # The export directory itself: its highest version (2, with names c0..c9) is used.
    result = run(
        PREDICT, [f"--model={export_dir}", "--reconstruction_dir=recon", *files], cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [LINE.match(line) for line in result.stdout.splitlines() if ": class " in line]
    names = [match["name"] for match in lines]
    batch_names = [f"batch.npy[{i}]" for i in range(3)]
    assert names == ["gray.png", "rgb.png", "one.npy", *batch_names]

    gray_rgb = np.asarray(Image.fromarray(rgb).convert("L"))
    images = np.concatenate(
        [np.stack([gray, gray_rgb, gray])[..., None] / np.float32(255), batch]
    ).astype("float32")
    loaded = tf.saved_model.load(os.path.join(export_dir, "2"))
    expected = loaded.signatures["serving_float"](images=tf.constant(images))
    for match, class_id, lengths in zip(
        lines, expected["class_ids"].numpy(), expected["probabilities"].numpy()
    ):
        assert int(match["id"]) == class_id and match["label"] == f"c{class_id}"
        assert float(match["p"]) == pytest.approx(lengths[class_id], abs=1e-4)

    written = sorted(os.listdir(tmp_path / "recon"))
    assert written == sorted(
        ["gray_reconstruction.png", "rgb_reconstruction.png", "one_reconstruction.png",
         "batch_0_reconstruction.png", "batch_1_reconstruction.png", "batch_2_reconstruction.png"]
    )
    picture = np.asarray(Image.open(tmp_path / "recon" / "batch_1_reconstruction.png"))
    assert picture.shape == (28, 28) and picture.dtype == np.uint8
    reference = np.rint(expected["reconstruction"].numpy()[4, ..., 0] * 255)
    assert np.abs(picture.astype(float) - reference).max() <= 1


@pytest.mark.large
def test_wrong_image_size_is_a_clear_error_without_traceback(export_dir, tmp_path):
    Image.fromarray(np.zeros((28, 28), np.uint8)).save(tmp_path / "good.png")
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(tmp_path / "cifar.png")
    result = run(
        PREDICT, [f"--model={os.path.join(export_dir, '1')}", "good.png", "cifar.png"],
        cwd=tmp_path,
    )
    assert result.returncode != 0
    assert "cifar.png: image is 32x32" in result.stderr
    assert "expected a 28x28 grayscale image" in result.stderr
    assert "Traceback" not in result.stderr
    assert ": class " not in result.stdout


@pytest.mark.large
def test_serving_benchmark_writes_json(export_dir, tmp_path):
    output = tmp_path / "benchmark.json"
    result = run(
        BENCHMARK,
        [f"--model={os.path.join(export_dir, '1')}", "--repeats=3", "--batch_size=4",
         "--warmup=1", f"--output={output}"],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(output.read_text())
    assert report["single_image_latency_ms"]["repeats"] == 3
    assert report["single_image_latency_ms"]["median"] > 0
    assert report["batch_throughput"]["batch_size"] == 4
    assert report["batch_throughput"]["images_per_second"] > 0
    assert report["size_on_disk"]["total_bytes"] > report["size_on_disk"]["variables_bytes"] > 0
    assert "images/s" in result.stdout
