"""The `tf.data` pipeline of an image-classification source: your folder or any TFDS set.

`make_image_pipeline` turns `(uint8 image, label)` pairs, decoded from files
(`capsnet_tf.data.folder`) or read from TFDS (`capsnet_tf.data.tfds_images`),
into CapsNet's batches: resize (when asked), keep in memory when the split fits
(`in_memory`; else decode every epoch), shuffle, augment (random shift, and
optionally horizontal flips), scale to [0, 1], batch and prefetch. The uint8
images are what is cached and shuffled (a quarter of float32's memory); the
scaling comes after.
"""

import math

import tensorflow as tf

from capsnet_tf.data.pipeline import check_pipeline_arguments, in_memory, random_shift

__all__ = [
    "IN_MEMORY_LIMIT_BYTES",
    "parse_image_size",
    "make_image_pipeline",
    "model_format",
    "resize_uint8",
]

# Splits up to this size (uint8 images) are decoded once and kept in memory.
IN_MEMORY_LIMIT_BYTES = 2 * 2**30


def parse_image_size(image_size):
    """`(height, width)` from `None`, `64`, `"64"`, `(64,)`, `("96", "128")`; None stays None.

    Raises:
        ValueError: not one or two positive integers.
    """
    if image_size is None:
        return None
    values = [image_size] if isinstance(image_size, (int, str)) else list(image_size)
    try:
        sizes = [int(value) for value in values]
    except (TypeError, ValueError):
        sizes = []
    if len(sizes) not in (1, 2) or min(sizes, default=0) < 1:
        raise ValueError(
            "`image_size` must be one positive integer (a square) or height,width, e.g. "
            f"64 or 96,128. Received: image_size={image_size!r}"
        )
    return (sizes[0], sizes[-1])


def resize_uint8(image, size):
    """Bilinear resize (antialiased when shrinking) of a uint8 image, back to uint8."""
    if size is None:
        return image
    resized = tf.image.resize(tf.cast(image, tf.float32), size, antialias=True)
    return tf.cast(tf.clip_by_value(tf.round(resized), 0.0, 255.0), tf.uint8)


def model_format(image, label, reconstruction):
    """`(inputs, targets)` of CapsNet's training model (see `capsnet_tf.models.capsnet`)."""
    if reconstruction:
        return {"image": image, "label": label}, {"length": label, "reconstruction": image}
    return {"image": image}, {"length": label}


def make_image_pipeline(
    examples,
    num_examples,
    image_shape,
    batch_size,
    training,
    shift=0,
    horizontal_flip=False,
    seed=0,
    reconstruction=True,
    shuffle_buffer=10_000,
    cache=None,
):
    """Batches for `model.fit` from `(uint8 [H, W, C] image, int label)` pairs.

    Args:
        examples: a finite `tf.data.Dataset` of decoded, already resized
            `(image, label)` pairs, all of `image_shape`, in a fixed order.
        num_examples: its number of elements.
        image_shape: `(height, width, channels)`.
        batch_size: examples per batch; the last batch may be smaller.
        training: shuffle (reshuffled every epoch, from `seed`) and augment.
        shift: training only: random translation of up to this many pixels.
        horizontal_flip: training only: mirror half of the images at random.
        seed: seed of the shuffle order and the augmentation.
        reconstruction: include the label input and the reconstruction target.
        shuffle_buffer: shuffle buffer size (capped at `num_examples`).
        cache: keep the decoded split in memory (None: when its uint8 images
            take at most `IN_MEMORY_LIMIT_BYTES`).

    Returns:
        A batched, prefetched `tf.data.Dataset` of `(inputs, targets)`.
    """
    check_pipeline_arguments(batch_size, None, shuffle_buffer)
    if shift < 0:
        raise ValueError(f"`shift` must be >= 0. Received: shift={shift}")
    if cache is None:
        cache = num_examples * math.prod(image_shape) <= IN_MEMORY_LIMIT_BYTES
    examples = examples.map(
        lambda image, label: (tf.ensure_shape(image, image_shape), tf.cast(label, tf.int32)),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    if cache:
        examples = in_memory(examples)
    if training:
        examples = examples.shuffle(
            min(shuffle_buffer, max(num_examples, 1)), seed=seed, reshuffle_each_iteration=True
        )
        if shift or horizontal_flip:
            seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).batch(2)

            def augment(example, pair):
                image, label = example
                shift_seed, flip_seed = tf.unstack(
                    tf.random.experimental.stateless_split(pair, num=2)
                )
                image = random_shift(image, shift, shift_seed)
                if horizontal_flip:
                    image = tf.image.stateless_random_flip_left_right(image, flip_seed)
                return image, label

            examples = tf.data.Dataset.zip(examples, seeds).map(
                augment, num_parallel_calls=tf.data.AUTOTUNE
            )
    examples = examples.map(
        lambda image, label: model_format(
            tf.cast(image, tf.float32) / 255.0, label, reconstruction
        ),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    return examples.batch(batch_size).prefetch(tf.data.AUTOTUNE)
