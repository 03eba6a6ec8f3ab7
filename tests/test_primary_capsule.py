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


@pytest.mark.parametrize("kernel_set", ["this_machine", "portable"])
@pytest.mark.parametrize("official", [False, True])
def test_matches_numpy_reference(official, kernel_set):
    """In this machine's form of the convolution (im2col on CPUs) and as a convolution."""
    from capsnet_tf.kernels import use_kernels

    rng = np.random.default_rng(1)
    layer = PrimaryCapsule(
        2, 4, kernel_size=3, strides=2, official_scaling=official, dtype="float64"
    )
    layer.build((None, 7, 7, 3))
    kernel, bias = rng.normal(size=(3, 3, 3, 8)), rng.normal(size=(8,))
    layer.set_weights([kernel, bias])
    x = rng.normal(size=(2, 7, 7, 3))
    expected = reference_primary_capsules(x, kernel, bias, 2, 4, 2, official)
    with use_kernels(kernel_set):
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

