"""The tf.data pipeline on the real MNIST copy: format, shifts, determinism, errors."""

import numpy as np
import pytest
import tensorflow as tf

from capsnet_tf.data import DatasetNotFoundError, load_tfds_split, make_dataset, random_shift


def shifted(image, dy, dx):
    """Reference: image translated by (dy, dx) with zero fill, in NumPy."""
    out = np.zeros_like(image)
    h, w = image.shape[:2]
    out[max(dy, 0) : h + min(dy, 0), max(dx, 0) : w + min(dx, 0)] = image[
        max(-dy, 0) : h + min(-dy, 0), max(-dx, 0) : w + min(-dx, 0)
    ]
    return out


def test_random_shift_is_a_zero_filled_translation_within_range():
    image = np.random.default_rng(0).random((28, 28, 1)).astype("float32")
    seen = set()
    for seed in range(60):
        out = random_shift(tf.constant(image), 2, tf.constant([seed, 1])).numpy()
        matches = [
            (dy, dx)
            for dy in range(-2, 3)
            for dx in range(-2, 3)
            if np.array_equal(out, shifted(image, dy, dx))
        ]
        assert len(matches) == 1, seed
        seen.add(matches[0])
    assert len(seen) > 10  # many of the 25 shifts occur
    assert random_shift(tf.constant(image), 0, tf.constant([0, 0])) is not None


def test_training_pipeline_format_and_shift(tfds_data_dir):
    dataset, info = make_dataset("mnist", "train", 32, training=True, shift=2, seed=3, take=256)
    inputs, targets = next(iter(dataset))
    assert inputs["image"].shape == (32, 28, 28, 1) and inputs["image"].dtype == tf.float32
    assert inputs["label"].dtype == tf.int32
    images = inputs["image"].numpy()
    assert images.min() >= 0.0 and images.max() <= 1.0
    np.testing.assert_array_equal(targets["reconstruction"].numpy(), images)
    np.testing.assert_array_equal(targets["length"].numpy(), inputs["label"].numpy())
    assert info.features["label"].num_classes == 10
    # Every training image is a shift within 2 pixels of an original image.
    originals, _ = load_tfds_split("mnist", "train[:256]")
    originals = np.stack([x.numpy() / 255.0 for x, _ in originals]).astype("float32")
    for image in images[:8]:
        assert any(
            np.allclose(image, shifted(original, dy, dx))
            for original in originals
            for dy in range(-2, 3)
            for dx in range(-2, 3)
        )


def test_test_pipeline_is_unshifted_and_in_order(tfds_data_dir):
    dataset, _ = make_dataset("mnist", "test", 16, training=False, take=16)
    inputs, _ = next(iter(dataset))
    originals, _ = load_tfds_split("mnist", "test[:16]")
    for image, (original, _label) in zip(inputs["image"].numpy(), originals):
        np.testing.assert_allclose(image, original.numpy() / 255.0, rtol=1e-6)


def test_seed_fixes_order_and_shifts_and_epochs_differ(tfds_data_dir):
    def epochs(seed):
        dataset, _ = make_dataset("mnist", "train", 64, training=True, shift=2, seed=seed, take=128)
        return [np.concatenate([x["image"].numpy() for x, _ in dataset]) for _ in range(2)]

    first, second, other = epochs(5), epochs(5), epochs(6)
    np.testing.assert_array_equal(first[0], second[0])
    np.testing.assert_array_equal(first[1], second[1])
    assert not np.array_equal(first[0], first[1])  # a new order and shift each epoch
    assert not np.array_equal(first[0], other[0])


def test_last_partial_batch_is_kept(tfds_data_dir):
    dataset, _ = make_dataset("mnist", "test", 64, training=False, take=100)
    sizes = [x["image"].shape[0] for x, _ in dataset]
    assert sizes == [64, 36]


def test_missing_dataset_names_it_and_says_what_to_do(tmp_path):
    with pytest.raises(DatasetNotFoundError) as error:
        make_dataset("mnist", "train", 8, training=True, data_dir=str(tmp_path))
    message = str(error.value)
    assert "'mnist'" in message and str(tmp_path) in message and "TFDS_DATA_DIR" in message


def test_bad_arguments():
    with pytest.raises(ValueError, match="batch_size"):
        make_dataset("mnist", "train", 0, training=True)
    with pytest.raises(ValueError, match="shift"):
        make_dataset("mnist", "train", 8, training=True, shift=-1)
