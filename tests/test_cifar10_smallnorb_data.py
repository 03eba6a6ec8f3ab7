"""CIFAR-10 and smallNORB pipelines end to end on `tfds.testing.mock_data`.

TFDS mocks both data sets from their builder code (no metadata files ship with
the installed TFDS): random uint8 images, the same examples in every split and
on every pass. The references below are NumPy re-computations from the raw
mocked examples, loaded with `tfds.load` in the test.

What the official preprocessing leaves visible in a training image: the crop
window (and flip), and the contrast factor `f`. With `a` the window in [0, 255]
and `M` the channel means over the region the contrast is computed on (the
crop for CIFAR-10, the 48x48 image for smallNORB), the input is

    standardise(f * (a - M) + M + delta),

so per channel, the centred input is proportional to the centred window, and
`standardise(...) = alpha * r1 + beta * r2` with `r1 = (a - M) - mean(a - M)`,
`r2 = M - mean(M)` and `f = alpha / beta` (the brightness `delta` cancels).
The fit's error does not depend on which region `M` was taken over (only the
span of r1 and r2 matters); that choice shows only in the value of `f`, which
must lie in the official [0.2, 1.8].
"""

import numpy as np
import pytest
import tensorflow as tf
from numpy.lib.stride_tricks import sliding_window_view

from capsnet_tf.data import (
    DatasetNotFoundError,
    load_tfds_split,
    make_cifar10_dataset,
    make_smallnorb_dataset,
    preprocess_cifar10,
)

tfds = pytest.importorskip("tensorflow_datasets")

NUM_EXAMPLES = 8


@pytest.fixture
def mocked():
    with tfds.testing.mock_data(num_examples=NUM_EXAMPLES):
        yield


def raw_examples(name):
    """The mocked examples as NumPy dicts, in order."""
    dataset = tfds.load(name, split="test", download=False)
    return list(tfds.as_numpy(dataset))


def standardise(x):
    """Reference of `tf.image.per_image_standardization`, in float64."""
    x = np.asarray(x, np.float64)
    return (x - x.mean()) / max(x.std(), 1.0 / np.sqrt(x.size))


def downsample(stereo):
    """96x96 -> 48x48: the mean of every 2x2 block."""
    return stereo.astype(np.float64).reshape(48, 2, 48, 2, -1).mean(axis=(1, 3))


def matching_windows(z, sources, size):
    """`(source, dy, dx)` of the windows whose per-channel centred values are
    a positive multiple of `z`'s."""
    windows = np.moveaxis(sliding_window_view(sources, (size, size), axis=(1, 2)), 3, -1)
    centred = windows - windows.mean(axis=(3, 4), keepdims=True)
    z_centred = z - z.mean(axis=(0, 1))
    alpha = np.einsum("sabijc,ijc->sab", centred, z_centred) / np.einsum(
        "sabijc,sabijc->sab", centred, centred
    )
    error = np.abs(centred * alpha[..., None, None, None] - z_centred).max(axis=(3, 4, 5))
    return [tuple(index) for index in np.argwhere((error < 1e-3) & (alpha > 0))]


def contrast_factor(z, window, channel_means):
    """Least-squares `f` of `z = standardise(f (a - M) + M + delta)`, and the fit error."""
    u = window - channel_means
    r1 = u - u.mean()
    r2 = np.broadcast_to(channel_means - channel_means.mean(), window.shape)
    design = np.stack([r1.ravel(), r2.ravel()], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(design, z.ravel().astype(np.float64), rcond=None)
    return alpha / beta, np.abs(design @ [alpha, beta] - z.ravel()).max()


def one_pass(dataset, *keys):
    """Concatenated `inputs[key]` / `targets[key]` arrays of one pass (one shuffle)."""
    batches = [{**x, **y} for x, y in dataset]
    return tuple(np.concatenate([batch[key].numpy() for batch in batches]) for key in keys)


def epochs(make, count=2):
    """`(images, labels)` of `count` passes over one dataset."""
    dataset, _ = make()
    return [one_pass(dataset, "image", "length") for _ in range(count)]


# ----------------------------------------------------------------------------
# load_tfds_split and the missing-data error


def test_load_tfds_split_is_not_blocked_by_a_mock(mocked, tmp_path):
    dataset, info = load_tfds_split("cifar10", "train", str(tmp_path))
    pairs = list(tfds.as_numpy(dataset))
    assert len(pairs) == NUM_EXAMPLES
    image, label = pairs[0]
    assert image.shape == (32, 32, 3) and image.dtype == np.uint8
    assert 0 <= label < 10 and info.features["label"].num_classes == 10
    np.testing.assert_array_equal(image, raw_examples("cifar10")[0]["image"])


@pytest.mark.parametrize(
    "make", [make_cifar10_dataset, make_smallnorb_dataset], ids=["cifar10", "smallnorb"]
)
def test_missing_data_names_the_set_and_says_what_to_do(make, tmp_path):
    name = "cifar10" if make is make_cifar10_dataset else "smallnorb"
    with pytest.raises(DatasetNotFoundError) as error:
        make("train", 8, training=True, data_dir=str(tmp_path))
    message = str(error.value)
    assert f"'{name}'" in message and str(tmp_path) in message
    assert f"tfds build {name}" in message
    assert "TFDS_DATA_DIR" in message and "--data_dir" in message


def test_bad_arguments():
    with pytest.raises(ValueError, match="batch_size"):
        make_cifar10_dataset("train", 0, training=True)
    with pytest.raises(ValueError, match="take"):
        make_smallnorb_dataset("train", 8, training=True, take=0)
    with pytest.raises(ValueError, match="seed"):
        preprocess_cifar10(tf.zeros([32, 32, 3], tf.uint8), training=True)


# ----------------------------------------------------------------------------
# CIFAR-10


def test_cifar10_evaluation_is_the_standardised_central_crop(mocked):
    dataset, spec = make_cifar10_dataset("test", 3, training=False)
    assert spec.name == "cifar10" and spec.image_shape == (24, 24, 3)
    assert spec.num_classes == 10 and spec.num_examples == NUM_EXAMPLES
    assert spec.num_targets == 1 and len(spec.class_names) == 10
    batches = list(dataset)
    assert [x["image"].shape[0] for x, _ in batches] == [3, 3, 2]
    inputs, targets = batches[0]
    assert set(inputs) == {"image"} and set(targets) == {"length"}
    assert inputs["image"].dtype == tf.float32 and targets["length"].dtype == tf.int32
    images, labels = one_pass(batches, "image", "length")
    raw = raw_examples("cifar10")
    for image, label, example in zip(images, labels, raw, strict=True):
        expected = standardise(example["image"][4:28, 4:28])
        np.testing.assert_allclose(image, expected, atol=1e-5)
        assert label == example["label"]
    again = np.concatenate([x["image"].numpy() for x, _ in dataset])
    np.testing.assert_array_equal(images, again)  # deterministic


def test_cifar10_training_crops_flips_and_contrast_within_spec(mocked):
    (images, labels), _ = epochs(
        lambda: make_cifar10_dataset("train", 4, training=True, seed=3)
    )
    assert images.shape == (NUM_EXAMPLES, 24, 24, 3) and images.dtype == np.float32
    np.testing.assert_allclose(images.mean(axis=(1, 2, 3)), 0.0, atol=1e-5)
    np.testing.assert_allclose(images.std(axis=(1, 2, 3)), 1.0, atol=1e-5)
    raw = raw_examples("cifar10")
    originals = np.stack([example["image"] for example in raw]).astype(np.float64)
    # The sources: every original and its mirror image (flip after the crop).
    sources = np.concatenate([originals, originals[:, :, ::-1]])
    used, offsets, flips, factors = [], set(), set(), []
    for image, label in zip(images, labels):
        matches = matching_windows(image, sources, 24)
        assert len(matches) == 1
        source, dy, dx = matches[0]
        index, flipped = source % NUM_EXAMPLES, source >= NUM_EXAMPLES
        assert label == raw[index]["label"]
        window = sources[source, dy : dy + 24, dx : dx + 24]
        factor, error = contrast_factor(image, window, window.mean(axis=(0, 1)))
        assert error < 1e-4
        assert 0.2 - 1e-3 <= factor <= 1.8 + 1e-3
        used.append(index)
        offsets.add((dy, dx))
        flips.add(bool(flipped))
        factors.append(factor)
    assert sorted(used) == list(range(NUM_EXAMPLES))  # one pass over every example
    assert len(offsets) > 3 and flips == {False, True}
    assert np.ptp(factors) > 0.1  # a new contrast per example


def test_cifar10_seed_fixes_the_augmentation_and_epochs_differ(mocked):
    def run(seed):
        return epochs(lambda: make_cifar10_dataset("train", 8, training=True, seed=seed))

    first, second, other = run(5), run(5), run(6)
    for (a, la), (b, lb) in zip(first, second):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(la, lb)
    assert not np.array_equal(first[0][0], first[1][0])  # new randomness each epoch
    assert not np.array_equal(first[0][0], other[0][0])


# ----------------------------------------------------------------------------
# smallNORB


def test_smallnorb_evaluation_is_the_standardised_central_crop(mocked):
    dataset, spec = make_smallnorb_dataset("test", 4, training=False, reconstruction=True)
    assert spec.name == "smallnorb" and spec.image_shape == (32, 32, 2)
    assert spec.num_classes == 5 and spec.num_examples == NUM_EXAMPLES
    assert spec.class_names[0] == "four-legged animals" and len(spec.class_names) == 5
    inputs, targets = next(iter(dataset))
    assert set(inputs) == {"image", "label"} and set(targets) == {"length", "reconstruction"}
    assert inputs["image"].shape == (4, 32, 32, 2) and inputs["image"].dtype == tf.float32
    assert targets["reconstruction"].shape == (4, 32, 32, 2)
    assert inputs["label"].dtype == tf.int32
    np.testing.assert_array_equal(inputs["label"].numpy(), targets["length"].numpy())
    images, recons, labels = one_pass(dataset, "image", "reconstruction", "length")
    for image, recon, label, example in zip(
        images, recons, labels, raw_examples("smallnorb"), strict=True
    ):
        stereo = np.concatenate([example["image"], example["image2"]], axis=-1)
        crop = downsample(stereo)[8:40, 8:40]
        np.testing.assert_allclose(image, standardise(crop), atol=1e-5)
        np.testing.assert_allclose(recon, crop / 255.0, atol=1e-6)
        assert label == example["label_category"]
    assert recons.min() >= 0.0 and recons.max() <= 1.0


def test_smallnorb_without_reconstruction_has_image_and_length_only(mocked):
    dataset, _ = make_smallnorb_dataset("train", 8, training=True, take=5)
    inputs, targets = next(iter(dataset))
    assert set(inputs) == {"image"} and set(targets) == {"length"}
    assert inputs["image"].shape == (5, 32, 32, 2)


def test_smallnorb_training_crops_and_jitter_within_spec(mocked):
    make = lambda: make_smallnorb_dataset(  # noqa: E731
        "train", 4, training=True, seed=7, reconstruction=True
    )
    dataset, _ = make()
    images, recons, labels = one_pass(dataset, "image", "reconstruction", "length")
    assert images.shape == (NUM_EXAMPLES, 32, 32, 2)
    np.testing.assert_allclose(images.mean(axis=(1, 2, 3)), 0.0, atol=1e-5)
    np.testing.assert_allclose(images.std(axis=(1, 2, 3)), 1.0, atol=1e-5)
    raw = raw_examples("smallnorb")
    resized = np.stack(
        [downsample(np.concatenate([e["image"], e["image2"]], axis=-1)) for e in raw]
    )
    used, offsets, factors = [], set(), []
    for image, recon, label in zip(images, recons, labels):
        matches = matching_windows(image, resized, 32)
        assert len(matches) == 1
        index, dy, dx = matches[0]
        assert label == raw[index]["label_category"]
        window = resized[index, dy : dy + 32, dx : dx + 32]
        # The contrast acts around the means of the whole 48x48 pair.
        factor, error = contrast_factor(image, window, resized[index].mean(axis=(0, 1)))
        assert error < 1e-4
        assert 0.2 - 1e-2 <= factor <= 1.8 + 1e-2
        np.testing.assert_allclose(recon, window / 255.0, atol=1e-6)  # same window, no jitter
        used.append(index)
        offsets.add((dy, dx))
        factors.append(factor)
    assert sorted(used) == list(range(NUM_EXAMPLES))
    assert len(offsets) > 3 and np.ptp(factors) > 0.1
    # Same seed, same epochs; a new crop and jitter every epoch.
    first, second = epochs(make), epochs(make)
    np.testing.assert_array_equal(first[0][0], second[0][0])
    np.testing.assert_array_equal(first[1][0], second[1][0])
    assert not np.array_equal(first[0][0], first[1][0])
