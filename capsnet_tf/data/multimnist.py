"""MultiMNIST: two overlapping MNIST digits of different classes on one canvas.

The data set of the paper's section 6 (Sabour et al., 2017), generated on the
fly from MNIST as the official release's `input_data/mnist/mnist_shift.py`
does offline: each 28x28 digit is placed on a `28 + 2 * max_shift` canvas
(36x36 for the paper's 4 pixels) at an independent random integer offset in
`[0, 2 * max_shift]` along each axis (a shift of `[-max_shift, max_shift]`
around the centre), and two such canvases holding digits of different classes
are merged pixel-wise as `min(a + b, 1)`.

Decoded MNIST is held in memory once per split (`load_mnist_arrays`); the
`tf.data` pipelines index into it with stateless random ops, so every example
is a pure function of its seed.
"""

import functools

import numpy as np
import tensorflow as tf

from capsnet_tf.data.pipeline import load_tfds_split, resolve_data_dir
from capsnet_tf.data.spec import DatasetSpec

__all__ = [
    "load_mnist_arrays",
    "make_multimnist_dataset",
    "merge_digits",
    "place_digit",
]

_NUM_CLASSES = 10
_DIGIT_SIZE = 28


@functools.lru_cache(maxsize=4)
def _load_arrays(split, data_dir):
    dataset, _ = load_tfds_split("mnist", split, data_dir)
    images, labels = dataset.batch(1_000_000).get_single_element()
    images = images.numpy()[..., 0]
    labels = labels.numpy().astype(np.int32)
    images.flags.writeable = False
    labels.flags.writeable = False
    return images, labels


def load_mnist_arrays(split, data_dir=None):
    """The decoded MNIST images and labels of a split, as NumPy arrays.

    Decoded once per `(split, data_dir)` and kept in memory (about 47 MB for
    the training split); the arrays are read-only.

    Args:
        split: TFDS split of `mnist`, e.g. `"train"`, `"test"`, `"test[:100]"`.
        data_dir: TFDS data directory (see `capsnet_tf.data.resolve_data_dir`).

    Returns:
        `(images, labels)`: uint8 `[N, 28, 28]` and int32 `[N]`, in TFDS order.

    Raises:
        DatasetNotFoundError: MNIST is not prepared in `data_dir`.
    """
    return _load_arrays(split, resolve_data_dir(data_dir))


def place_digit(image, dy, dx, canvas_size):
    """NumPy: `image` on an empty square canvas with its top-left at `(dy, dx)`.

    Args:
        image: `[h, w]` or `[h, w, c]` array.
        dy, dx: offsets of the top-left corner, `0 <= dy <= canvas_size - h`
            (a MultiMNIST shift `s` in `[-max_shift, max_shift]` is the offset
            `s + max_shift`).
        canvas_size: side of the canvas.

    Returns:
        `[canvas_size, canvas_size, ...]` array of `image`'s dtype.

    Example:

    >>> place_digit(np.ones((2, 2)), 1, 0, 3)
    array([[0., 0., 0.],
           [1., 1., 0.],
           [1., 1., 0.]])
    """
    image = np.asarray(image)
    height, width = image.shape[:2]
    if not (0 <= dy <= canvas_size - height and 0 <= dx <= canvas_size - width):
        raise ValueError(
            f"A {height}x{width} image at offset ({dy}, {dx}) does not fit a "
            f"{canvas_size}x{canvas_size} canvas."
        )
    canvas = np.zeros((canvas_size, canvas_size) + image.shape[2:], image.dtype)
    canvas[dy : dy + height, dx : dx + width] = image
    return canvas


def merge_digits(first, second):
    """NumPy: the MultiMNIST merge of two canvases, `min(first + second, 1)`.

    The official release adds the uint8 images and clips at 255; on images
    scaled to [0, 1] that is `min(a + b, 1)`. Integer inputs are clipped at
    255 instead and keep their dtype.

    Args:
        first, second: arrays of the same shape, floats in [0, 1] or uint8.

    Returns:
        The merged array, of `first`'s dtype.

    Example:

    >>> merge_digits(np.array([0.25, 0.75], np.float32), np.array([0.5, 0.5], np.float32))
    array([0.75, 1.  ], dtype=float32)
    """
    first, second = np.asarray(first), np.asarray(second)
    if np.issubdtype(first.dtype, np.integer):
        total = first.astype(np.int32) + second.astype(np.int32)
        return np.minimum(total, 255).astype(first.dtype)
    return np.minimum(first + second, 1).astype(first.dtype)


def _class_index(labels):
    """Indices sorted by class, and each class's start and size in them."""
    order = np.argsort(labels, kind="stable").astype(np.int32)
    counts = np.bincount(labels, minlength=_NUM_CLASSES).astype(np.int32)
    if np.any(counts == 0):
        missing = np.flatnonzero(counts == 0).tolist()
        raise ValueError(f"MultiMNIST needs every class; classes {missing} have no image.")
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int32)
    return order, starts, counts


def _multimnist_example_fn(images, labels, max_shift):
    """`(index, seed) -> (canvas, label pair, digit canvases)` on `images`.

    `index` is the first digit; the partner's class is `(label + k) % 10`
    with `k` uniform in 1..9 (so uniform over the other classes), the partner
    uniform within that class; the four offsets are uniform in
    `[0, 2 * max_shift]`. All draws are stateless functions of `seed`.
    """
    order, starts, counts = (tf.constant(x) for x in _class_index(labels))
    images = tf.constant(images)
    labels = tf.constant(labels)
    canvas = _DIGIT_SIZE + 2 * max_shift

    def place(image, dy, dx):
        paddings = tf.stack([[dy, 2 * max_shift - dy], [dx, 2 * max_shift - dx]])
        placed = tf.pad(tf.cast(image, tf.float32) / 255.0, paddings)
        return tf.ensure_shape(placed, (canvas, canvas))[..., None]

    def example(index, seed):
        index = tf.cast(index, tf.int32)
        seeds = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), num=3)
        label = labels[index]
        step = tf.random.stateless_uniform([], seeds[0], minval=1, maxval=10, dtype=tf.int32)
        partner_class = (label + step) % _NUM_CLASSES
        within = tf.random.stateless_uniform(
            [], seeds[1], minval=0, maxval=counts[partner_class], dtype=tf.int32
        )
        partner = order[starts[partner_class] + within]
        offsets = tf.random.stateless_uniform(
            [4], seeds[2], minval=0, maxval=2 * max_shift + 1, dtype=tf.int32
        )
        first = place(images[index], offsets[0], offsets[1])
        second = place(images[partner], offsets[2], offsets[3])
        merged = tf.minimum(first + second, 1.0)
        return merged, tf.stack([label, labels[partner]]), tf.stack([first, second])

    return example


def make_multimnist_dataset(
    split,
    batch_size,
    training,
    seed=0,
    max_shift=4,
    test_pairs_per_image=1,
    data_dir=None,
    reconstruction=True,
    take=None,
    shuffle_buffer=10_000,
):
    """A batched MultiMNIST `tf.data` pipeline for CapsNet's `model.fit`.

    Each example overlays two MNIST digits of different classes taken from the
    same split, each shifted independently by up to `max_shift` pixels each
    way on a `28 + 2 * max_shift` canvas (36x36 by default), merged as
    `min(a + b, 1)` (see the module docstring).

    - Training (`training=True`): every image of the split is the first digit
      once per epoch, in an order reshuffled every epoch; its partner and all
      four offsets are drawn anew every epoch (`tf.data.Dataset.random` with
      `rerandomize_each_iteration`, deterministic for a given `seed` and
      TensorFlow global seed).
    - Evaluation (`training=False`): a fixed set of
      `num_images * test_pairs_per_image` examples; example `k` has image
      `k % num_images` as first digit and all its draws are stateless
      functions of `(seed, k)`, so the set is identical across epochs, calls
      and processes (the paper used 1,000 pairs per test image).

    Elements are `(inputs, targets)` with `inputs = {"image": float32
    [S, S, 1], "label": int32 [2]}` and `targets = {"length": int32 [2],
    "reconstruction": float32 [2, S, S, 1]}`: the two labels (first digit,
    second digit) and each digit alone on the canvas at its shift, which is
    what the official release reconstructs. With `reconstruction=False`:
    `({"image"}, {"length"})`.

    Args:
        split: `"train"` or `"test"` (any TFDS split of `mnist`).
        batch_size: examples per batch; the last batch may be smaller.
        training: random, reshuffled pairs (True) or the fixed test set.
        seed: seed of the order, the pairs and the shifts.
        max_shift: maximum shift of each digit in pixels (paper: 4).
        test_pairs_per_image: pairs per image when `training` is false.
        data_dir: TFDS data directory.
        reconstruction: include the label input and the digit targets.
        take: keep only the first `take` examples (smoke tests); in training
            the first digits come from the first `take` images only, the
            partners from the whole split.
        shuffle_buffer: shuffle buffer of the training order.

    Returns:
        `(dataset, spec)` with `spec` a `DatasetSpec` named `"multi_mnist"`,
        `num_targets=2`, `num_examples` the examples of one pass (before
        `take`).

    Example:

    ```python
    train, spec = make_multimnist_dataset("train", 128, training=True)
    test, _ = make_multimnist_dataset("test", 128, training=False, test_pairs_per_image=1000)
    ```

    Reference:
        Sabour et al., 2017, arXiv:1710.09829, section 6.
    """
    if batch_size < 1:
        raise ValueError(f"`batch_size` must be >= 1. Received: batch_size={batch_size}")
    if max_shift < 0:
        raise ValueError(f"`max_shift` must be >= 0. Received: max_shift={max_shift}")
    if test_pairs_per_image < 1:
        raise ValueError(
            "`test_pairs_per_image` must be >= 1. "
            f"Received: test_pairs_per_image={test_pairs_per_image}"
        )
    if take is not None and take < 1:
        raise ValueError(f"`take` must be None or >= 1. Received: take={take}")
    images, labels = load_mnist_arrays(split, data_dir)
    num_images = len(labels)
    example = _multimnist_example_fn(images, labels, max_shift)

    if training:
        num_examples = num_images
        indices = tf.data.Dataset.range(min(take or num_images, num_images))
        indices = indices.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
        # A seed of its own, so that the per-example seeds are not the
        # shuffle's random stream.
        seeds = tf.data.Dataset.random(seed=seed + 7919, rerandomize_each_iteration=True)
        dataset = tf.data.Dataset.zip(indices, seeds).map(
            lambda index, value: example(index % num_images, tf.stack([value, index])),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
    else:
        num_examples = num_images * test_pairs_per_image
        count = num_examples if take is None else min(take, num_examples)
        dataset = tf.data.Dataset.range(count).map(
            lambda k: example(k % num_images, tf.stack([tf.constant(seed, tf.int64), k])),
            num_parallel_calls=tf.data.AUTOTUNE,
        )

    def to_model_format(image, pair, digits):
        if reconstruction:
            return {"image": image, "label": pair}, {"length": pair, "reconstruction": digits}
        return {"image": image}, {"length": pair}

    dataset = dataset.map(to_model_format, num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.batch(batch_size).prefetch(tf.data.AUTOTUNE)
    size = _DIGIT_SIZE + 2 * max_shift
    spec = DatasetSpec(
        name="multi_mnist",
        image_shape=(size, size, 1),
        num_classes=_NUM_CLASSES,
        num_examples=num_examples,
        num_targets=2,
    )
    return dataset, spec
