"""Expanded MNIST, the affNIST-style generated test set and the affNIST reader."""

import sys

import numpy as np
import pytest
import scipy.io
import scipy.ndimage
import tensorflow as tf

from capsnet_tf.data.affnist import (
    affine_transform,
    affine_translation_bounds,
    load_affnist,
    make_affnist_dataset,
    make_expanded_mnist_dataset,
    warp_digit,
)
from capsnet_tf.data.multimnist import load_mnist_arrays, place_digit
from tests.pipeline_helpers import collect


def placements(canvas, originals):
    """`(index, dy, dx)` of every original (uint8 [28, 28]) placed whole on `canvas`."""
    lookup = {}
    for i, original in enumerate(originals):
        lookup.setdefault(original.tobytes(), []).append(i)
    canvas = canvas[..., 0]
    size = canvas.shape[0]
    found = []
    for dy in range(size - 27):
        for dx in range(size - 27):
            crop = canvas[dy : dy + 28, dx : dx + 28]
            if not np.isclose(crop.sum(), canvas.sum(), rtol=0, atol=1e-4):
                continue
            as_uint8 = np.round(crop * 255.0).astype(np.uint8)
            for i in lookup.get(as_uint8.tobytes(), []):
                # Exact: the float image is the original / 255, nothing else.
                if np.array_equal(crop, originals[i].astype(np.float32) / np.float32(255.0)):
                    found.append((i, dy, dx))
    return found


def reference_warp(image, rotation, shear, scale_y, scale_x, ty, tx, size):
    """scipy.ndimage reference of the documented transform, in (row, col) coordinates.

    Forward on (row, col) about the canvas centre: scale diag(sy, sx), then
    the horizontal shear col += shear * row, then the rotation by `rotation`
    degrees (clockwise on screen: a point right of the centre moves down),
    then the translation (ty, tx). scipy maps each output point o to the
    input point inv(A) @ (o - c - t) + c.
    """
    a = np.deg2rad(rotation)
    rotate = np.array([[np.cos(a), np.sin(a)], [-np.sin(a), np.cos(a)]])
    shear_matrix = np.array([[1.0, 0.0], [shear, 1.0]])
    scale = np.diag([scale_y, scale_x])
    forward = rotate @ shear_matrix @ scale
    inverse = np.linalg.inv(forward)
    canvas = np.zeros((size, size))
    top = (size - image.shape[0]) // 2
    canvas[top : top + image.shape[0], top : top + image.shape[1]] = image / 255.0
    centre = np.full(2, (size - 1) / 2.0)
    offset = centre - inverse @ (centre + np.array([ty, tx]))
    return scipy.ndimage.affine_transform(canvas, inverse, offset=offset, order=1, cval=0.0)


# ---------------------------------------------------------------- expanded MNIST


def test_expanded_mnist_test_set_is_translated_within_range_and_fixed(tfds_data_dir):
    originals = load_mnist_arrays("test")[0][:24]
    for max_shift in (6, 2):
        dataset, spec = make_expanded_mnist_dataset(
            "test", 8, training=False, max_shift=max_shift, seed=1, take=24
        )
        assert spec.name == "expanded_mnist" and spec.image_shape == (40, 40, 1)
        assert spec.num_examples == 10_000 and spec.num_classes == 10
        inputs, targets = collect(dataset)
        assert inputs["image"].shape == (24, 40, 40, 1)
        np.testing.assert_array_equal(targets["reconstruction"], inputs["image"])
        np.testing.assert_array_equal(inputs["label"], load_mnist_arrays("test")[1][:24])
        shifts = []
        for k, image in enumerate(inputs["image"]):
            found = placements(image, originals)
            assert len(found) == 1 and found[0][0] == k  # the k-th digit, whole
            shifts.append((found[0][1] - 6, found[0][2] - 6))
        shifts = np.array(shifts)
        assert np.abs(shifts).max() <= max_shift
        assert len({tuple(s) for s in shifts}) > 8  # really translated, variously
        assert np.abs(shifts).max() >= max_shift - 1
        # Fixed: the same in a second pass and a second build; another seed differs.
        np.testing.assert_array_equal(collect(dataset)[0]["image"], inputs["image"])
        again, _ = make_expanded_mnist_dataset(
            "test", 8, training=False, max_shift=max_shift, seed=1, take=24
        )
        np.testing.assert_array_equal(collect(again)[0]["image"], inputs["image"])
        other, _ = make_expanded_mnist_dataset(
            "test", 8, training=False, max_shift=max_shift, seed=2, take=24
        )
        assert not np.array_equal(collect(other)[0]["image"], inputs["image"])


def test_expanded_mnist_training_reshuffles_and_retranslates(tfds_data_dir):
    take = 24
    originals = load_mnist_arrays("train")[0][:take]

    def epochs(seed):
        dataset, spec = make_expanded_mnist_dataset(
            "train", 8, training=True, seed=seed, take=take, reconstruction=False
        )
        assert spec.num_examples == 60_000
        return [collect(dataset)[0]["image"] for _ in range(2)]

    first = epochs(5)
    placed = []
    for images in first:
        found = [placements(image, originals) for image in images]
        assert all(len(f) == 1 for f in found)
        assert sorted(f[0][0] for f in found) == list(range(take))
        assert all(abs(f[0][1] - 6) <= 6 and abs(f[0][2] - 6) <= 6 for f in found)
        placed.append({f[0][0]: f[0][1:] for f in found})
    moved = sum(placed[0][i] != placed[1][i] for i in range(take))
    assert moved > take // 2  # new translations every epoch (1/169 chance to repeat)
    second = epochs(5)
    np.testing.assert_array_equal(first[0], second[0])
    np.testing.assert_array_equal(first[1], second[1])


def test_expanded_mnist_rejects_bad_arguments():
    with pytest.raises(ValueError, match="pad"):
        make_expanded_mnist_dataset("test", 8, training=False, pad=-1)
    with pytest.raises(ValueError, match="batch_size"):
        make_expanded_mnist_dataset("test", 0, training=False)


# ---------------------------------------------------------------- affine transforms


def test_warp_digit_matches_scipy_reference_and_exact_cases(tfds_data_dir):
    digit = load_mnist_arrays("test")[0][0]
    cases = [
        (15.0, 0.1, 1.1, 0.9, 2.5, -3.25),
        (-20.0, -0.2, 0.8, 1.2, -4.0, 5.5),
        (7.0, 0.0, 1.0, 1.0, 0.0, 0.0),
    ]
    for params in cases:
        out = warp_digit(digit, *params).numpy()
        assert out.shape == (40, 40, 1) and out.dtype == np.float32
        reference = reference_warp(digit, *params, size=40)
        np.testing.assert_allclose(out[..., 0], reference, atol=2e-4)
    # Integer translation alone: the digit pasted at (6 + ty, 6 + tx).
    out = warp_digit(digit, 0.0, 0.0, 1.0, 1.0, 3.0, -5.0).numpy()[..., 0]
    np.testing.assert_allclose(out, place_digit(digit / 255.0, 9, 1, 40), atol=1e-6)
    # 90 degrees turns the centred digit clockwise on screen, as np.rot90(k=-1).
    out = warp_digit(digit, 90.0, 0.0, 1.0, 1.0, 0.0, 0.0).numpy()[..., 0]
    np.testing.assert_allclose(out, np.rot90(place_digit(digit / 255.0, 6, 6, 40), -1), atol=1e-5)
    # Scaling columns by 2 about the centre 19.5: a bar over columns 10..29
    # of the centred canvas covers 19.5 + 2 * (c - 19.5), i.e. 0.5..38.5.
    bar = np.zeros((28, 28), np.uint8)
    bar[10:18, 4:24] = 255
    out = warp_digit(bar, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0).numpy()[..., 0]
    expected = np.zeros((40, 40), np.float32)
    expected[16:24, 1:39] = 1.0
    expected[16:24, [0, 39]] = 0.75  # read at columns 9.75 and 29.25
    np.testing.assert_allclose(out, expected, atol=1e-5)


def test_translation_bounds_are_exact_for_the_identity(tfds_data_dir):
    digit = load_mnist_arrays("test")[0][3]
    rows = np.flatnonzero(digit.any(axis=1)) + 6
    cols = np.flatnonzero(digit.any(axis=0)) + 6
    bounds = [b.numpy() for b in affine_translation_bounds(digit, 0.0, 0.0, 1.0, 1.0)]
    # The ink box widened by one pixel (bilinear reach) must stay in 0..39.
    expected = [-(rows[0] - 1), 39 - (rows[-1] + 1), -(cols[0] - 1), 39 - (cols[-1] + 1)]
    np.testing.assert_allclose(bounds, expected, atol=1e-4)
    inside = warp_digit(digit, 0.0, 0.0, 1.0, 1.0, bounds[1], bounds[2]).numpy()
    np.testing.assert_allclose(inside.sum(), digit.sum() / 255.0, rtol=1e-5)
    clipped = warp_digit(digit, 0.0, 0.0, 1.0, 1.0, bounds[1] + 2.0, bounds[2]).numpy()
    assert clipped.sum() < digit.sum() / 255.0 - 0.1


def test_affine_transform_ranges_determinism_and_no_clipping(tfds_data_dir):
    digits = load_mnist_arrays("test")[0][:64]
    warped, params = affine_transform(digits, seed=3, return_parameters=True)
    warped = warped.numpy()
    assert warped.shape == (64, 40, 40, 1) and warped.dtype == np.float32
    assert warped.min() >= 0.0 and warped.max() <= 1.0
    assert np.abs(params["rotation"]).max() <= 20.0 and np.abs(params["rotation"]).max() > 15.0
    assert np.abs(params["shear"]).max() <= 0.2 and np.abs(params["shear"]).max() > 0.15
    for key in ("scale_y", "scale_x"):
        assert 0.8 <= params[key].min() < 0.85 and 1.15 < params[key].max() <= 1.2
    assert np.abs(params["translate_x"]).max() > 5  # real translations
    # Same seed, same set (also computed in two chunks); another seed differs.
    np.testing.assert_array_equal(affine_transform(digits, seed=3).numpy(), warped)
    chunk = affine_transform(digits[32:], seed=3, first_index=32).numpy()
    np.testing.assert_array_equal(chunk, warped[32:])
    assert not np.allclose(affine_transform(digits[:8], seed=4).numpy(), warped[:8])
    for k in range(0, 64, 4):
        p = [params[n][k] for n in ("rotation", "shear", "scale_y", "scale_x",
                                    "translate_y", "translate_x")]
        # The scipy reference on a 100x100 canvas: its centre is 30 pixels
        # further, so the 40x40 result is its window [30:70, 30:70]; all of
        # the digit's ink must lie inside that window (nothing clipped).
        big = reference_warp(digits[k], *p, size=100)
        np.testing.assert_allclose(warped[k, ..., 0], big[30:70, 30:70], atol=2e-4)
        assert np.abs(big).sum() - np.abs(big[30:70, 30:70]).sum() < 1e-4
        # The digit was really transformed, not just pasted.
        assert not np.allclose(warped[k, ..., 0], place_digit(digits[k] / 255.0, 6, 6, 40))


def test_generated_affnist_dataset(tfds_data_dir):
    dataset, spec = make_affnist_dataset(8, seed=3, take=20)
    assert spec.name == "affnist" and spec.image_shape == (40, 40, 1)
    assert spec.num_examples == 10_000 and spec.num_classes == 10
    inputs, targets = collect(dataset)
    images, labels = load_mnist_arrays("test")
    np.testing.assert_array_equal(inputs["label"], labels[:20])
    np.testing.assert_array_equal(targets["reconstruction"], inputs["image"])
    # Example k is image k under the transform of seed (3, k).
    np.testing.assert_allclose(
        inputs["image"], affine_transform(images[:20], seed=3).numpy(), atol=1e-6
    )
    tf.random.set_seed(77)  # independent of the global seed
    again, _ = make_affnist_dataset(8, seed=3, take=20, reconstruction=False)
    x, y = collect(again)
    assert set(x) == {"image"} and set(y) == {"length"}
    np.testing.assert_array_equal(x["image"], inputs["image"])


# ---------------------------------------------------------------- real affNIST files


def synthetic_affnist(count, seed=0):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(count, 40, 40), dtype=np.uint8)
    labels = rng.integers(0, 10, size=count).astype(np.uint8)
    return images, labels


def write_mat(path, images, labels):
    """The official layout: `image` [1600, N], one row-major 40x40 image per column."""
    columns = images.reshape(len(images), 1600).T
    assert np.array_equal(columns[:, 1].reshape(40, 40), images[1])
    scipy.io.savemat(
        path, {"affNISTdata": {"image": columns, "label_int": labels[None, :]}}
    )


def test_reads_mat_files_directories_and_npz(tmp_path):
    images, labels = synthetic_affnist(12)
    write_mat(tmp_path / "test.mat", images, labels)
    read_images, read_labels = load_affnist(tmp_path / "test.mat")
    assert read_images.dtype == np.uint8 and read_labels.dtype == np.int32
    np.testing.assert_array_equal(read_images, images)  # not transposed
    np.testing.assert_array_equal(read_labels, labels)
    # A directory of batches is read in numeric order: 1, 2, 10.
    batches = tmp_path / "test_batches"
    batches.mkdir()
    for name, part in (("1", slice(0, 4)), ("2", slice(4, 8)), ("10", slice(8, 12))):
        write_mat(batches / f"{name}.mat", images[part], labels[part])
    np.testing.assert_array_equal(load_affnist(batches)[0], images)
    np.testing.assert_array_equal(load_affnist(batches)[1], labels)
    np.savez(tmp_path / "affnist.npz", images=images, labels=labels)
    np.testing.assert_array_equal(load_affnist(str(tmp_path / "affnist.npz"))[0], images)


def test_real_affnist_dataset_from_a_file(tmp_path):
    images, labels = synthetic_affnist(10, seed=1)
    write_mat(tmp_path / "test.mat", images, labels)
    dataset, spec = make_affnist_dataset(4, path=str(tmp_path / "test.mat"))
    assert spec.num_examples == 10 and spec.image_shape == (40, 40, 1)
    inputs, targets = collect(dataset)
    np.testing.assert_allclose(inputs["image"][..., 0], images / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(targets["length"], labels)
    dataset, _ = make_affnist_dataset(4, path=str(tmp_path / "test.mat"), take=6)
    assert len(collect(dataset)[0]["image"]) == 6


def test_clear_errors_for_missing_or_malformed_files(tmp_path):
    missing = tmp_path / "nowhere" / "test.mat"
    with pytest.raises(FileNotFoundError, match="nowhere.*affNISTdata"):
        load_affnist(missing)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        make_affnist_dataset(8, path=str(missing))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="No .mat files"):
        load_affnist(empty)
    garbage = tmp_path / "garbage.mat"
    garbage.write_bytes(b"not a matlab file at all" * 10)
    with pytest.raises(ValueError, match="garbage.mat.*affNISTdata"):
        load_affnist(garbage)
    other = tmp_path / "other.mat"
    scipy.io.savemat(other, {"images": np.zeros((3, 40, 40), np.uint8)})
    with pytest.raises(ValueError, match="other.mat.*no struct `affNISTdata`"):
        load_affnist(other)
    wrong = tmp_path / "wrong.mat"
    scipy.io.savemat(
        wrong,
        {"affNISTdata": {"image": np.zeros((784, 3), np.uint8), "label_int": np.zeros((1, 3))}},
    )
    with pytest.raises(ValueError, match=r"wrong.mat.*\(784, 3\)"):
        load_affnist(wrong)
    bad_labels = tmp_path / "labels.npz"
    np.savez(bad_labels, images=np.zeros((2, 40, 40), np.uint8), labels=np.array([3, 12]))
    with pytest.raises(ValueError, match="labels outside"):
        load_affnist(bad_labels)
    keys = tmp_path / "keys.npz"
    np.savez(keys, x=np.zeros(3))
    with pytest.raises(ValueError, match="keys.npz.*`images` and `labels`"):
        load_affnist(keys)
    broken = tmp_path / "broken.npz"
    broken.write_bytes(b"PK but not really a zip archive")
    with pytest.raises(ValueError, match="broken.npz.*images"):
        load_affnist(broken)
    text = tmp_path / "affnist.txt"
    text.write_text("hello")
    with pytest.raises(ValueError, match="Unknown affNIST file type"):
        load_affnist(text)


def test_missing_scipy_names_the_extra(tmp_path, monkeypatch):
    """Without SciPy a .mat file stops with the install command, not a traceback."""
    from capsnet_tf.extras import MissingDependencyError

    path = tmp_path / "test.mat"
    scipy.io.savemat(path, {"affNISTdata": {"image": np.zeros((1600, 1), np.uint8)}})
    monkeypatch.setitem(sys.modules, "scipy.io", None)  # import scipy.io now fails
    with pytest.raises(MissingDependencyError, match=r'pip install -e "\.\[affnist\]"'):
        load_affnist(str(path))
