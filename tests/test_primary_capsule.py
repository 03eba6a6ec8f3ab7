"""PrimaryCapsule against an explicit-loop NumPy convolution."""

import numpy as np
import pytest

from capsnet_tf import PrimaryCapsule
from tests.layer_test_case import run_layer_test
from tests.test_ops import numpy_squash


def reference_primary_capsules(x, kernel, bias, types, dim, stride, official):
    batch, height, width, _ = x.shape
    size = kernel.shape[0]
    out_h, out_w = (height - size) // stride + 1, (width - size) // stride + 1
    conv = np.zeros((batch, out_h, out_w, kernel.shape[-1]))
    for r in range(out_h):
        for c in range(out_w):
            patch = x[:, r * stride : r * stride + size, c * stride : c * stride + size, :]
            conv[:, r, c] = np.einsum("bhwc,hwcf->bf", patch, kernel)
    if official:
        conv = conv / types
    conv = conv + bias
    capsules = np.zeros((batch, types * out_h * out_w, dim))
    for t in range(types):  # type-major order: (type, row, column)
        for r in range(out_h):
            for c in range(out_w):
                position = t * out_h * out_w + r * out_w + c
                capsules[:, position] = conv[:, r, c, t * dim : (t + 1) * dim]
    return numpy_squash(capsules)


def test_baseline_checks(tmp_path):
    run_layer_test(
        PrimaryCapsule,
        {"num_capsule_types": 4, "capsule_dim": 8, "kernel_size": 9, "strides": 2},
        np.random.default_rng(0).random((2, 20, 20, 16)).astype("float32"),
        expected_output_shape=(2, 4 * 6 * 6, 8),
        expected_trainable_weight_shapes={"kernel": (9, 9, 16, 32), "bias": (32,)},
        tmp_path=tmp_path,
    )


def test_paper_shapes_give_1152_capsules():
    layer = PrimaryCapsule()
    assert layer.compute_output_shape((None, 20, 20, 256)) == (None, 1152, 8)
    assert PrimaryCapsule(padding="same").compute_output_shape((None, 20, 20, 256)) == (
        None,
        32 * 10 * 10,
        8,
    )


@pytest.mark.parametrize("official", [False, True])
def test_matches_numpy_reference(official):
    rng = np.random.default_rng(1)
    layer = PrimaryCapsule(
        2, 4, kernel_size=3, strides=2, official_scaling=official, dtype="float64"
    )
    layer.build((None, 7, 7, 3))
    kernel, bias = rng.normal(size=(3, 3, 3, 8)), rng.normal(size=(8,))
    layer.set_weights([kernel, bias])
    x = rng.normal(size=(2, 7, 7, 3))
    expected = reference_primary_capsules(x, kernel, bias, 2, 4, 2, official)
    np.testing.assert_allclose(layer(x).numpy(), expected, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_capsule_types": 0}, "num_capsule_types"),
        ({"capsule_dim": -8}, "capsule_dim"),
        ({"padding": "full"}, "padding"),
    ],
)
def test_invalid_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PrimaryCapsule(**kwargs)


@pytest.mark.parametrize(
    "size, kernel_size, strides",
    [(12, 5, 2), (10, 4, 2), (20, 9, 2), (9, 3, 1), (11, 3, 3), ((13, 10), 5, 2)],
)
@pytest.mark.parametrize(
    "dtype, input_gradient, unit",
    [("float64", "col2im", None), ("float64", "backprop_input", None),
     ("bfloat16", "col2im", None), ("bfloat16", "col2im", "amx"),
     ("bfloat16", "backprop_input", None), ("bfloat16", None, "real")],
)
def test_matmul_convolution_values_and_gradients_match_float64(
    size, kernel_size, strides, dtype, input_gradient, unit, monkeypatch
):
    """im2col + matmul equals the float64 convolution, values and both gradients.

    Both forms of the input gradient run on every CPU (each is the default on
    one kind), so does AMX's transposed bfloat16 product (`unit="amx"`), and
    so does the default the layer picks on this CPU (`None`, `"real"`).
    """
    import tensorflow as tf

    from capsnet_tf import cpu
    from capsnet_tf.layers.primary_capsule import _valid_conv_as_matmul

    if unit != "real":
        monkeypatch.setattr(cpu, "bfloat16_unit", lambda: unit)

    height, width = size if isinstance(size, tuple) else (size, size)
    rng = np.random.default_rng(0)
    inputs64 = tf.constant(rng.normal(size=(2, height, width, 3)))
    kernel64 = tf.constant(rng.normal(size=(kernel_size, kernel_size, 3, 4)))
    inputs, kernel = tf.cast(inputs64, dtype), tf.cast(kernel64, dtype)
    out_h = (height - kernel_size) // strides + 1
    out_w = (width - kernel_size) // strides + 1
    upstream = rng.normal(size=(2, out_h, out_w, 4))

    def run(function, x, w):
        with tf.GradientTape() as tape:
            tape.watch([x, w])
            y = function(x, w)
            loss = tf.reduce_sum(tf.cast(y, tf.float64) * upstream)
        grads = tape.gradient(loss, [x, w])
        return [tf.cast(t, tf.float64).numpy() for t in (y, *grads)]

    got = run(
        lambda x, w: _valid_conv_as_matmul(x, w, strides, input_gradient), inputs, kernel
    )
    want = run(lambda x, w: tf.nn.conv2d(x, w, strides, "VALID"), inputs64, kernel64)
    # The gradients again from the definition in NumPy float64 (the layer's
    # input gradient is TensorFlow's own backward-data convolution, so
    # tf.nn.conv2d's gradient alone would not be an independent reference).
    x64, w64 = inputs64.numpy(), kernel64.numpy()
    input_grad = np.zeros_like(x64)
    kernel_grad = np.zeros_like(w64)
    for i in range(out_h):
        for j in range(out_w):
            rows = slice(strides * i, strides * i + kernel_size)
            cols = slice(strides * j, strides * j + kernel_size)
            input_grad[:, rows, cols, :] += np.einsum("bf,pqcf->bpqc", upstream[:, i, j], w64)
            kernel_grad += np.einsum("bpqc,bf->pqcf", x64[:, rows, cols, :], upstream[:, i, j])
    np.testing.assert_allclose(want[1], input_grad, atol=1e-10)
    np.testing.assert_allclose(want[2], kernel_grad, atol=1e-10)
    # bfloat16 keeps 8 significant bits: errors of a few 1e-3 of the scale.
    tolerance = 1e-12 if dtype == "float64" else 2e-2
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, atol=tolerance * np.abs(w).max())


def test_layer_takes_the_matmul_path_on_cpus_and_conv_for_same_padding():
    import tensorflow as tf

    from capsnet_tf.layers.primary_capsule import _matmul_conv_applies

    assert _matmul_conv_applies(tf.zeros((1, 20, 20, 4)), "valid")
    assert not _matmul_conv_applies(tf.zeros((1, 20, 20, 4)), "same")


@pytest.mark.parametrize(
    "dtype, unit, hand_written",
    [("bfloat16", "avx512_bf16", True), ("bfloat16", "amx", False), ("bfloat16", None, False),
     ("float32", "avx512_bf16", False), ("float32", "amx", False), ("float32", None, False)],
)
def test_input_gradient_form_follows_dtype_and_cpu(monkeypatch, dtype, unit, hand_written):
    """Conv2DBackpropInput's gradient only in bfloat16 with AVX-512 BF16 and no AMX."""
    import tensorflow as tf

    from capsnet_tf import cpu
    from capsnet_tf.layers import primary_capsule

    calls = []
    original = primary_capsule._conv_as_matmul_backprop_input

    def recording(*args):
        calls.append(args)
        return original(*args)

    monkeypatch.setattr(cpu, "bfloat16_unit", lambda: unit)
    monkeypatch.setattr(primary_capsule, "_conv_as_matmul_backprop_input", recording)
    inputs = tf.zeros((1, 12, 12, 2), dtype)
    kernel = tf.zeros((5, 5, 2, 3), dtype)
    out = primary_capsule._valid_conv_as_matmul(inputs, kernel, 2)
    assert tuple(out.shape) == (1, 4, 4, 3)
    assert bool(calls) == hand_written
    with pytest.raises(ValueError, match="Received: input_gradient='fast'"):
        primary_capsule._valid_conv_as_matmul(inputs, kernel, 2, "fast")


@pytest.mark.parametrize(
    "precision, unit, warns",
    [("bfloat16", None, True), ("bfloat16", "avx512_bf16", False), ("bfloat16", "amx", False),
     ("float32", None, False)],
)
def test_bfloat16_without_bfloat16_arithmetic_warns(monkeypatch, precision, unit, warns):
    """Mixed bfloat16 on an AVX2-only CPU trains slower than float32: say so."""
    import warnings

    import keras

    from capsnet_tf import cpu, training
    from capsnet_tf.config import ExperimentConfig

    monkeypatch.setattr(cpu, "bfloat16_unit", lambda: unit)
    previous = keras.config.dtype_policy()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            training._set_precision(ExperimentConfig(mixed_precision=precision))
        assert keras.config.dtype_policy().name == (
            "mixed_bfloat16" if precision == "bfloat16" else "float32"
        )
    finally:
        keras.config.set_dtype_policy(previous)
    messages = [str(w.message) for w in caught if "bfloat16 arithmetic" in str(w.message)]
    assert bool(messages) == warns
    if warns:
        assert "--mixed_precision=float32" in messages[0]

