"""MultiMNIST on the real MNIST copy: format, merge, shifts, pairing, determinism."""

import numpy as np
import pytest
import tensorflow as tf

from capsnet_tf.data import DatasetNotFoundError
from capsnet_tf.data.multimnist import (
    load_mnist_arrays,
    make_multimnist_dataset,
    merge_digits,
    place_digit,
)
from tests.pipeline_helpers import collect


def locate(canvas, lookup):
    """`(index, dy, dx)` of every MNIST image of `lookup` placed whole on `canvas`.

    `lookup` maps the bytes of a uint8 28x28 image to its index. A placement
    counts only if the canvas is that image at that offset and zero elsewhere.
    """
    canvas = canvas[..., 0]
    size = canvas.shape[0]
    found = []
    total = canvas.sum()
    for dy in range(size - 27):
        for dx in range(size - 27):
            crop = canvas[dy : dy + 28, dx : dx + 28]
            if not np.isclose(crop.sum(), total, rtol=0, atol=1e-4):
                continue
            key = np.round(crop * 255.0).astype(np.uint8).tobytes()
            if key in lookup and np.array_equal(crop, lookup[key][1]):
                found.append((lookup[key][0], dy, dx))
    return found


def make_lookup(images):
    return {
        image.tobytes(): (i, image.astype(np.float32) / np.float32(255.0))
        for i, image in enumerate(images)
    }


def test_place_and_merge_match_hand_computed_values():
    digit = np.array([[1, 2], [3, 4]], np.uint8)
    np.testing.assert_array_equal(
        place_digit(digit, 0, 1, 3), [[0, 1, 2], [0, 3, 4], [0, 0, 0]]
    )
    np.testing.assert_array_equal(place_digit(digit[..., None], 1, 1, 3)[..., 0][2], [0, 3, 4])
    with pytest.raises(ValueError, match="does not fit"):
        place_digit(digit, 2, 0, 3)
    a = np.array([0.2, 0.6, 1.0, 0.0], np.float32)
    b = np.array([0.3, 0.6, 0.5, 0.0], np.float32)
    np.testing.assert_allclose(merge_digits(a, b), [0.5, 1.0, 1.0, 0.0])
    np.testing.assert_array_equal(
        merge_digits(np.array([100, 200], np.uint8), np.array([100, 100], np.uint8)), [200, 255]
    )


def test_test_set_format_merge_and_labels(tfds_data_dir):
    dataset, spec = make_multimnist_dataset("test", 16, training=False, take=40)
    assert spec.name == "multi_mnist" and spec.image_shape == (36, 36, 1)
    assert spec.num_classes == 10 and spec.num_targets == 2 and spec.num_examples == 10_000
    first_inputs, first_targets = next(iter(dataset))
    assert first_inputs["image"].shape == (16, 36, 36, 1)
    assert first_inputs["image"].dtype == tf.float32
    assert first_inputs["label"].shape == (16, 2) and first_inputs["label"].dtype == tf.int32
    assert first_targets["reconstruction"].shape == (16, 2, 36, 36, 1)
    inputs, targets = collect(dataset)
    assert len(inputs["image"]) == 40  # the last batch of 8 is kept
    images, digits, labels = inputs["image"], targets["reconstruction"], inputs["label"]
    assert images.min() >= 0.0 and images.max() <= 1.0
    np.testing.assert_array_equal(targets["length"], labels)
    # The official merge, exactly: min(first + second, 1).
    np.testing.assert_array_equal(images, np.minimum(digits[:, 0] + digits[:, 1], 1.0))
    assert np.all(labels[:, 0] != labels[:, 1])
    mnist_images, mnist_labels = load_mnist_arrays("test")
    np.testing.assert_array_equal(labels[:, 0], mnist_labels[:40])  # k-th test image first
    # Without reconstruction: no label input, no image target.
    plain, _ = make_multimnist_dataset("test", 8, training=False, take=8, reconstruction=False)
    x, y = next(iter(plain))
    assert set(x) == {"image"} and set(y) == {"length"}
    np.testing.assert_array_equal(x["image"].numpy(), images[:8])


def test_each_digit_is_a_whole_mnist_digit_shifted_within_range(tfds_data_dir):
    mnist_images, mnist_labels = load_mnist_arrays("test")
    lookup = make_lookup(mnist_images)
    for max_shift in (4, 2):
        dataset, spec = make_multimnist_dataset(
            "test", 32, training=False, max_shift=max_shift, seed=1, take=96
        )
        size = 28 + 2 * max_shift
        assert spec.image_shape == (size, size, 1)
        inputs, targets = collect(dataset)
        offsets = []
        for k, (pair, digits) in enumerate(zip(inputs["label"], targets["reconstruction"])):
            assert digits.shape == (2, size, size, 1)
            first = locate(digits[0], lookup)
            second = locate(digits[1], lookup)
            # Each target is one whole MNIST digit, nothing clipped, nothing else.
            assert len(first) == 1 and len(second) == 1, k
            assert first[0][0] == k  # the k-th test image is the first digit
            assert mnist_labels[second[0][0]] == pair[1] != pair[0]
            offsets += [first[0][1:], second[0][1:]]
        offsets = np.array(offsets)
        assert offsets.min() >= 0 and offsets.max() <= 2 * max_shift
        # Offsets spread over the whole range on both axes.
        for axis in range(2):
            assert set(offsets[:, axis]) == set(range(2 * max_shift + 1))
        assert abs(offsets.mean() - max_shift) < 0.6
        if max_shift == 4:
            # The paper's "80% overlap" (section 6) is the overlap of the two
            # digits' 28x28 frames: with offsets independent and uniform over
            # 0..8, its mean is E[(28 - |dy|)(28 - |dx|)] / 784 = 0.7996 exactly
            # (dy, dx: differences of two such offsets). 96 pairs: SE ~0.015.
            first, second = offsets[0::2], offsets[1::2]
            frames = np.prod(28 - np.abs(first - second), axis=1) / 784
            assert abs(frames.mean() - 0.7996) < 0.05, frames.mean()


def ink_overlap(first, second):
    """Fraction of the first digit's ink pixels that the second digit also inks."""
    ink_a, ink_b = first > 0, second > 0
    return (ink_a & ink_b).sum() / ink_a.sum()


def box_overlap(first, second):
    """Area of the intersection of the ink bounding boxes over the first box's area."""

    def box(ink):
        rows, cols = np.flatnonzero(ink.any(1)), np.flatnonzero(ink.any(0))
        return rows[0], rows[-1] + 1, cols[0], cols[-1] + 1

    (a0, a1, a2, a3), (b0, b1, b2, b3) = box(first > 0), box(second > 0)
    inter = max(0, min(a1, b1) - max(a0, b0)) * max(0, min(a3, b3) - max(a2, b2))
    return inter / ((a1 - a0) * (a3 - a2))


def test_overlap_statistics_match_an_independent_numpy_simulation(tfds_data_dir):
    count = 400
    dataset, _ = make_multimnist_dataset("test", 200, training=False, seed=2, take=count)
    _, targets = collect(dataset)
    digits = targets["reconstruction"][..., 0]
    generated_ink = np.mean([ink_overlap(a, b) for a, b in digits])
    generated_box = np.mean([box_overlap(a, b) for a, b in digits])

    # The same construction written directly in NumPy from the base images.
    images, labels = load_mnist_arrays("test")
    rng = np.random.default_rng(0)
    reference_ink, reference_box = [], []
    for k in range(count):
        partner_class = (labels[k] + rng.integers(1, 10)) % 10
        partner = rng.choice(np.flatnonzero(labels == partner_class))
        dy1, dx1, dy2, dx2 = rng.integers(0, 9, size=4)
        a = place_digit(images[k], dy1, dx1, 36)
        b = place_digit(images[partner], dy2, dx2, 36)
        reference_ink.append(ink_overlap(a, b))
        reference_box.append(box_overlap(a, b))
    reference_ink, reference_box = np.mean(reference_ink), np.mean(reference_box)
    # Non-trivial overlap: the digits really overlap, but are not on top of
    # each other (measured here: about 0.38 of the ink, 0.65 of the box; the
    # paper reports an 80% average bounding-box overlap, by its own measure).
    assert 0.15 < generated_ink < 0.6
    assert 0.5 < generated_box < 0.9
    # Both estimates of the same expectation, 400 samples each: standard
    # errors are about 0.01 (ink) and 0.008 (boxes).
    assert abs(generated_ink - reference_ink) < 0.05, (generated_ink, reference_ink)
    assert abs(generated_box - reference_box) < 0.04, (generated_box, reference_box)


def test_partner_classes_are_uniform_over_the_other_nine(tfds_data_dir):
    dataset, _ = make_multimnist_dataset(
        "test", 1000, training=False, take=1800, reconstruction=False
    )
    _, targets = collect(dataset)
    pairs = targets["length"]
    steps = (pairs[:, 1] - pairs[:, 0]) % 10
    counts = np.bincount(steps, minlength=10)
    assert counts[0] == 0
    # 1800 draws over 9 values: 200 expected each, binomial sd about 13.3.
    assert np.all(np.abs(counts[1:] - 200) < 60), counts


def test_test_set_is_fixed_by_the_seed(tfds_data_dir):
    def build(seed):
        dataset, _ = make_multimnist_dataset("test", 32, training=False, seed=seed, take=64)
        return dataset

    dataset = build(7)
    epoch_1, epoch_2 = collect(dataset), collect(dataset)
    tf.random.set_seed(999)  # the test set does not depend on the global seed
    rebuilt = collect(build(7))
    other = collect(build(8))
    for key in ("image", "label"):
        np.testing.assert_array_equal(epoch_1[0][key], epoch_2[0][key])
        np.testing.assert_array_equal(epoch_1[0][key], rebuilt[0][key])
    np.testing.assert_array_equal(epoch_1[1]["reconstruction"], rebuilt[1]["reconstruction"])
    assert not np.array_equal(epoch_1[0]["image"], other[0]["image"])
    # Same first digits (k-th test image), different partners and shifts.
    np.testing.assert_array_equal(epoch_1[0]["label"][:, 0], other[0]["label"][:, 0])
    assert np.mean(epoch_1[0]["label"][:, 1] != other[0]["label"][:, 1]) > 0.5


def test_several_pairs_per_test_image(tfds_data_dir):
    dataset, spec = make_multimnist_dataset(
        "test[:100]", 100, training=False, test_pairs_per_image=3
    )
    assert spec.num_examples == 300
    inputs, targets = collect(dataset)
    assert len(inputs["image"]) == 300
    _, labels = load_mnist_arrays("test[:100]")
    np.testing.assert_array_equal(inputs["label"][:, 0], np.tile(labels, 3))
    digits = targets["reconstruction"]
    # Round r pairs image k again, with another partner or other shifts.
    for r in (1, 2):
        same = [
            np.array_equal(digits[k], digits[k + 100 * r]) for k in range(100)
        ]
        assert not any(same)


def test_training_epochs_use_every_image_once_with_new_pairs(tfds_data_dir):
    take = 48
    mnist_images, mnist_labels = load_mnist_arrays("train")
    lookup = make_lookup(mnist_images[:take])

    def epochs(seed):
        dataset, spec = make_multimnist_dataset("train", 16, training=True, seed=seed, take=take)
        assert spec.num_examples == 60_000
        return [collect(dataset) for _ in range(2)]

    first_run = epochs(3)
    orders, partners = [], []
    for inputs, targets in first_run:
        assert len(inputs["image"]) == take
        np.testing.assert_array_equal(
            inputs["image"],
            np.minimum(targets["reconstruction"][:, 0] + targets["reconstruction"][:, 1], 1.0),
        )
        assert np.all(inputs["label"][:, 0] != inputs["label"][:, 1])
        order = []
        for digits in targets["reconstruction"]:
            found = locate(digits[0], lookup)
            assert len(found) == 1
            order.append(found[0][0])
        # Every one of the `take` images is the first digit exactly once.
        assert sorted(order) == list(range(take))
        np.testing.assert_array_equal(inputs["label"][:, 0], mnist_labels[order])
        orders.append(order)
        partners.append(dict(zip(order, targets["reconstruction"][:, 1])))
    assert orders[0] != orders[1]  # reshuffled
    changed = [not np.array_equal(partners[0][i], partners[1][i]) for i in range(take)]
    assert all(changed)  # a new partner or new shifts for every image
    # The same seed reproduces both epochs.
    second_run = epochs(3)
    for (a, _), (b, _) in zip(first_run, second_run):
        np.testing.assert_array_equal(a["image"], b["image"])
    assert not np.array_equal(epochs(4)[0][0]["image"], first_run[0][0]["image"])


def test_invalid_arguments_and_missing_data(tmp_path):
    with pytest.raises(ValueError, match="batch_size"):
        make_multimnist_dataset("test", 0, training=False)
    with pytest.raises(ValueError, match="max_shift"):
        make_multimnist_dataset("test", 8, training=False, max_shift=-1)
    with pytest.raises(ValueError, match="test_pairs_per_image"):
        make_multimnist_dataset("test", 8, training=False, test_pairs_per_image=0)
    with pytest.raises(DatasetNotFoundError, match="mnist"):
        make_multimnist_dataset("test", 8, training=False, data_dir=str(tmp_path))
