"""examples/fashion_mnist_capsules.py: a user model built from the four layers."""

import importlib.util
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

from tests.conftest import REPO_ROOT

EXAMPLE = os.path.join(REPO_ROOT, "examples", "fashion_mnist_capsules.py")


def load_example():
    spec = importlib.util.spec_from_file_location("fashion_mnist_capsules", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_small_capsnet_for_another_size_trains_with_partial_batches():
    example = load_example()
    model = example.build_small_capsnet(
        (20, 24, 3), num_classes=5, conv_filters=8, primary_capsule_types=2,
        capsule_dim=4, decoder_units=(16,),
    )
    used = {type(layer).__name__ for layer in model.layers}
    assert {"PrimaryCapsule", "CapsuleLayer", "Length", "Mask"} <= used
    from capsnet_tf import MarginLoss, ReconstructionLoss

    model.compile(
        optimizer="adam",
        loss={"length": MarginLoss(), "reconstruction": ReconstructionLoss()},
        loss_weights={"length": 1.0, "reconstruction": 0.0005},
    )
    rng = np.random.default_rng(0)
    images = rng.random((10, 20, 24, 3)).astype("float32")
    labels = rng.integers(0, 5, 10).astype("int32")
    before = [w.numpy().copy() for w in model.trainable_weights]
    # 10 examples in batches of 4: the last batch holds 2.
    history = model.fit(
        {"image": images, "label": labels}, {"length": labels, "reconstruction": images},
        batch_size=4, epochs=1, verbose=0,
    )
    assert np.isfinite(history.history["loss"][0])
    assert all(not np.allclose(w.numpy(), b) for w, b in zip(model.trainable_weights, before))
    outputs = model.predict({"image": images, "label": np.zeros(10, "int32")}, batch_size=4,
                            verbose=0)
    assert outputs["length"].shape == (10, 5) and outputs["reconstruction"].shape == images.shape


@pytest.mark.large
def test_example_runs_and_its_model_reloads_in_a_fresh_process(tmp_path):
    # The example runs as a user would (its own process, a few steps), saves
    # the model as .keras with predictions; this process reloads and compares.
    script = textwrap.dedent(
        f"""
        import runpy
        import numpy as np
        example = runpy.run_path({EXAMPLE!r})
        results = example["main"](steps=3, batch_size=8, eval_examples=16)
        model = results["model"]
        images = np.random.default_rng(0).random((3, 32, 32, 1)).astype("float32")
        inputs = {{"image": images, "label": np.zeros(3, "int32")}}
        outputs = model.predict(inputs, verbose=0)
        model.save({str(tmp_path / "small.keras")!r})
        np.savez({str(tmp_path / "expected.npz")!r}, images=images, **outputs)
        print("SOURCE", results["source"], "LOSS", results["history"]["loss"][-1])
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
        timeout=300, env=dict(os.environ),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    source, loss = result.stdout.split("SOURCE ", 1)[1].split()[0::2]
    assert source in ("fashion_mnist", "random") and np.isfinite(float(loss))
    if os.environ.get("TFDS_DATA_DIR") and os.path.isdir(
        os.path.join(os.environ["TFDS_DATA_DIR"], "fashion_mnist")
    ):
        assert source == "fashion_mnist"

    import capsnet_tf  # noqa: F401  registers the layers: no custom_objects needed

    reloaded = keras.saving.load_model(tmp_path / "small.keras")
    expected = np.load(tmp_path / "expected.npz")
    images = expected["images"]
    outputs = reloaded.predict({"image": images, "label": np.zeros(3, "int32")}, verbose=0)
    np.testing.assert_allclose(outputs["length"], expected["length"], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(
        outputs["reconstruction"], expected["reconstruction"], rtol=1e-6, atol=1e-7
    )
    names = {type(layer).__name__ for layer in reloaded.layers}
    assert {"PrimaryCapsule", "CapsuleLayer", "Length", "Mask"} <= names
