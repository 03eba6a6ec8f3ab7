"""The capsule layers, losses and CapsNet under Keras's JAX backend (issue 46), and PyTorch's.

Under TensorFlow the layers trace the TensorFlow forms of `capsnet_tf.kernels`;
under any other backend the first rows of its rules give forms written with
`keras.ops` alone. The tests here check that choice, the `keras.ops` forms
against the float64 references in this (TensorFlow) process, and, in a
process of their own with `KERAS_BACKEND=jax` (`tests/jax_backend_checks.py`),
the layers, a `model.fit` of the mnist.flags CapsNet and a `.keras` file
saved here. Those are skipped where JAX is not installed, unless
`CAPSNET_REQUIRE_JAX=1` (set by .ci/run), where they fail. The training and
`.keras` checks also run under PyTorch where it is installed (not in CI).
"""

import importlib.util
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from capsnet_tf import (
    CapsNet,
    CapsuleLayer,
    MarginLoss,
    PrimaryCapsule,
    ReconstructionLoss,
    cpu,
    dynamic_routing,
    kernels,
    squash,
)
from tests.conftest import REPO_ROOT
from tests.test_capsule_layer import make_layer, reference_routing
from tests.test_kernels import conv_reference
from tests.test_ops import numpy_squash
from tests.test_primary_capsule import reference_primary_capsules

HELPER = os.path.join(REPO_ROOT, "tests", "jax_backend_checks.py")


def run_under_jax(check, tmp_path, backend="jax", **given):
    """`tests/jax_backend_checks.py CHECK` with KERAS_BACKEND=jax: its arrays, by name.

    `backend="torch"` runs it under PyTorch instead, where it is installed
    (CI does not install it: docs/layers.md says why).
    """
    if importlib.util.find_spec(backend) is None:
        if backend == "torch":
            pytest.skip("PyTorch is not installed")
        message = 'JAX is not installed: pip install -e ".[jax]"'
        if os.environ.get("CAPSNET_REQUIRE_JAX") == "1":
            pytest.fail(message)
        pytest.skip(message)
    source, target = tmp_path / f"{check}_in.npz", tmp_path / f"{check}_out.npz"
    np.savez(source, **given)
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run(
        [sys.executable, HELPER, check, str(source), str(target)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stderr[-6000:]
    with np.load(target, allow_pickle=False) as data:
        return {key: data[key] for key in data.files}


# === The rule: another backend gets the keras.ops forms, asking nothing else ===


def _never(*_):
    raise AssertionError("asked, though the backend column decides")


@pytest.mark.parametrize(
    "device, padding, static, form",
    [
        ("cpu", "valid", True, "im2col_keras_ops"),
        ("cpu", "same", True, "conv"),
        ("cpu", "valid", False, "conv"),
        ("accelerator", "valid", True, "conv"),
    ],
)
def test_other_backends_get_the_keras_ops_convolution(monkeypatch, device, padding, static,
                                                      form):
    monkeypatch.setattr(cpu, "vector_unit", _never)
    for kernel_set in kernels.KERNEL_SETS:
        for dtype in ("float32", "bfloat16"):
            assert kernels.convolution_form(
                dtype, padding, static, kernels=kernel_set, device=device, backend="other"
            ) == form


def test_other_backends_route_the_whole_batch_with_keras_ops(monkeypatch):
    """Neither TensorFlow's devices, nor XLA contexts, nor kernel sets are asked."""
    monkeypatch.setattr(kernels, "backend_kind", lambda: "other")
    monkeypatch.setattr(cpu, "accelerated", _never)
    monkeypatch.setattr(kernels, "_in_xla_context", _never)
    for kernel_set in kernels.KERNEL_SETS:
        for training in (False, True):
            for return_couplings in (False, True):
                with kernels.use_kernels(kernel_set):
                    plan = kernels.routing_plan(
                        training=training, jit_compile=training,
                        return_couplings=return_couplings, iterations=3, chunk_size=16,
                    )
                assert plan == kernels.RoutingPlan("keras_ops", "whole", 1, 16)


def test_tensorflow_keeps_its_forms():
    """This process is TensorFlow's: the rows of issue 44 still decide."""
    assert kernels.backend_kind() == "tensorflow"
    assert kernels.routing_form(True, False, 3) == "xla"
    assert kernels.routing_form(False, True, 3) == "loop"
    assert kernels.routing_form(False, False, 3, backend="other") == "keras_ops"
    assert kernels.convolution_form("float32", device="cpu") != "im2col_keras_ops"


def test_other_backends_ask_keras_for_the_device(monkeypatch):
    monkeypatch.setattr(kernels, "backend_kind", lambda: "other")
    monkeypatch.setattr(cpu, "accelerated", _never)
    for devices, kind in ((["cpu:0"], "cpu"), (["gpu:0", "gpu:1"], "accelerator"),
                          (["tpu:0"], "accelerator")):
        monkeypatch.setattr(keras.distribution, "list_devices", lambda d=devices: d)
        assert kernels.device_kind() == kind


# === The keras.ops forms, computed here by TensorFlow, against the references ===


@pytest.mark.parametrize("iterations, leaky", [(1, False), (3, False), (3, True)])
def test_keras_ops_routing_matches_float64_reference_and_the_loops_gradients(
        monkeypatch, iterations, leaky):
    layer, inputs, kernel, bias = make_layer(iterations, leaky=leaky)
    expected, expected_couplings = reference_routing(inputs, kernel, bias, iterations, leaky)
    x = tf.constant(inputs)

    def values():
        with tf.GradientTape() as tape:
            tape.watch(x)
            outputs, couplings = layer(x, return_couplings=True)
            loss = tf.reduce_sum(outputs * tf.sin(outputs))
        return [outputs, couplings, *tape.gradient(loss, [x, layer.kernel])]

    loop_values = values()
    monkeypatch.setattr(kernels, "backend_kind", lambda: "other")
    got = values()
    # The reference has no epsilon in |s|: hence the tolerance.
    np.testing.assert_allclose(got[0].numpy(), expected, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(got[1].numpy(), expected_couplings, rtol=1e-6, atol=1e-8)
    # The same formulas as the TensorFlow loop, values and gradients through every iteration.
    for value, want in zip(got, loop_values):
        np.testing.assert_allclose(value.numpy(), want.numpy(), rtol=1e-10, atol=1e-12)
    # A tensor number of iterations runs in keras.ops.fori_loop.
    votes = np.einsum("bid,ijde->bjie", inputs, kernel)
    looped = dynamic_routing(votes, bias, tf.constant(iterations), leaky)
    np.testing.assert_allclose(looped.numpy(), loop_values[0].numpy(), rtol=1e-10, atol=1e-12)


def test_keras_ops_convolution_matches_float64_values_and_gradients():
    rng = np.random.default_rng(0)
    for (height, width), kernel_size, strides in (((12, 12), 5, 2), ((13, 10), 3, 1),
                                                  ((20, 20), 9, 2)):
        x64 = rng.normal(size=(2, height, width, 3))
        w64 = rng.normal(size=(kernel_size, kernel_size, 3, 4))
        out_h = (height - kernel_size) // strides + 1
        out_w = (width - kernel_size) // strides + 1
        upstream = rng.normal(size=(2, out_h, out_w, 4))
        inputs, kernel = tf.constant(x64), tf.constant(w64)
        with tf.GradientTape() as tape:
            tape.watch([inputs, kernel])
            outputs = kernels.keras_ops_conv_as_matmul(inputs, kernel, strides)
            loss = tf.reduce_sum(outputs * upstream)
        got = [outputs, *tape.gradient(loss, [inputs, kernel])]
        for g, w in zip(got, conv_reference(x64, w64, upstream, strides)):
            np.testing.assert_allclose(g.numpy(), w, rtol=1e-12, atol=1e-12)


# === Under KERAS_BACKEND=jax, in a process of its own ===


def test_layers_and_losses_match_float64_references_under_jax(tmp_path):
    """The float64 routing reference of tests/test_capsule_layer.py, and every layer, on JAX."""
    given = {}
    cases = {"plain1": (1, False), "plain3": (3, False), "leaky3": (3, True), "leaky2": (2, True)}
    for seed, (name, (iterations, leaky)) in enumerate(cases.items()):
        _, inputs, kernel, bias = make_layer(iterations, leaky=leaky, seed=seed)
        given.update({f"{name}_inputs": inputs, f"{name}_kernel": kernel, f"{name}_bias": bias,
                      f"{name}_iterations": iterations, f"{name}_leaky": leaky})
    rng = np.random.default_rng(7)
    given.update(
        primary_inputs=rng.normal(size=(2, 11, 11, 3)),
        primary_kernel=rng.normal(scale=0.3, size=(5, 5, 3, 6)),
        primary_bias=rng.normal(scale=0.1, size=(6,)),
        capsules=rng.normal(size=(4, 5, 3)),
        labels=np.array([0, 3, 4, 1]),
        lengths=rng.uniform(size=(4, 5)),
        images=rng.uniform(size=(4, 6, 6, 1)),
        reconstructions=rng.uniform(size=(4, 6, 6, 1)),
    )
    got = run_under_jax("reference", tmp_path, **given)

    close = dict(rtol=1e-10, atol=1e-12)
    for name, (iterations, leaky) in cases.items():
        inputs, kernel = given[f"{name}_inputs"], given[f"{name}_kernel"]
        expected, couplings = reference_routing(inputs, kernel, given[f"{name}_bias"],
                                                iterations, leaky)
        # The reference has no epsilon in |s|: hence its tolerance.
        np.testing.assert_allclose(got[f"{name}_outputs"], expected, rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(got[f"{name}_couplings"], couplings, rtol=1e-6, atol=1e-8)
        # TensorFlow's layer: the same formulas, values and gradients through every
        # iteration (JAX's autodiff of the unrolled routing, TensorFlow's of its loop).
        layer = CapsuleLayer(3, 5, routing_iterations=iterations, leaky_routing=leaky,
                             dtype="float64")
        layer.build((None,) + inputs.shape[1:])
        layer.set_weights([kernel, given[f"{name}_bias"]])
        x = tf.constant(inputs)
        with tf.GradientTape() as tape:
            tape.watch(x)
            outputs, tf_couplings = layer(x, return_couplings=True)
            loss = tf.reduce_sum(outputs * tf.sin(outputs))
        input_gradient, kernel_gradient = tape.gradient(loss, [x, layer.kernel])
        for key in ("outputs", "training_outputs", "fori_loop"):
            np.testing.assert_allclose(got[f"{name}_{key}"], outputs, **close, err_msg=key)
        np.testing.assert_allclose(got[f"{name}_couplings"], tf_couplings, **close)
        np.testing.assert_allclose(got[f"{name}_input_gradient"], input_gradient, **close)
        np.testing.assert_allclose(got[f"{name}_kernel_gradient"], kernel_gradient, **close)
        assert np.abs(kernel_gradient.numpy()).max() > 1e-3

    x, kernel, bias = given["primary_inputs"], given["primary_kernel"], given["primary_bias"]
    np.testing.assert_allclose(
        got["primary_valid"], reference_primary_capsules(x, kernel, bias, 2, 3, 2, False),
        rtol=1e-6, atol=1e-9)
    for padding in ("valid", "same"):  # im2col_keras_ops, then keras.ops.conv
        layer = PrimaryCapsule(2, 3, kernel_size=5, strides=2, padding=padding, dtype="float64")
        layer.build(x.shape)
        layer.set_weights([kernel, bias])
        inputs = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            outputs = layer(inputs)
            loss = tf.reduce_sum(outputs * tf.sin(outputs))
        gradients = tape.gradient(loss, [inputs, layer.kernel])
        np.testing.assert_allclose(got[f"primary_{padding}"], outputs, **close)
        np.testing.assert_allclose(got[f"primary_{padding}_input_gradient"], gradients[0], **close)
        np.testing.assert_allclose(got[f"primary_{padding}_kernel_gradient"], gradients[1],
                                   **close)

    capsules, labels = given["capsules"], given["labels"]
    norms = np.sqrt((capsules**2).sum(-1) + keras.config.epsilon())
    np.testing.assert_allclose(got["squash"], squash(tf.constant(capsules)), rtol=1e-12)
    np.testing.assert_allclose(got["squash"], numpy_squash(capsules), atol=1e-7)  # epsilon
    np.testing.assert_allclose(got["length"], norms, rtol=1e-12)
    one_hot = np.eye(5)[norms.argmax(-1)]
    np.testing.assert_array_equal(got["mask_longest"], capsules * one_hot[..., None])
    np.testing.assert_array_equal(got["mask_labels"], capsules * np.eye(5)[labels][..., None])
    lengths, targets = given["lengths"], np.eye(5)[labels]
    per_class = (targets * np.maximum(0, 0.9 - lengths) ** 2
                 + 0.5 * (1 - targets) * np.maximum(0, lengths - 0.1) ** 2)
    np.testing.assert_allclose(got["margin_loss"], per_class.sum(-1), rtol=1e-6)
    np.testing.assert_allclose(got["margin_loss_official"], 0.5 * per_class.mean(-1), rtol=1e-6)
    np.testing.assert_allclose(
        got["reconstruction_loss"],
        ((given["images"] - given["reconstructions"]) ** 2).reshape(4, -1).sum(-1), rtol=1e-6)


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_mnist_flags_capsnet_trains_three_steps_and_predicts_under_jax(tmp_path, backend):
    rng = np.random.default_rng(0)
    images = rng.uniform(size=(24, 28, 28, 1)).astype("float32")
    labels = rng.integers(0, 10, size=24).astype("int32")
    got = run_under_jax("train", tmp_path, backend, images=images, labels=labels)
    assert str(got["backend"]) == backend
    if backend == "jax":
        assert bool(got["jit_compile"])  # the step compiled by JAX: no TensorFlow op inside
    assert int(got["steps"]) == 3
    assert int(got["params"]) == 8_215_728  # the paper's model, as PRESETS["mnist"]
    assert "('routing_iterations', 3)" in str(got["options"])
    assert np.isfinite(got["loss"]).all()
    assert got["weights_changed"].all()  # every weight trained, the routing's included
    assert got["lengths"].shape == (24, 10) and got["reconstructions"].shape == (24, 28, 28, 1)
    assert np.isfinite(got["lengths"]).all() and (got["lengths"] < 1).all()


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_keras_file_saved_under_tensorflow_gives_the_same_outputs_under_jax(tmp_path, backend):
    """Capsule lengths, capsules and reconstructions within 1e-5 (float32 on both)."""
    keras.utils.set_random_seed(3)
    model = CapsNet.from_preset("mnist", name="capsnet")
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3, epsilon=1e-8),
        loss={"length": MarginLoss(), "reconstruction": ReconstructionLoss()},
        loss_weights={"length": 1.0, "reconstruction": 0.0005},
    )
    rng = np.random.default_rng(1)
    images = rng.uniform(size=(16, 28, 28, 1)).astype("float32")
    labels = rng.integers(0, 10, size=16).astype("int32")
    # Two steps, so the weights are not the initializers' and the file holds Adam's state.
    model.fit({"image": images, "label": labels}, {"length": labels, "reconstruction": images},
              batch_size=8, verbose=0)
    path = tmp_path / "capsnet.keras"
    model.save(path)
    outputs = model({"image": images, "label": labels}, training=False)
    capsules = model.inference_model()(images)["capsules"]

    got = run_under_jax("load", tmp_path, backend, path=str(path), images=images, labels=labels)
    assert str(got["backend"]) == backend
    for key, want in (("lengths", outputs["length"]), ("capsules", capsules),
                      ("reconstructions", outputs["reconstruction"])):
        difference = np.abs(got[key] - np.asarray(want)).max()
        print(f"{key}: largest difference TensorFlow - {backend} {difference:.2e}")
        assert difference < 1e-5, (key, difference)
