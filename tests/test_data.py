"""The tf.data pipeline on the real MNIST copy: format, shifts, determinism, errors."""

import numpy as np
import pytest
import tensorflow as tf

from capsnet_tf.config import ExperimentConfig
from capsnet_tf.data import DatasetNotFoundError, load_tfds_split, make_dataset, random_shift
from capsnet_tf.data.pipeline import random_subpixel_shift, translate


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
    # max_shift 0: the image itself, whatever the seed.
    for seed in ([0, 0], [7, 3]):
        unshifted = random_shift(tf.constant(image), 0, tf.constant(seed)).numpy()
        np.testing.assert_array_equal(unshifted, image)


def bilinear_translated(image, dy, dx):
    """Reference: out[y, x] = image at (y - dy, x - dx), bilinear, zeros outside; float64."""
    image = np.asarray(image, np.float64)
    h, w = image.shape[:2]
    padded = np.zeros((h + 2, w + 2) + image.shape[2:])
    padded[1:-1, 1:-1] = image

    def read(y, x):  # integer coordinates of `image`; zero outside
        inside = (y >= -1) & (y <= h) & (x >= -1) & (x <= w)
        return np.where(
            inside[..., None], padded[np.clip(y + 1, 0, h + 1), np.clip(x + 1, 0, w + 1)], 0.0
        )

    ys, xs = np.meshgrid(np.arange(h) - dy, np.arange(w) - dx, indexing="ij")
    y0, x0 = np.floor(ys).astype(int), np.floor(xs).astype(int)
    wy, wx = (ys - y0)[..., None], (xs - x0)[..., None]
    return (
        (1 - wy) * (1 - wx) * read(y0, x0)
        + (1 - wy) * wx * read(y0, x0 + 1)
        + wy * (1 - wx) * read(y0 + 1, x0)
        + wy * wx * read(y0 + 1, x0 + 1)
    )


def centroid(image):
    rows, cols = np.indices(image.shape[:2])
    mass = image[..., 0].sum()
    return (rows * image[..., 0]).sum() / mass, (cols * image[..., 0]).sum() / mass


@pytest.mark.parametrize("dy, dx", [(0, 0), (1, -2), (0.5, 0), (-0.25, 1.75), (2.9, -0.6)])
def test_translate_is_a_bilinear_zero_filled_translation(dy, dx):
    # Nonzero up to the borders, so that the zero fill is checked as well.
    image = np.random.default_rng(1).random((9, 7, 1)).astype("float32")
    out = translate(tf.constant(image), dy, dx).numpy()
    np.testing.assert_allclose(out, bilinear_translated(image, dy, dx), atol=1e-5)
    if float(dy).is_integer() and float(dx).is_integer():
        np.testing.assert_array_equal(out, shifted(image, int(dy), int(dx)))


def test_random_subpixel_shift_draws_real_offsets_within_range():
    # One bright pixel: its translated mass is 1 and its centroid moves by the offsets.
    point = np.zeros((28, 28, 1), "float32")
    point[14, 14] = 1.0
    offsets = []
    for seed in range(40):
        out = random_subpixel_shift(tf.constant(point), 2, tf.constant([seed, 7])).numpy()
        assert out.sum() == pytest.approx(1.0, abs=1e-5)
        dy, dx = np.subtract(centroid(out), 14.0)
        np.testing.assert_allclose(out, bilinear_translated(point, dy, dx), atol=1e-5)
        again = random_subpixel_shift(tf.constant(point), 2, tf.constant([seed, 7])).numpy()
        np.testing.assert_array_equal(out, again)  # stateless
        offsets += [dy, dx]
    offsets = np.array(offsets)
    assert np.abs(offsets).max() <= 2.0 + 1e-5
    assert np.abs(offsets).max() > 1.5 and offsets.min() < -1.5  # both ways, near the bound
    fractions = np.abs(offsets - np.round(offsets))
    assert np.median(fractions) > 0.1  # real offsets, not whole pixels


def test_subpixel_training_pipeline_translates_the_image(tfds_data_dir):
    dataset, _ = make_dataset(
        "mnist", "train", 1, training=True, shift=2, seed=3, take=1, shift_mode="subpixel"
    )
    originals, _ = load_tfds_split("mnist", "train[:1]")
    (original, _label), = originals
    original = original.numpy() / 255.0
    seen = []
    for _ in range(6):  # a new shift every epoch
        (inputs, _targets), = dataset
        image = inputs["image"].numpy()[0]
        assert image.min() >= 0.0 and image.max() <= 1.0 + 1e-6
        assert image.sum() == pytest.approx(original.sum(), rel=1e-4)  # no ink lost
        dy, dx = np.subtract(centroid(image), centroid(original))
        assert max(abs(dy), abs(dx)) <= 2.0 + 1e-3
        np.testing.assert_allclose(image, bilinear_translated(original, dy, dx), atol=1e-4)
        seen.append((round(dy, 3), round(dx, 3)))
    assert len(set(seen)) == 6
    with pytest.raises(ValueError, match="shift_mode.*Received"):
        make_dataset("mnist", "train", 8, training=True, shift_mode="bicubic")


def test_subpixel_shifts_are_for_mnist_style_data_only():
    ExperimentConfig(dataset="fashion_mnist", shift_mode="subpixel").validate()
    with pytest.raises(ValueError, match="shift_mode.*Received.*cifar10"):
        ExperimentConfig(dataset="cifar10", shift_mode="subpixel").validate()
    with pytest.raises(ValueError, match="shift_mode.*Received"):
        ExperimentConfig(shift_mode="bicubic").validate()


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


def test_registry_has_a_loader_per_data_set_and_checks_before_loading(tmp_path):
    from capsnet_tf.data.registry import DATASETS, LOADERS, load_experiment_data

    assert DATASETS == ("mnist", "fashion_mnist", "multi_mnist", "expanded_mnist", "affnist",
                        "cifar10", "smallnorb")
    assert set(LOADERS) == set(DATASETS)
    with pytest.raises(ValueError, match="affNIST is a test set only"):
        load_experiment_data("affnist", "train", 8, training=True)
    with pytest.raises(ValueError, match="without reconstruction"):
        load_experiment_data("cifar10", "train", 8, training=True)
    with pytest.raises(ValueError, match="needs `image_folder`"):
        load_experiment_data("image_folder", "train", 8, training=True)
    # Any other name is a TFDS image data set, looked for where asked.
    with pytest.raises(DatasetNotFoundError, match="'kmnist'"):
        load_experiment_data("kmnist", "test", 8, training=False, data_dir=str(tmp_path))
