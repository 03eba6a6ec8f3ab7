"""Deployment formats: quantized TFLite in LiteRT and ONNX in ONNX Runtime.

A small CapsNet is trained for a few hundred steps on real MNIST images,
exported by `experiments/export.py --tflite --quantize=dynamic,float16,int8
--onnx` (a subprocess), and each file is then run by its own runtime in a
fresh process (`python -c`, importing LiteRT or ONNX Runtime only) on 500
MNIST test images. The classes and probabilities come back as `.npy` files and
are compared here with the SavedModel's; the quantized models' accuracy is
computed on those labels, not assumed.
"""

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from capsnet_tf.config import ExperimentConfig
from capsnet_tf.data.pipeline import load_tfds_split
from capsnet_tf.deploy import QUANTIZATIONS, quantized_tflite_name
from capsnet_tf.losses import MarginLoss, ReconstructionLoss
from tests.conftest import REPO_ROOT
from tests.test_model import small_model

# Trains a model and runs every format in fresh processes: minutes.
pytestmark = pytest.mark.large

EXPORT = os.path.join(REPO_ROOT, "experiments", "export.py")
TEST_IMAGES = 500


def mnist_arrays(split, count):
    dataset, _ = load_tfds_split("mnist", f"{split}[:{count}]")
    images, labels = zip(*dataset.as_numpy_iterator(), strict=True)
    return np.stack(images), np.asarray(labels)


@pytest.fixture(scope="module")
def export_dir(tfds_data_dir, tmp_path_factory):
    """An export of a small CapsNet trained on 4,000 MNIST images, in every format."""
    keras.utils.set_random_seed(11)
    images, labels = mnist_arrays("train", 4000)
    floats = images.astype("float32") / 255.0
    model = small_model(image_shape=(28, 28, 1), conv_filters=16, conv_kernel_size=9,
                        primary_capsule_types=4, primary_capsule_dim=8, primary_kernel_size=9,
                        capsule_dim=8, decoder_units=(64, 128))
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss={"length": MarginLoss(), "reconstruction": ReconstructionLoss()},
        loss_weights={"length": 1.0, "reconstruction": 0.0005},
    )
    model.fit({"image": floats, "label": labels}, {"length": labels, "reconstruction": floats},
              batch_size=50, epochs=2, verbose=0)
    workdir = tmp_path_factory.mktemp("run")
    os.makedirs(workdir / "checkpoints")
    (workdir / "config.json").write_text(ExperimentConfig(dataset="mnist").to_json())
    (workdir / "model.json").write_text(json.dumps(model.get_config()))
    model.save_weights(workdir / "checkpoints" / "best.weights.h5")
    base = tmp_path_factory.mktemp("serving")
    result = subprocess.run(
        [sys.executable, EXPORT, f"--workdir={workdir}", f"--export_dir={base}", "--tflite",
         "--quantize=dynamic,float16,int8", "--calibration_examples=200", "--onnx"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return base / "1"


# Runs one file in its own runtime, in a process that imports neither
# TensorFlow nor capsnet_tf, and saves the classes and probabilities.
RUNNER = textwrap.dedent("""
    import sys
    import numpy as np
    path, images_path, out = sys.argv[1:4]
    images = np.load(images_path)
    if path.endswith(".onnx"):
        import onnxruntime
        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        names = [output.name for output in session.get_outputs()]
        values = session.run(None, {session.get_inputs()[0].name: images / np.float32(255)})
        outputs = dict(zip(names, values))
    else:
        from ai_edge_litert.interpreter import Interpreter
        interpreter = Interpreter(model_path=path)
        signatures = interpreter.get_signature_list()
        key = "serving_default" if "serving_default" in signatures else "serving_float"
        runner = interpreter.get_signature_runner(key)
        detail = runner.get_input_details()["images"]
        if key == "serving_default":
            inputs = images
        elif detail["dtype"] == np.uint8:
            scale, zero = detail["quantization"]
            inputs = np.round(images / (255 * scale) + zero).astype(np.uint8)
        else:
            inputs = images / np.float32(255)
        outputs = runner(images=inputs)
        scale, zero = runner.get_output_details()["probabilities"]["quantization"]
        if outputs["probabilities"].dtype != np.float32:
            outputs["probabilities"] = (outputs["probabilities"].astype(np.float32) - zero) * scale
    pick = lambda word: next(v for k, v in outputs.items() if k.split(":")[0].endswith(word))
    np.save(out + "_classes.npy", pick("class_ids"))
    np.save(out + "_probabilities.npy", pick("probabilities"))
    print("modules:", "tensorflow" in sys.modules, "capsnet_tf" in sys.modules)
""")


@pytest.fixture(scope="module")
def sample_images(tfds_data_dir, tmp_path_factory):
    images, labels = mnist_arrays("test", TEST_IMAGES)
    path = tmp_path_factory.mktemp("images") / "images.npy"
    np.save(path, images)
    return path, images, labels


def run_in_own_runtime(path, images_path, tmp_path):
    out = str(tmp_path / os.path.basename(path))
    result = subprocess.run([sys.executable, "-c", RUNNER, str(path), str(images_path), out],
                            cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "modules: False False" in result.stdout  # its own runtime, nothing else
    return np.load(out + "_classes.npy"), np.load(out + "_probabilities.npy")


@pytest.fixture(scope="module")
def saved_model_outputs(export_dir, sample_images):
    _, images, labels = sample_images
    outputs = tf.saved_model.load(str(export_dir)).signatures["serving_default"](
        images=tf.constant(images)
    )
    classes = outputs["class_ids"].numpy()
    assert np.mean(classes == labels) > 0.8, "the small model did not learn MNIST"
    return classes, outputs["probabilities"].numpy()


def test_no_tf_lite_interpreter_is_left_and_no_deprecation_warning_filtered(export_dir):
    """Every .tflite file here runs in LiteRT; nothing hides TensorFlow's deprecation warning."""
    assert sorted(name for name in os.listdir(export_dir) if name.startswith("model")) == [
        "model.onnx", "model.tflite", "model_dynamic.tflite", "model_float16.tflite",
        "model_int8.tflite",
    ]
    sources = []
    for root, folders, files in os.walk(REPO_ROOT):
        folders[:] = [f for f in folders if not f.startswith(".") and "venv" not in f]
        sources += [os.path.join(root, name) for name in files
                    if name.endswith((".py", ".cfg", ".toml", ".ini"))]
    for path in sources:
        if path == os.path.abspath(__file__):
            continue
        with open(path) as file:
            text = file.read()
        assert "tf.lite.Interpreter(" not in text, path
        assert "Interpreter is deprecated" not in text, path


@pytest.mark.parametrize("name", ["model.tflite", "model.onnx"])
def test_float_formats_give_the_saved_models_classes_and_probabilities(
    export_dir, sample_images, saved_model_outputs, tmp_path, name
):
    images_path, _, _ = sample_images
    classes, probabilities = run_in_own_runtime(export_dir / name, images_path, tmp_path)
    np.testing.assert_array_equal(classes, saved_model_outputs[0])
    np.testing.assert_allclose(probabilities, saved_model_outputs[1], atol=1e-5)


@pytest.mark.parametrize("mode", QUANTIZATIONS)
def test_quantized_models_are_smaller_and_their_accuracy_is_measured(
    export_dir, sample_images, saved_model_outputs, tmp_path, mode
):
    images_path, _, labels = sample_images
    path = export_dir / quantized_tflite_name(mode)
    float_size = os.path.getsize(export_dir / "model.tflite")
    expected_ratio = {"dynamic": 3.0, "float16": 1.8, "int8": 3.0}[mode]
    assert float_size / os.path.getsize(path) > expected_ratio
    classes, probabilities = run_in_own_runtime(path, images_path, tmp_path)
    float_accuracy = np.mean(saved_model_outputs[0] == labels)
    accuracy = np.mean(classes == labels)
    agreement = np.mean(classes == saved_model_outputs[0])
    # A small model on 500 images: the quantized model agrees with the float
    # one on nearly every image (the real model's figures are in docs/serving.md).
    assert agreement >= {"dynamic": 0.98, "float16": 0.99, "int8": 0.95}[mode], agreement
    assert accuracy >= float_accuracy - 0.03
    assert np.all((probabilities >= 0) & (probabilities <= 1.0 + 1e-6))


def test_int8_model_takes_and_returns_integers(export_dir):
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_path=str(export_dir / "model_int8.tflite")).get_signature_runner(
        "serving_float"
    )
    detail = runner.get_input_details()["images"]
    assert detail["dtype"] == np.uint8
    scale, zero = detail["quantization"]
    assert zero == 0 and scale == pytest.approx(1 / 255, rel=0.02)  # a pixel as it is
    assert runner.get_output_details()["probabilities"]["dtype"] == np.uint8


def test_flags_without_the_export_extra_stop_with_one_line(tmp_path):
    # sitecustomize makes the export packages unimportable in that process only.
    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent("""
        import sys
        for name in ("ai_edge_litert", "ai_edge_litert.interpreter", "tf2onnx", "onnxruntime"):
            sys.modules[name] = None
    """))
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    for flag in ("--onnx", "--quantize=int8"):
        result = subprocess.run(
            [sys.executable, EXPORT, f"--workdir={tmp_path}", f"--export_dir={tmp_path}/out",
             flag],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=env,
        )
        assert result.returncode == 1
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert lines[-1].startswith("error: ") and 'pip install -e ".[export]"' in lines[-1]
        assert "Traceback" not in result.stderr
        assert not (tmp_path / "out").exists()
