"""Expanded MNIST and affNIST: robustness to affine transformations.

Section 5.2 of Sabour et al. (2017) trains on "expanded MNIST" (MNIST padded
to 40x40 and translated at random, the official `--shift=6 --pad=6`) and
tests, without further training, on affNIST: the MNIST test digits under
random small affine transformations on a 40x40 canvas.

This module provides:

- `make_expanded_mnist_dataset`: the 40x40 translated MNIST;
- `make_affnist_dataset`: the real affNIST test set read from its files
  (`load_affnist`), or an affNIST-style test set generated from the MNIST
  test split with affNIST's ranges of rotation, shear and scale
  (`affine_transform`, `warp_digit`), fixed by a seed.
"""

import glob
import math
import os
import re

import numpy as np
import tensorflow as tf

from capsnet_tf.data.multimnist import load_mnist_arrays
from capsnet_tf.data.pipeline import random_shift
from capsnet_tf.data.spec import DatasetSpec
from capsnet_tf.extras import require

__all__ = [
    "affine_transform",
    "affnist_parameters",
    "affine_translation_bounds",
    "load_affnist",
    "make_affnist_dataset",
    "make_expanded_mnist_dataset",
    "warp_digit",
]

_NUM_CLASSES = 10
_AFFNIST_SIZE = 40
# affNIST's ranges: rotation within 20 degrees, shear within 0.2, each axis' scale 0.8-1.2.
_AFFNIST_RANGES = (20.0, 0.2, 0.8, 1.2)
_AFFNIST_FORMAT = (
    "Expected the official affNIST MATLAB files (a `.mat` file such as `test.mat` or "
    "`test_batches/1.mat`, or a directory of them, holding a struct `affNISTdata` with "
    "`image` uint8 [1600, N], one 40x40 image per column in row-major order, and "
    "`label_int` [1, N]), or a `.npz` file with `images` uint8 [N, 40, 40] and "
    "`labels` [N]."
)


def _model_format(image, label, reconstruction):
    if reconstruction:
        return {"image": image, "label": label}, {"length": label, "reconstruction": image}
    return {"image": image}, {"length": label}


def _finish(dataset, batch_size, reconstruction):
    dataset = dataset.map(
        lambda image, label: _model_format(image, label, reconstruction),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    return dataset.batch(batch_size).prefetch(tf.data.AUTOTUNE)


def _check_batch_and_take(batch_size, take):
    if batch_size < 1:
        raise ValueError(f"`batch_size` must be >= 1. Received: batch_size={batch_size}")
    if take is not None and take < 1:
        raise ValueError(f"`take` must be None or >= 1. Received: take={take}")


# --------------------------------------------------------------------------
# Expanded MNIST.


def make_expanded_mnist_dataset(
    split,
    batch_size,
    training,
    seed=0,
    pad=6,
    max_shift=6,
    data_dir=None,
    reconstruction=True,
    take=None,
    shuffle_buffer=10_000,
):
    """Expanded MNIST: digits padded to `28 + 2 * pad` and translated at random.

    As the official release's `--pad=6 --shift=6`: each digit is padded with
    `pad` zero pixels on every side (40x40 by default), then translated by
    integer offsets uniform in `[-max_shift, max_shift]` along each axis, with
    zero fill (`capsnet_tf.data.random_shift`). With `max_shift <= pad` no ink
    is ever lost; a larger `max_shift` may clip the digit, as in the official
    release.

    - Training: reshuffled every epoch; a new translation every epoch
      (deterministic for a given `seed` and TensorFlow global seed).
    - Evaluation: in split order, each image translated by a fixed random
      offset, a stateless function of `(seed, index)`: the expanded MNIST
      test set is translated too, and identical across epochs and processes.

    Elements are `({"image": float32 [S, S, 1], "label": int32},
    {"length": label, "reconstruction": image})`, without the label input
    and the reconstruction target when `reconstruction` is false.

    Args:
        split: TFDS split of `mnist`.
        batch_size: examples per batch; the last batch may be smaller.
        training: shuffle and draw new translations each epoch.
        seed: seed of the order and the translations.
        pad: zero pixels added on each side (official: 6).
        max_shift: maximum translation in pixels (official: 6).
        data_dir: TFDS data directory.
        reconstruction: include the label input and the image target.
        take: keep only the first `take` images of the split.
        shuffle_buffer: shuffle buffer size.

    Returns:
        `(dataset, spec)`, `spec` named `"expanded_mnist"` with image shape
        `(S, S, 1)` and the number of images of the split.

    Example:

    ```python
    train, spec = make_expanded_mnist_dataset("train", 128, training=True)
    assert spec.image_shape == (40, 40, 1)
    ```

    Reference:
        Sabour et al., 2017, arXiv:1710.09829, section 5.2.
    """
    _check_batch_and_take(batch_size, take)
    if pad < 0:
        raise ValueError(f"`pad` must be >= 0. Received: pad={pad}")
    if max_shift < 0:
        raise ValueError(f"`max_shift` must be >= 0. Received: max_shift={max_shift}")
    images, labels = load_mnist_arrays(split, data_dir)
    num_images = len(labels)
    count = num_images if take is None else min(take, num_images)
    images_t, labels_t = tf.constant(images), tf.constant(labels)

    def example(index, pair):
        image = tf.cast(images_t[index], tf.float32)[..., None] / 255.0
        image = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]])
        return random_shift(image, max_shift, pair), labels_t[index]

    indices = tf.data.Dataset.range(count)
    if training:
        indices = indices.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
        seeds = tf.data.Dataset.random(seed=seed + 7919, rerandomize_each_iteration=True)
        dataset = tf.data.Dataset.zip(indices, seeds).map(
            lambda index, value: example(index, tf.stack([value, index])),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
    else:
        dataset = indices.map(
            lambda index: example(index, tf.stack([tf.constant(seed, tf.int64), index])),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
    size = 28 + 2 * pad
    spec = DatasetSpec(
        name="expanded_mnist",
        image_shape=(size, size, 1),
        num_classes=_NUM_CLASSES,
        num_examples=num_images,
    )
    return _finish(dataset, batch_size, reconstruction), spec


# --------------------------------------------------------------------------
# affNIST-style affine transformations.


def _linear_part(rotation, shear, scale_y, scale_x):
    """The 2x2 matrix `R(rotation) @ Shear(shear) @ diag(scale_x, scale_y)` on (x, y)."""
    theta = rotation * (math.pi / 180.0)
    cos, sin = tf.cos(theta), tf.sin(theta)
    rotate = tf.stack([tf.stack([cos, -sin]), tf.stack([sin, cos])])
    shear_matrix = tf.stack([tf.stack([1.0, shear]), tf.stack([0.0, 1.0])])
    scale = tf.stack([tf.stack([scale_x, 0.0]), tf.stack([0.0, scale_y])])
    return rotate @ shear_matrix @ scale


def _centred(image, canvas_size):
    """`image` (uint8 or float, [h, w] or [h, w, 1]) as float32 [S, S] centred on the canvas."""
    image = tf.convert_to_tensor(image)
    if image.shape.rank == 3:
        image = image[..., 0]
    if image.dtype == tf.uint8:
        image = tf.cast(image, tf.float32) / 255.0
    image = tf.cast(image, tf.float32)
    height, width = image.shape
    if height > canvas_size or width > canvas_size:
        raise ValueError(
            f"A {height}x{width} image does not fit a {canvas_size}x{canvas_size} canvas."
        )
    top, left = (canvas_size - height) // 2, (canvas_size - width) // 2
    return tf.pad(
        image, [[top, canvas_size - height - top], [left, canvas_size - width - left]]
    )


def _ink_box(canvas):
    """`(y_min, y_max, x_min, x_max)` of the nonzero pixels, float32; the canvas if blank."""
    size = canvas.shape[0]
    rows = tf.reduce_any(canvas > 0, axis=1)
    cols = tf.reduce_any(canvas > 0, axis=0)

    def extent(mask):
        first = tf.argmax(tf.cast(mask, tf.int32), output_type=tf.int32)
        last = size - 1 - tf.argmax(tf.cast(mask[::-1], tf.int32), output_type=tf.int32)
        blank = tf.logical_not(tf.reduce_any(mask))
        return (
            tf.cast(tf.where(blank, 0, first), tf.float32),
            tf.cast(tf.where(blank, size - 1, last), tf.float32),
        )

    y_min, y_max = extent(rows)
    x_min, x_max = extent(cols)
    return y_min, y_max, x_min, x_max


def affine_translation_bounds(image, rotation, shear, scale_y, scale_x, canvas_size=40):
    """The translations that keep a transformed digit wholly inside the canvas.

    The digit's ink bounding box on the centred canvas, widened by one pixel
    on every side (the reach of bilinear interpolation), is mapped through
    the linear part of the transform (see `warp_digit`); the translation
    `(ty, tx)` keeps its image inside `[0, canvas_size - 1]` on both axes
    exactly when `low <= t <= high`. When the transformed digit is larger
    than the canvas, `low == high` is the translation that centres it.

    Args:
        image: the digit, uint8 (scaled by 1/255) or float, `[h, w]` or
            `[h, w, 1]`.
        rotation, shear, scale_y, scale_x: as in `warp_digit`.
        canvas_size: side of the square canvas.

    Returns:
        float32 tensors `(low_y, high_y, low_x, high_x)`.
    """
    canvas = _centred(image, canvas_size)
    linear = _linear_part(
        *(tf.cast(v, tf.float32) for v in (rotation, shear, scale_y, scale_x))
    )
    y_min, y_max, x_min, x_max = _ink_box(canvas)
    centre = (canvas_size - 1) / 2.0
    corners = tf.stack(
        [
            tf.stack([x_min - 1.0, x_max + 1.0, x_min - 1.0, x_max + 1.0]),
            tf.stack([y_min - 1.0, y_min - 1.0, y_max + 1.0, y_max + 1.0]),
        ]
    )
    moved = linear @ (corners - centre) + centre  # [2 (x, y), 4 corners]
    low = -tf.reduce_min(moved, axis=1)
    high = (canvas_size - 1.0) - tf.reduce_max(moved, axis=1)
    middle = (low + high) / 2.0
    low, high = tf.minimum(low, middle), tf.maximum(high, middle)
    return low[1], high[1], low[0], high[0]


def warp_digit(
    image, rotation, shear, scale_y, scale_x, translate_y, translate_x, canvas_size=40
):
    """One affine transformation of a digit centred on a square canvas.

    The digit is first centred on a `canvas_size` canvas (28x28 MNIST gets 6
    zero pixels on each side of a 40x40 canvas). With pixel coordinates
    `p = (x, y)` (x: column, to the right; y: row, downwards; pixel centres
    at integers) and `c = ((S - 1) / 2, (S - 1) / 2)` the canvas centre, the
    pixel of the input at `p` moves to

        p' = R @ H @ D @ (p - c) + c + t,

    applied in this order: `D = diag(scale_x, scale_y)` scales each axis, then
    `H = [[1, shear], [0, 1]]` shears horizontally (`x += shear * y`), then
    `R = [[cos a, -sin a], [sin a, cos a]]` rotates by `a = rotation` degrees
    (clockwise as displayed, since y points down), and finally
    `t = (translate_x, translate_y)` translates. The output is sampled by
    inverse mapping with bilinear interpolation and zero fill
    (`tf.raw_ops.ImageProjectiveTransformV3`).

    Args:
        image: `[h, w]` or `[h, w, 1]`, uint8 (scaled by 1/255) or float.
        rotation: angle in degrees.
        shear: horizontal shear factor.
        scale_y, scale_x: scale factors of the rows and the columns.
        translate_y, translate_x: translation in pixels (down, right).
        canvas_size: side of the output canvas.

    Returns:
        float32 `[canvas_size, canvas_size, 1]`.

    Example:

    >>> import numpy as np
    >>> out = warp_digit(np.ones((28, 28), np.uint8) * 255, 0.0, 0.0, 1.0, 1.0, 2.0, -3.0)
    >>> out.shape
    TensorShape([40, 40, 1])
    """
    canvas = _centred(image, canvas_size)
    values = (rotation, shear, scale_y, scale_x, translate_y, translate_x)
    rotation, shear, scale_y, scale_x, translate_y, translate_x = (
        tf.cast(v, tf.float32) for v in values
    )
    inverse = tf.linalg.inv(_linear_part(rotation, shear, scale_y, scale_x))
    centre = tf.fill([2], (canvas_size - 1) / 2.0)
    shifted_centre = centre + tf.stack([translate_x, translate_y])
    # Output point q comes from input point inverse @ (q - c - t) + c.
    offset = centre - tf.linalg.matvec(inverse, shifted_centre)
    transform = tf.stack(
        [inverse[0, 0], inverse[0, 1], offset[0], inverse[1, 0], inverse[1, 1], offset[1], 0.0, 0.0]
    )
    warped = tf.raw_ops.ImageProjectiveTransformV3(
        images=canvas[None, :, :, None],
        transforms=transform[None],
        output_shape=tf.constant([canvas_size, canvas_size], tf.int32),
        fill_value=tf.constant(0.0),
        interpolation="BILINEAR",
        fill_mode="CONSTANT",
    )
    return tf.clip_by_value(warped[0], 0.0, 1.0)


def _random_warp(image, pair, max_rotation, max_shear, min_scale, max_scale, canvas_size):
    """`warp_digit` with affNIST-style parameters drawn statelessly from `pair`."""
    u = tf.random.stateless_uniform([6], tf.cast(pair, tf.int64), dtype=tf.float32)
    rotation = (2.0 * u[0] - 1.0) * max_rotation
    shear = (2.0 * u[1] - 1.0) * max_shear
    scale_y = min_scale + u[2] * (max_scale - min_scale)
    scale_x = min_scale + u[3] * (max_scale - min_scale)
    low_y, high_y, low_x, high_x = affine_translation_bounds(
        image, rotation, shear, scale_y, scale_x, canvas_size
    )
    translate_y = low_y + u[4] * (high_y - low_y)
    translate_x = low_x + u[5] * (high_x - low_x)
    warped = warp_digit(
        image, rotation, shear, scale_y, scale_x, translate_y, translate_x, canvas_size
    )
    parameters = tf.stack([rotation, shear, scale_y, scale_x, translate_y, translate_x])
    return warped, parameters


_PARAMETER_NAMES = ("rotation", "shear", "scale_y", "scale_x", "translate_y", "translate_x")


def affine_transform(
    images,
    seed,
    max_rotation=20.0,
    max_shear=0.2,
    min_scale=0.8,
    max_scale=1.2,
    canvas_size=40,
    first_index=0,
    return_parameters=False,
):
    """Random affNIST-style transformations of digits, fixed by a seed.

    Image `i` gets parameters drawn uniformly, with stateless random ops
    seeded by `(seed, first_index + i)`: a rotation in
    `[-max_rotation, max_rotation]` degrees, a shear in
    `[-max_shear, max_shear]`, scales in `[min_scale, max_scale]` for each
    axis independently (affNIST's ranges: 20 degrees, 0.2, 0.8-1.2), then a
    translation uniform over the range that keeps the whole transformed digit
    inside the canvas (`affine_translation_bounds`). The transform order is
    the one of `warp_digit`: scale, shear, rotate about the canvas centre,
    translate. So `affine_transform(mnist_test, seed)[k]` is example `k` of
    `make_affnist_dataset(..., seed=seed)`'s generated test set.

    Args:
        images: `[N, h, w]` or `[N, h, w, 1]`, uint8 or float in [0, 1].
        seed: python int.
        max_rotation: degrees.
        max_shear: largest absolute horizontal shear.
        min_scale, max_scale: range of each axis' scale.
        canvas_size: side of the output canvas.
        first_index: index of `images[0]` in the whole set (for chunks).
        return_parameters: also return the parameters drawn.

    Returns:
        float32 `[N, canvas_size, canvas_size, 1]` in [0, 1]; with
        `return_parameters`, also a dict of float32 `[N]` NumPy arrays
        `rotation`, `shear`, `scale_y`, `scale_x`, `translate_y`,
        `translate_x` (the arguments of `warp_digit` that give each image).

    Example:

    >>> import numpy as np
    >>> digits = np.zeros((2, 28, 28), np.uint8); digits[:, 8:20, 12:16] = 255
    >>> affine_transform(digits, seed=0).shape
    TensorShape([2, 40, 40, 1])
    """
    images = tf.convert_to_tensor(images)
    if images.shape.rank not in (3, 4) or not images.shape[0]:
        raise ValueError(
            f"`images` must be a non-empty [N, h, w] or [N, h, w, 1] batch. "
            f"Received: shape={images.shape}"
        )
    indices = tf.range(first_index, first_index + images.shape[0], dtype=tf.int64)
    seed = tf.constant(seed, tf.int64)

    def one(image, index):
        return _random_warp(
            image,
            tf.stack([seed, index]),
            max_rotation,
            max_shear,
            min_scale,
            max_scale,
            canvas_size,
        )

    # A tf.data map: traced once and run in parallel, unlike an eager map_fn.
    dataset = tf.data.Dataset.from_tensor_slices((images, indices))
    dataset = dataset.map(one, num_parallel_calls=tf.data.AUTOTUNE)
    warped, parameters = dataset.batch(max(int(images.shape[0]), 1)).get_single_element()
    if return_parameters:
        parameters = parameters.numpy()
        return warped, {name: parameters[:, i] for i, name in enumerate(_PARAMETER_NAMES)}
    return warped


# --------------------------------------------------------------------------
# The real affNIST files.


def _numeric_key(path):
    name = os.path.splitext(os.path.basename(path))[0]
    return (0, int(name), name) if re.fullmatch(r"\d+", name) else (1, 0, name)


def _read_mat(path):
    scipy_io = require("scipy.io", "affnist", "Reading affNIST .mat files")

    try:
        contents = scipy_io.loadmat(path)
    except Exception as error:  # scipy raises several types on a bad file
        raise ValueError(
            f"Could not read {path!r} as a MATLAB file ({error}). {_AFFNIST_FORMAT}"
        ) from None
    struct = contents.get("affNISTdata")
    names = getattr(getattr(struct, "dtype", None), "names", None) or ()
    if "image" not in names or "label_int" not in names:
        raise ValueError(
            f"{path!r} holds no struct `affNISTdata` with fields `image` and `label_int` "
            f"(found variables {sorted(k for k in contents if not k.startswith('__'))}). "
            f"{_AFFNIST_FORMAT}"
        )
    record = struct.reshape(-1)[0]
    image = np.asarray(record["image"])
    labels = np.asarray(record["label_int"]).reshape(-1)
    if image.ndim != 2 or image.shape[0] != _AFFNIST_SIZE**2 or image.shape[1] != labels.size:
        raise ValueError(
            f"{path!r}: `affNISTdata.image` has shape {image.shape} and `label_int` "
            f"{labels.size} labels; expected [1600, N] and N. {_AFFNIST_FORMAT}"
        )
    # Column n is image n, its 1600 pixels row after row.
    return image.T.reshape(-1, _AFFNIST_SIZE, _AFFNIST_SIZE), labels


def _read_npz(path):
    try:
        with np.load(path) as contents:
            arrays = {name: contents[name] for name in contents.files}
    except Exception as error:  # not a zip, pickled data, truncated, ...
        raise ValueError(
            f"Could not read {path!r} as a .npz file ({error}). {_AFFNIST_FORMAT}"
        ) from None
    if "images" not in arrays or "labels" not in arrays:
        raise ValueError(
            f"{path!r} has arrays {sorted(arrays)}, not `images` and `labels`. "
            f"{_AFFNIST_FORMAT}"
        )
    images, labels = arrays["images"], arrays["labels"]
    if images.ndim == 4 and images.shape[-1] == 1:
        images = images[..., 0]
    if images.ndim != 3 or images.shape[1:] != (_AFFNIST_SIZE, _AFFNIST_SIZE):
        raise ValueError(
            f"{path!r}: `images` has shape {images.shape}; expected [N, 40, 40]. {_AFFNIST_FORMAT}"
        )
    return images, np.asarray(labels).reshape(-1)


def load_affnist(path):
    """Reads the real affNIST test set (or any affNIST file) into memory.

    The official files (https://www.cs.toronto.edu/~tijmen/affNIST/) are
    MATLAB files holding a struct `affNISTdata`; its field `image` is a uint8
    `[1600, N]` matrix with one image per column, each the 40x40 image's
    pixels row after row (so image `n` is `image[:, n].reshape(40, 40)`),
    and `label_int` is `[1, N]` with the digit classes. `test.mat` holds the
    320,000 test images; `test_batches/1.mat` ... `32.mat` hold 10,000 each.

    Args:
        path: a `.mat` file, a directory of `.mat` files (read in numeric
            order of their names: `1.mat`, `2.mat`, ..., `32.mat`), or a
            `.npz` file with `images` uint8 `[N, 40, 40]` and `labels` `[N]`.

    Returns:
        `(images, labels)`: uint8 `[N, 40, 40]` and int32 `[N]`.

    Raises:
        FileNotFoundError: `path` does not exist, or is a directory without
            `.mat` files.
        ValueError: a file is not in one of the formats above, or holds
            pixels outside 0..255 or labels outside 0..9.
    """
    path = os.path.expanduser(str(path))
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"affNIST data not found: {path!r} does not exist. {_AFFNIST_FORMAT}"
        )
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, "*.mat")), key=_numeric_key)
        if not files:
            raise FileNotFoundError(f"No .mat files in the directory {path!r}. {_AFFNIST_FORMAT}")
        parts = [_read_mat(file) for file in files]
        images = np.concatenate([p[0] for p in parts])
        labels = np.concatenate([p[1] for p in parts])
    elif path.lower().endswith(".mat"):
        images, labels = _read_mat(path)
    elif path.lower().endswith(".npz"):
        images, labels = _read_npz(path)
    else:
        raise ValueError(f"Unknown affNIST file type: {path!r}. {_AFFNIST_FORMAT}")
    if len(images) != len(labels):
        raise ValueError(
            f"{path!r}: {len(images)} images but {len(labels)} labels. {_AFFNIST_FORMAT}"
        )
    if images.size and (images.min() < 0 or images.max() > 255):
        raise ValueError(f"{path!r}: pixel values outside 0..255. {_AFFNIST_FORMAT}")
    if labels.size and (labels.min() < 0 or labels.max() >= _NUM_CLASSES):
        raise ValueError(f"{path!r}: labels outside 0..9. {_AFFNIST_FORMAT}")
    return images.astype(np.uint8), labels.astype(np.int32)


def make_affnist_dataset(
    batch_size, seed=0, data_dir=None, path=None, reconstruction=True, take=None, copies=1
):
    """The affNIST test set, real (`path`) or generated from MNIST, 40x40.

    With `path`, the real affNIST data (`load_affnist`) in file order. Without,
    an affNIST-style set made from the 10,000 MNIST test images: `copies`
    transformations of each, example `k` being MNIST test image `k // copies`
    transformed by `affine_transform` with the stateless seed `(seed, k)`
    (rotation within 20 degrees, shear within 0.2, scale 0.8-1.2 per axis,
    then a translation keeping the digit inside the canvas): fixed by `seed`,
    identical across epochs and processes. affNIST's own test set holds 32
    transformed copies of each MNIST test digit (320,000 images), the paper's
    protocol; `copies=1` (one per digit) is the quick set training evaluates.
    The generated set is a stand-in with affNIST's ranges, not affNIST
    itself: report which was used.

    Elements are `({"image": float32 [40, 40, 1] in [0, 1], "label": int32},
    {"length": label, "reconstruction": image})`, without the label input
    and the reconstruction target when `reconstruction` is false.

    Args:
        batch_size: examples per batch; the last batch may be smaller.
        seed: seed of the generated transformations.
        data_dir: TFDS data directory holding MNIST (generated set).
        path: the real affNIST data; see `load_affnist`.
        reconstruction: include the label input and the image target.
        take: keep only the first `take` examples.
        copies: generated set: transformations of each MNIST test digit
            (affNIST: 32). Must be 1 with `path`.

    Returns:
        `(dataset, spec)`, `spec` named `"affnist"`, image shape
        `(40, 40, 1)`, 10 classes, `num_examples` `10,000 * copies`
        (generated) or the number of images read.

    Example:

    ```python
    test, spec = make_affnist_dataset(128, path="~/data/affNIST/test.mat")
    model.evaluate(test)
    ```

    Reference:
        Sabour et al., 2017, arXiv:1710.09829, section 5.2.
    """
    _check_batch_and_take(batch_size, take)
    if not isinstance(copies, int) or isinstance(copies, bool) or copies < 1:
        raise ValueError(f"`copies` must be a positive integer. Received: copies={copies!r}")
    if path is not None and copies != 1:
        raise ValueError(
            "`copies` applies to the generated set only; the real affNIST files already hold "
            f"their transformations. Received: copies={copies} with path={path!r}"
        )
    if path is not None:
        images, labels = load_affnist(path)
        images_t, labels_t = tf.constant(images), tf.constant(labels)

        def example(index):
            image = tf.cast(images_t[index], tf.float32)[..., None] / 255.0
            return image, labels_t[index]

    else:
        images, labels = load_mnist_arrays("test", data_dir)
        images_t, labels_t = tf.constant(images), tf.constant(labels)
        seed_t = tf.constant(seed, tf.int64)

        def example(index):
            digit = index // copies
            warped, _ = _random_warp(
                images_t[digit], tf.stack([seed_t, index]), *_AFFNIST_RANGES, _AFFNIST_SIZE
            )
            return warped, labels_t[digit]

    num_examples = len(labels) * copies
    count = num_examples if take is None else min(take, num_examples)
    dataset = tf.data.Dataset.range(count).map(example, num_parallel_calls=tf.data.AUTOTUNE)
    spec = DatasetSpec(
        name="affnist",
        image_shape=(_AFFNIST_SIZE, _AFFNIST_SIZE, 1),
        num_classes=_NUM_CLASSES,
        num_examples=num_examples,
    )
    return _finish(dataset, batch_size, reconstruction), spec


def affnist_parameters(seed=0, copies=32, data_dir=None, take=None):
    """The transformation of every example of `make_affnist_dataset`'s generated set, in order.

    The same draws as the data set's (`seed`, `copies`, `take` as there), so
    a score of example `k` can be read against the transformation that made
    it (e.g. how far it was moved: expanded MNIST trains on shifts of at most
    6 px).

    Returns:
        A dict of float32 `[N]` NumPy arrays `rotation`, `shear`, `scale_y`,
        `scale_x`, `translate_y`, `translate_x` (see `affine_transform`).
    """
    images, _ = load_mnist_arrays("test", data_dir)
    images_t, seed_t = tf.constant(images), tf.constant(seed, tf.int64)
    count = len(images) * copies if take is None else min(take, len(images) * copies)

    def parameters(index):
        return _random_warp(
            images_t[index // copies], tf.stack([seed_t, index]), *_AFFNIST_RANGES, _AFFNIST_SIZE,
        )[1]

    dataset = tf.data.Dataset.range(count).map(parameters, num_parallel_calls=tf.data.AUTOTUNE)
    drawn = np.concatenate([batch.numpy() for batch in dataset.batch(10_000)])
    return {name: drawn[:, i] for i, name in enumerate(_PARAMETER_NAMES)}

