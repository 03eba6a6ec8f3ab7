"""Serving: the SavedModel export, its signatures, TFLite, the export script."""

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from capsnet_tf import CapsNet
from capsnet_tf.config import ExperimentConfig
from capsnet_tf.deploy import litert_interpreter
from capsnet_tf.export import (
    DATASET_CLASS_NAMES,
    ExportExistsError,
    convert_to_tflite,
    export_saved_model,
    load_metadata,
)
from tests.conftest import REPO_ROOT
from tests.test_model import small_model

EXPORT_SCRIPT = os.path.join(REPO_ROOT, "experiments", "export.py")
OUTPUT_NAMES = {"probabilities", "class_ids", "capsules", "reconstruction"}



def mnist_sized_model(**kwargs):
    """A tiny CapsNet for 28x28x1 images (288 primary capsules, 10 x 6-D class capsules)."""
    return small_model(image_shape=(28, 28, 1), **kwargs)


def uint8_images(size, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (size, 28, 28, 1), dtype=np.uint8)


def make_workdir(path, model, dataset="mnist"):
    """A training work directory as `train_and_evaluate` leaves it."""
    os.makedirs(os.path.join(path, "checkpoints"))
    with open(os.path.join(path, "config.json"), "w") as file:
        file.write(ExperimentConfig(dataset=dataset).to_json())
    with open(os.path.join(path, "model.json"), "w") as file:
        json.dump(model.get_config(), file)
    model.save_weights(os.path.join(path, "checkpoints", "best.weights.h5"))
    return path


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(model, inference model, version directory, loaded SavedModel) of a tiny export."""
    keras.utils.set_random_seed(42)
    model = mnist_sized_model()
    base = tmp_path_factory.mktemp("serving")
    path = export_saved_model(model, str(base), metadata={"note": "test"})
    return model, model.inference_model(), path, tf.saved_model.load(path)


def test_signatures_match_the_keras_model_for_any_batch_size(exported):
    _, inference, path, loaded = exported
    assert set(loaded.signatures) == {"serving_default", "serving_float", "decode"}
    serve = loaded.signatures["serving_default"]
    spec = serve.structured_input_signature[1]["images"]
    assert spec.shape.as_list() == [None, 28, 28, 1] and spec.dtype == tf.uint8
    for size in (1, 3, 7):
        pixels = uint8_images(size, seed=size)
        expected = inference(pixels.astype("float32") / 255.0)
        for name, images in (
            ("serving_default", pixels),
            ("serving_float", pixels.astype("float32") / 255.0),
        ):
            outputs = loaded.signatures[name](images=tf.constant(images))
            assert set(outputs) == OUTPUT_NAMES
            np.testing.assert_allclose(outputs["probabilities"], expected["length"], atol=1e-6)
            np.testing.assert_allclose(outputs["capsules"], expected["capsules"], atol=1e-6)
            np.testing.assert_allclose(
                outputs["reconstruction"], expected["reconstruction"], atol=1e-6
            )
            assert outputs["class_ids"].dtype == tf.int32
            np.testing.assert_array_equal(
                outputs["class_ids"], np.argmax(expected["length"], axis=-1)
            )
            assert outputs["reconstruction"].shape == (size, 28, 28, 1)


def serving_ops(loaded, scope=""):
    """The op types of `serving_float`'s graph and its functions, of nodes named with `scope`."""
    graph = loaded.signatures["serving_float"].graph.as_graph_def()
    nodes = [*graph.node, *(node for function in graph.library.function
                            for node in function.node_def)]
    return {node.op for node in nodes if scope in node.name}


def test_export_has_portable_forms_unless_asked_for_this_machines(exported, tmp_path):
    """PrimaryCaps stays a Conv2D and the batch is routed in one loop; both match Keras."""
    from capsnet_tf.kernels import device_kind

    model, inference, path, loaded = exported
    assert load_metadata(path)["kernels"] == "portable"
    primary = serving_ops(loaded, "primary_capsules")
    assert "Conv2D" in primary and "GatherV2" not in primary
    assert "While" not in serving_ops(loaded)  # no chunk loop (the routing's is stateless)
    here = export_saved_model(model, str(tmp_path), kernels="this_machine")
    assert load_metadata(here)["kernels"] == "this_machine"
    here = tf.saved_model.load(here)
    if device_kind() == "cpu":  # this CPU's forms: im2col and inference in chunks
        assert "GatherV2" in serving_ops(here, "primary_capsules")
        assert "While" in serving_ops(here)
    pixels = uint8_images(5, seed=3)
    expected = inference(pixels.astype("float32") / 255.0)
    for exported_model in (loaded, here):
        outputs = exported_model.signatures["serving_default"](images=tf.constant(pixels))
        np.testing.assert_allclose(outputs["probabilities"], expected["length"], atol=1e-5)
        np.testing.assert_allclose(outputs["capsules"], expected["capsules"], atol=1e-5)
    with pytest.raises(ValueError, match="kernels"):
        export_saved_model(model, str(tmp_path), version=2, kernels="fastest")
    assert not os.path.exists(tmp_path / "2")


def test_decode_masks_all_but_the_given_class(exported):
    model, _, _, loaded = exported
    pixels = uint8_images(4, seed=1)
    outputs = loaded.signatures["serving_default"](images=tf.constant(pixels))
    capsules, class_ids = outputs["capsules"].numpy(), outputs["class_ids"].numpy()
    decode = loaded.signatures["decode"]
    # Decoding the predicted class reproduces serving_default's reconstruction ...
    decoded = decode(capsules=tf.constant(capsules), class_ids=tf.constant(class_ids))
    np.testing.assert_allclose(decoded["reconstruction"], outputs["reconstruction"], atol=1e-6)
    # ... whatever the other capsules hold (unmasked or already masked input),
    perturbed = capsules + 0.5
    rows = np.arange(4)
    perturbed[rows, class_ids] = capsules[rows, class_ids]
    again = decode(capsules=tf.constant(perturbed), class_ids=tf.constant(class_ids))
    np.testing.assert_allclose(again["reconstruction"], outputs["reconstruction"], atol=1e-6)
    # ... and equals the Keras decoder on the masked capsules; a capsule-dimension
    # perturbation changes the drawing.
    other = (class_ids + 1) % 10
    mask = np.eye(10, dtype="float32")[other][..., None]
    expected = model.get_layer("decoder")(capsules * mask)
    result = decode(capsules=tf.constant(capsules), class_ids=tf.constant(other))
    np.testing.assert_allclose(result["reconstruction"], expected, atol=1e-6)
    tweaked = capsules.copy()
    tweaked[rows, class_ids, 0] += 0.25
    changed = decode(capsules=tf.constant(tweaked), class_ids=tf.constant(class_ids))
    assert np.abs(changed["reconstruction"] - outputs["reconstruction"]).max() > 1e-4


def test_predict_function_accepts_rank_3_and_float_images(exported):
    _, inference, _, loaded = exported
    pixels = uint8_images(2, seed=2)
    expected = inference(pixels.astype("float32") / 255.0)["length"]
    scaled = pixels / np.float32(255)
    for images in (pixels, pixels[..., 0], scaled, scaled[..., 0]):
        result = loaded.predict(tf.constant(images))
        np.testing.assert_allclose(result["probabilities"], expected, atol=1e-6)


def test_assets_describe_input_format_and_classes(exported):
    _, _, path, loaded = exported
    labels_path = loaded.labels_file.asset_path.numpy().decode()
    assert labels_path == os.path.join(path, "assets", "labels.txt")
    assert open(labels_path).read().splitlines() == [str(i) for i in range(10)]
    metadata = load_metadata(path)
    assert metadata == json.load(open(loaded.metadata_file.asset_path.numpy().decode()))
    assert metadata["image_shape"] == [28, 28, 1] and metadata["class_names"][3] == "3"
    assert "uint8 in [0, 255]" in metadata["input_format"]
    default = metadata["signatures"]["serving_default"]
    assert default["inputs"]["images"] == {
        "dtype": "uint8",
        "shape": [-1, 28, 28, 1],
        "description": default["inputs"]["images"]["description"],
    }
    assert set(default["outputs"]) == OUTPUT_NAMES
    assert set(metadata["signatures"]["decode"]["inputs"]) == {"capsules", "class_ids"}
    assert metadata["source"] == {"note": "test"} and metadata["version"] == 1
    readme = open(os.path.join(path, "assets", "README.txt")).read()
    assert "decode(capsules float32 [-1, 10, 6], class_ids int32 [-1])" in readme


@pytest.mark.large
def test_loads_and_runs_with_tensorflow_only_and_refuses_bad_inputs(exported, tmp_path):
    _, inference, path, _ = exported
    pixels = uint8_images(3, seed=3)
    expected = inference(pixels.astype("float32") / 255.0)
    np.save(tmp_path / "images.npy", pixels)
    for name in ("length", "capsules", "reconstruction"):
        np.save(tmp_path / f"{name}.npy", expected[name].numpy())
    script = textwrap.dedent(
        f"""
        import importlib.util, json, sys
        import numpy as np
        import tensorflow as tf

        importable = importlib.util.find_spec("capsnet_tf") is not None
        if importable:  # installed site-wide: hide it, the check is about the SavedModel
            class _Hide:
                @staticmethod
                def find_spec(name, path=None, target=None):
                    if name.split(".")[0] == "capsnet_tf":
                        raise ImportError("hidden")
            sys.meta_path.insert(0, _Hide)
        try:
            import capsnet_tf
            sys.exit("capsnet_tf is importable")
        except ImportError:
            pass
        loaded = tf.saved_model.load({path!r})
        images = np.load("images.npy")
        out = loaded.signatures["serving_default"](images=tf.constant(images))
        report = {{"installed": importable, "errors": {{}}}}
        for key, name in (("probabilities", "length"), ("capsules", "capsules"),
                          ("reconstruction", "reconstruction")):
            report[key] = float(np.abs(out[key].numpy() - np.load(name + ".npy")).max())
        decoded = loaded.signatures["decode"](capsules=out["capsules"], class_ids=out["class_ids"])
        report["decode"] = float(np.abs(decoded["reconstruction"] - out["reconstruction"]).max())
        bad = {{
            "channels": ("serving_default", dict(images=np.zeros((2, 28, 28, 3), np.uint8))),
            "rank3": ("serving_default", dict(images=np.zeros((2, 28, 28), np.uint8))),
            "size": ("serving_default", dict(images=np.zeros((2, 27, 28, 1), np.uint8))),
            "dtype": ("serving_default", dict(images=np.zeros((2, 28, 28, 1), np.float32))),
            "range": ("serving_float", dict(images=np.full((2, 28, 28, 1), 255, np.float32))),
            "class_ids": ("decode", dict(capsules=np.zeros((2, 10, 6), np.float32),
                                         class_ids=np.array([1, 10], np.int32))),
            "capsules": ("decode", dict(capsules=np.zeros((2, 10, 5), np.float32),
                                        class_ids=np.array([1, 2], np.int32))),
        }}
        for case, (name, inputs) in bad.items():
            try:
                loaded.signatures[name](**{{k: tf.constant(v) for k, v in inputs.items()}})
                report["errors"][case] = None
            except Exception as error:
                report["errors"][case] = str(error)
        report["modules"] = sorted(m for m in sys.modules if m.startswith("capsnet_tf"))
        print("REPORT" + json.dumps(report))
        """
    )
    result = subprocess.run(
        [sys.executable, "-I", "-c", script],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.split("REPORT", 1)[1])
    assert report["modules"] == []
    for key in ("probabilities", "capsules", "reconstruction", "decode"):
        assert report[key] <= 1e-6, (key, report[key])
    errors = report["errors"]
    assert all(errors.values()), errors
    expected_images = "expects uint8 images of shape [batch, 28, 28, 1]"
    assert expected_images in errors["channels"] and "[2 28 28 3]" in errors["channels"]
    assert expected_images in errors["rank3"] and "[2 28 28]" in errors["rank3"]
    assert expected_images in errors["size"] and "[2 27 28 1]" in errors["size"]
    assert "expected to be a uint8 tensor but is a float tensor" in errors["dtype"]
    assert "expects float32 pixel values in [0, 1]" in errors["range"]
    assert "expects class_ids in [0, 10)" in errors["class_ids"]
    assert "expects float32 capsules of shape [batch, 10, 6]" in errors["capsules"]


@pytest.mark.large
def test_saved_model_cli_run_gives_the_same_predictions(exported, tmp_path):
    _, _, path, loaded = exported
    pixels = uint8_images(2, seed=4)
    np.save(tmp_path / "images.npy", pixels)
    result = subprocess.run(
        ["saved_model_cli", "run", "--dir", path, "--tag_set", "serve",
         "--signature_def", "serving_default", "--inputs", f"images={tmp_path / 'images.npy'}",
         "--outdir", str(tmp_path / "out")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    expected = loaded.signatures["serving_default"](images=tf.constant(pixels))
    for name in OUTPUT_NAMES:
        np.testing.assert_allclose(
            np.load(tmp_path / "out" / f"{name}.npy"), expected[name].numpy(), atol=1e-6
        )


@pytest.mark.large
def test_existing_version_is_refused_and_nothing_is_destroyed(tmp_path, monkeypatch):
    first, second = mnist_sized_model(), mnist_sized_model()
    base = str(tmp_path / "serving")
    path = export_saved_model(first, base, verify=False)
    saved = open(os.path.join(path, "saved_model.pb"), "rb").read()
    with pytest.raises(ExportExistsError, match=r"already holds a SavedModel.*--overwrite"):
        export_saved_model(second, base, verify=False)
    assert open(os.path.join(path, "saved_model.pb"), "rb").read() == saved
    assert sorted(os.listdir(base)) == ["1"]  # no staging directory left behind

    # A failing export with overwrite=True keeps the old version.
    def fail(*args):
        raise RuntimeError("simulated failure")

    monkeypatch.setattr("capsnet_tf.export._verify", fail)
    with pytest.raises(RuntimeError, match="simulated"):
        export_saved_model(second, base, overwrite=True, tflite=True)
    monkeypatch.undo()
    assert sorted(os.listdir(base)) == ["1"]
    assert open(os.path.join(path, "saved_model.pb"), "rb").read() == saved

    # Another version sits next to it; overwrite=True replaces version 1.
    export_saved_model(second, base, version=2, verify=False)
    export_saved_model(second, base, overwrite=True, verify=False)
    assert sorted(os.listdir(base)) == ["1", "2"]
    pixels = uint8_images(2)
    new = tf.saved_model.load(path).signatures["serving_default"](images=tf.constant(pixels))
    expected = second.inference_model()(pixels.astype("float32") / 255.0)["length"]
    np.testing.assert_allclose(new["probabilities"], expected, atol=1e-6)

    # Other occupants and bad versions are refused too.
    os.makedirs(os.path.join(base, "3"))
    open(os.path.join(base, "3", "notes.txt"), "w").close()
    with pytest.raises(ExportExistsError, match="already holds 1 file"):
        export_saved_model(second, base, version=3)
    with pytest.raises(ValueError, match="positive integer"):
        export_saved_model(second, base, version=0)
    with pytest.raises(ValueError, match="class_names"):
        export_saved_model(second, base, version=4, class_names=["a", "b"])


def test_classifier_without_decoder_exports_without_decode():
    model = mnist_sized_model(reconstruction=False)
    import tempfile

    with tempfile.TemporaryDirectory() as base:
        loaded = tf.saved_model.load(export_saved_model(model, base))
        assert set(loaded.signatures) == {"serving_default", "serving_float"}
        outputs = loaded.signatures["serving_default"](images=tf.constant(uint8_images(2)))
        assert set(outputs) == {"probabilities", "class_ids", "capsules"}
        assert "decode" not in load_metadata(os.path.join(base, "1"))["signatures"]


def test_tflite_agrees_with_the_saved_model(exported, tmp_path):
    _, _, path, loaded = exported
    flatbuffer = convert_to_tflite(path, str(tmp_path / "model.tflite"))
    assert os.path.getsize(tmp_path / "model.tflite") == len(flatbuffer)
    interpreter = litert_interpreter(model_content=flatbuffer)
    assert set(interpreter.get_signature_list()) == {"serving_default", "serving_float", "decode"}
    pixels = uint8_images(5, seed=5)
    expected = loaded.signatures["serving_default"](images=tf.constant(pixels))
    runner = interpreter.get_signature_runner("serving_default")
    actual = runner(images=pixels)
    for name in ("probabilities", "capsules", "reconstruction"):
        np.testing.assert_allclose(actual[name], expected[name].numpy(), atol=1e-5)
    np.testing.assert_array_equal(actual["class_ids"], expected["class_ids"].numpy())
    floats = interpreter.get_signature_runner("serving_float")(images=pixels / np.float32(255))
    np.testing.assert_allclose(floats["probabilities"], expected["probabilities"], atol=1e-5)
    decoded = interpreter.get_signature_runner("decode")(
        capsules=expected["capsules"].numpy(), class_ids=expected["class_ids"].numpy()
    )
    np.testing.assert_allclose(decoded["reconstruction"], expected["reconstruction"], atol=1e-5)


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_inference_model_compiles_for_any_batch_size(policy):
    keras.config.set_dtype_policy(policy)
    model = CapsNet(
        image_shape=(12, 12, 1), conv_filters=8, conv_kernel_size=3, primary_capsule_types=2,
        primary_capsule_dim=4, primary_kernel_size=3, capsule_dim=6, decoder_units=(16,),
    )
    inference = model.inference_model()
    images = np.random.default_rng(0).random((7, 12, 12, 1)).astype("float32")
    eager = inference(images)
    tolerance = 1e-5 if policy == "float32" else 2e-2
    # XLA compiles once per batch size; plain tf.function retraces too.
    for jit_compile in (False, True) if policy == "float32" else (True,):
        compiled = tf.function(lambda x: inference(x, training=False), jit_compile=jit_compile)
        for size in (1, 3, 7) if policy == "float32" else (1, 7):
            outputs = compiled(images[:size])
            assert outputs["length"].dtype == tf.float32
            assert outputs["reconstruction"].dtype == tf.float32
            for name in ("length", "capsules", "reconstruction"):
                actual = tf.cast(outputs[name], tf.float32).numpy()
                assert actual.shape[0] == size and np.all(np.isfinite(actual))
                np.testing.assert_allclose(
                    actual, tf.cast(eager[name][:size], tf.float32).numpy(), atol=tolerance
                )


@pytest.mark.large
def test_export_script_writes_a_servable_version_and_refuses_to_overwrite(tmp_path):
    model = mnist_sized_model(name="capsnet")
    workdir = make_workdir(str(tmp_path / "run"), model, dataset="fashion_mnist")
    export_dir = str(tmp_path / "serving")
    command = [sys.executable, EXPORT_SCRIPT, f"--workdir={workdir}", f"--export_dir={export_dir}"]
    result = subprocess.run(
        command + ["--version=3", "--tflite"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    version = os.path.join(export_dir, "3")
    assert os.path.exists(os.path.join(version, "saved_model.pb"))
    assert os.path.getsize(os.path.join(version, "model.tflite")) > 100_000
    metadata = load_metadata(version)
    assert metadata["class_names"] == DATASET_CLASS_NAMES["fashion_mnist"]
    assert metadata["source"]["workdir"] == os.path.abspath(workdir)
    assert metadata["source"]["checkpoint"] == "checkpoints/best.weights.h5"
    assert metadata["kernels"] == "portable"  # unless --kernels=this_machine
    loaded = tf.saved_model.load(version)
    pixels = uint8_images(2)
    expected = model.inference_model()(pixels.astype("float32") / 255.0)["length"]
    np.testing.assert_allclose(
        loaded.signatures["serving_default"](images=tf.constant(pixels))["probabilities"],
        expected, atol=1e-6,
    )

    before = open(os.path.join(version, "saved_model.pb"), "rb").read()
    refused = subprocess.run(
        command + ["--version=3"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600
    )
    assert refused.returncode != 0
    assert "already holds a SavedModel" in refused.stderr and "--overwrite" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert open(os.path.join(version, "saved_model.pb"), "rb").read() == before
    assert sorted(os.listdir(export_dir)) == ["3"]
