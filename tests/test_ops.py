"""squash and safe_norm against hand-computed values and NumPy float64."""

import numpy as np
import pytest
import tensorflow as tf

from capsnet_tf import safe_norm, squash


def numpy_squash(vectors):
    norm = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return norm**2 / (1 + norm**2) * vectors / np.where(norm == 0, 1, norm)


def test_squash_of_all_ones_vector_matches_hand_computed_value():
    # |s|^2 = 16: squash = 16/17 * s/4, every entry 4/17.
    out = squash(np.ones((1, 16), "float32")).numpy()
    np.testing.assert_allclose(out, np.full((1, 16), 4 / 17), rtol=1e-6)


def test_squash_matches_float64_reference_and_keeps_direction():
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(5, 7, 8)) * rng.uniform(0.01, 10, size=(5, 7, 1))
    out = squash(tf.constant(vectors, tf.float64)).numpy()
    np.testing.assert_allclose(out, numpy_squash(vectors), rtol=1e-6, atol=1e-9)
    lengths = np.linalg.norm(out, axis=-1)
    assert np.all(lengths < 1)
    cosine = np.sum(out * vectors, -1) / (lengths * np.linalg.norm(vectors, axis=-1))
    np.testing.assert_allclose(cosine, 1.0, rtol=1e-9)


def test_squash_along_other_axis():
    vectors = np.random.default_rng(1).normal(size=(3, 8, 4))
    out = squash(tf.constant(vectors), axis=1).numpy()
    expected = np.moveaxis(numpy_squash(np.moveaxis(vectors, 1, -1)), -1, 1)
    np.testing.assert_allclose(out, expected, rtol=1e-6)


def test_squash_and_norm_are_finite_with_finite_gradient_at_zero():
    zero = tf.zeros((2, 8))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(zero)
        squashed = squash(zero)
        norm = safe_norm(zero)
    assert np.all(squashed.numpy() == 0)
    for value in (squashed, norm):
        gradient = tape.gradient(value, zero).numpy()
        assert np.all(np.isfinite(gradient)), gradient


def test_squash_gradient_matches_numerical_gradient():
    vectors = tf.constant(np.random.default_rng(2).normal(size=(3, 6)), tf.float64)
    theoretical, numerical = tf.test.compute_gradient(squash, [vectors])
    np.testing.assert_allclose(theoretical[0], numerical[0], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_squash_keeps_low_precision_dtype_and_is_close(dtype):
    vectors = np.random.default_rng(3).normal(size=(4, 8)).astype("float32")
    out = squash(tf.cast(vectors, dtype))
    assert out.dtype == tf.as_dtype(dtype)
    np.testing.assert_allclose(
        tf.cast(out, tf.float32).numpy(), numpy_squash(vectors), rtol=2e-2, atol=2e-2
    )


def test_safe_norm_matches_numpy():
    vectors = np.random.default_rng(4).normal(size=(2, 3, 5))
    np.testing.assert_allclose(
        safe_norm(tf.constant(vectors)).numpy(), np.linalg.norm(vectors, axis=-1), rtol=1e-7
    )
