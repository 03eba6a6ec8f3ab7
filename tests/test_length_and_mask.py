"""Length and Mask: values, gradients, training versus inference selection."""

import numpy as np
import pytest
import tensorflow as tf

from capsnet_tf import Length, Mask
from tests.layer_test_case import run_layer_test


def test_length_baseline_and_values(tmp_path):
    capsules = np.random.default_rng(0).normal(size=(3, 10, 16)).astype("float32")
    _, lengths = run_layer_test(
        Length, {}, capsules, (3, 10), expected_trainable_weight_shapes={}, tmp_path=tmp_path
    )
    np.testing.assert_allclose(lengths.numpy(), np.linalg.norm(capsules, axis=-1), rtol=1e-6)


def test_length_gradient_finite_at_zero():
    zero = tf.zeros((1, 10, 16))
    with tf.GradientTape() as tape:
        tape.watch(zero)
        lengths = Length()(zero)
    assert np.all(np.isfinite(tape.gradient(lengths, zero).numpy()))


def capsules_with_longest(longest):
    capsules = np.random.default_rng(1).uniform(0.0, 0.1, size=(len(longest), 10, 16))
    for b, j in enumerate(longest):
        capsules[b, j] = 0.5
    return capsules.astype("float32")


def test_mask_baseline(tmp_path):
    run_layer_test(
        Mask,
        {},
        (capsules_with_longest([2, 7]), np.array([3, 4], "int32")),
        (2, 10, 16),
        expected_trainable_weight_shapes={},
        tmp_path=tmp_path,
        run_training_check=False,  # two inputs, no weights (see run_layer_test)
    )


def test_mask_two_targets_baseline(tmp_path):
    run_layer_test(
        Mask,
        {"num_targets": 2},
        (capsules_with_longest([2, 7]), np.array([[3, 4], [0, 9]], "int32")),
        (2, 2, 10, 16),
        expected_trainable_weight_shapes={},
        tmp_path=tmp_path,
        call_kwargs={"training": True},
        run_training_check=False,
    )


def test_mask_without_labels_baseline(tmp_path):
    run_layer_test(
        Mask, {}, capsules_with_longest([2, 7]), (2, 10, 16),
        expected_trainable_weight_shapes={}, tmp_path=tmp_path,
    )


def test_mask_keeps_label_in_training_and_longest_otherwise():
    capsules = capsules_with_longest([2, 7])
    labels = np.array([3, 4])
    for training, kept in ((True, labels), (False, [2, 7]), (None, [2, 7])):
        masked = Mask()(capsules, labels, training=training).numpy()
        for b, j in enumerate(kept):
            np.testing.assert_array_equal(masked[b, j], capsules[b, j])
            others = np.delete(masked[b], j, axis=0)
            assert np.all(others == 0)
    # Without labels: always the longest.
    masked = Mask()(capsules, training=True).numpy()
    np.testing.assert_array_equal(masked[0, 2], capsules[0, 2])


def test_mask_with_two_labels_returns_one_copy_per_label():
    capsules = capsules_with_longest([2, 7])
    capsules[0, 5] = 0.4  # second longest of example 0
    capsules[1, 1] = 0.4
    labels = np.array([[3, 4], [0, 9]])
    masked = Mask()(capsules, labels, training=True).numpy()
    assert masked.shape == (2, 2, 10, 16)
    for b in range(2):
        for t in range(2):
            kept = labels[b, t]
            np.testing.assert_array_equal(masked[b, t, kept], capsules[b, kept])
            assert np.count_nonzero(np.abs(masked[b, t]).sum(-1)) == 1
    inferred = Mask()(capsules, labels, training=False).numpy()
    assert np.count_nonzero(inferred[0, 0, 2]) and np.count_nonzero(inferred[0, 1, 5])
    assert Mask().compute_output_shape((None, 10, 16), (None, 2)) == (None, 2, 10, 16)
    top2 = Mask(num_targets=2)(capsules).numpy()
    np.testing.assert_array_equal(top2, inferred)


def test_mask_refuses_bad_labels():
    with pytest.raises(ValueError, match="labels of shape"):
        Mask()(capsules_with_longest([1]), np.zeros((1, 2, 2), "int32"), training=True)
    with pytest.raises(ValueError, match="num_targets"):
        Mask(num_targets=0)
