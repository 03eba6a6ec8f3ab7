"""CIFAR-10 for CapsNet with the official release's preprocessing.

The official release (Sarasra/models, research/capsules/input_data/cifar10/
cifar10_input.py, which follows the TensorFlow CIFAR-10 tutorial) works on the
pixel values as floats in [0, 255]:

* training: a random 24x24 crop, a random left-right flip, a random brightness
  shift of up to 63, a random contrast factor in [0.2, 1.8] (each channel's
  deviations from its mean are scaled), then per-image standardisation;
* evaluation: the central 24x24 crop, then per-image standardisation.

This module does the same, with stateless random ops seeded per example: the
same `seed` gives the same augmentation, and every epoch gets new randomness.
The official CIFAR-10 model is trained without the reconstruction decoder
(README command: `remake=false`), so elements carry no reconstruction target.

Note that per-image standardisation removes the mean of the image, so the
brightness shift (the same for all pixels, no clipping) has no effect on the
model's input; it is kept to mirror the official code.
"""

import tensorflow as tf

from capsnet_tf.data.pipeline import (
    check_pipeline_arguments,
    in_memory,
    load_tfds_split,
    split_size,
    zip_example_seeds,
)
from capsnet_tf.data.spec import DatasetSpec

__all__ = [
    "CIFAR10_CROP_SIZE",
    "make_cifar10_dataset",
    "preprocess_cifar10",
]

CIFAR10_CROP_SIZE = 24
_BRIGHTNESS_MAX_DELTA = 63.0  # on the [0, 255] scale
_CONTRAST_LOWER, _CONTRAST_UPPER = 0.2, 1.8


def preprocess_cifar10(image, training, seed=None):
    """The official CIFAR-10 preprocessing of one image.

    Args:
        image: `[32, 32, 3]` uint8 (or float in [0, 255]) tensor.
        training: random crop, flip, brightness and contrast when true; the
            central crop when false.
        seed: int32/int64 tensor of shape `[2]`, the stateless seed of the
            training augmentation (required when `training`).

    Returns:
        `[24, 24, 3]` float32 tensor, standardised per image (mean 0,
        standard deviation 1).

    Example:

    >>> image = tf.zeros([32, 32, 3], tf.uint8)
    >>> preprocess_cifar10(image, training=True, seed=tf.constant([1, 2])).shape
    TensorShape([24, 24, 3])

    Reference:
        Sabour et al., 2017, Dynamic Routing Between Capsules, section 7
        (arXiv:1710.09829); official input: research/capsules/input_data/
        cifar10/cifar10_input.py.
    """
    image = tf.cast(image, tf.float32)
    size = CIFAR10_CROP_SIZE
    if training:
        if seed is None:
            raise ValueError("`seed` is required when `training` is true.")
        crop_seed, flip_seed, brightness_seed, contrast_seed = tf.unstack(
            tf.random.experimental.stateless_split(seed, num=4)
        )
        image = tf.image.stateless_random_crop(image, (size, size, 3), seed=crop_seed)
        image = tf.image.stateless_random_flip_left_right(image, seed=flip_seed)
        image = tf.image.stateless_random_brightness(
            image, _BRIGHTNESS_MAX_DELTA, seed=brightness_seed
        )
        image = tf.image.stateless_random_contrast(
            image, _CONTRAST_LOWER, _CONTRAST_UPPER, seed=contrast_seed
        )
    else:
        image = tf.image.resize_with_crop_or_pad(image, size, size)
    return tf.image.per_image_standardization(image)


def make_cifar10_dataset(
    split,
    batch_size,
    training,
    seed=0,
    data_dir=None,
    take=None,
    shuffle_buffer=10_000,
):
    """A batched CIFAR-10 pipeline with the official preprocessing.

    Decoded uint8 images are cached; training data are shuffled (reshuffled
    every epoch, deterministically from `seed`) and augmented with a new
    random crop, flip, brightness and contrast every epoch (see
    `preprocess_cifar10`); evaluation data keep their order and get the
    central crop. Elements are `({"image": [24, 24, 3] float32},
    {"length": int32 label})`.

    Args:
        split: TFDS split of `cifar10`, e.g. `"train"`, `"test"`.
        batch_size: examples per batch; the last batch may be smaller.
        training: shuffle and augment.
        seed: seed of the shuffle order and the augmentation.
        data_dir: TFDS data directory; see `resolve_data_dir`.
        take: keep only the first `take` examples (for smoke tests).
        shuffle_buffer: shuffle buffer size.

    Returns:
        `(dataset, spec)` with a `capsnet_tf.data.spec.DatasetSpec` named
        `"cifar10"`, image shape `(24, 24, 3)`, 10 classes, the split's size
        (50,000 / 10,000) and the TFDS label names.

    Raises:
        DatasetNotFoundError: CIFAR-10 is not prepared in `data_dir`.

    Example:

    ```python
    dataset, spec = make_cifar10_dataset("train", 128, training=True)
    model = CapsNet(image_shape=spec.image_shape, num_classes=spec.num_classes, ...)
    ```

    Reference:
        Sabour et al., 2017, Dynamic Routing Between Capsules, section 7
        (arXiv:1710.09829).
    """
    check_pipeline_arguments(batch_size, take, shuffle_buffer)
    dataset, info = load_tfds_split("cifar10", split, data_dir)
    num_examples = split_size(info, split, dataset)
    if take is not None:
        dataset = dataset.take(take)
    dataset = in_memory(dataset).map(
        lambda image, label: (image, tf.cast(label, tf.int32)),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    if training:
        dataset = dataset.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
        dataset = zip_example_seeds(dataset, seed).map(
            lambda example, pair: (preprocess_cifar10(example[0], True, pair), example[1]),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
    else:
        dataset = dataset.map(
            lambda image, label: (preprocess_cifar10(image, False), label),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
    dataset = dataset.map(
        lambda image, label: ({"image": image}, {"length": label}),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    dataset = dataset.batch(batch_size).prefetch(tf.data.AUTOTUNE)
    label_feature = info.features["label"]
    spec = DatasetSpec(
        name="cifar10",
        image_shape=(CIFAR10_CROP_SIZE, CIFAR10_CROP_SIZE, 3),
        num_classes=label_feature.num_classes,
        num_examples=num_examples,
        class_names=tuple(label_feature.names),
    )
    return dataset, spec
