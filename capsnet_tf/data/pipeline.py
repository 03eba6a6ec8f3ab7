"""`tf.data` pipelines for CapsNet from TensorFlow-Datasets.

The data sets are read from a prepared TFDS directory (`data_dir`, else the
`TFDS_DATA_DIR` environment variable, else `~/tensorflow_datasets`); nothing is
downloaded here. A missing data set raises `DatasetNotFoundError` with one
message that says which data set, where TFDS looked and how to point it at a
copy.
"""

import os

import tensorflow as tf

__all__ = [
    "DatasetNotFoundError",
    "in_memory",
    "load_tfds_split",
    "make_dataset",
    "SHIFT_MODES",
    "random_shift",
    "random_subpixel_shift",
    "resolve_data_dir",
    "resumable_training_data",
    "translate",
]


# How `make_dataset` translates training images: whole pixels (the official
# release) or real-valued offsets with bilinear interpolation.
SHIFT_MODES = ("whole_pixels", "subpixel")


class DatasetNotFoundError(FileNotFoundError):
    """A TFDS data set is not prepared in the data directory."""


def resolve_data_dir(data_dir=None):
    """The TFDS data directory: argument, `$TFDS_DATA_DIR`, or the default."""
    if data_dir:
        return os.path.expanduser(data_dir)
    if os.environ.get("TFDS_DATA_DIR"):
        return os.path.expanduser(os.environ["TFDS_DATA_DIR"])
    return os.path.expanduser(os.path.join("~", "tensorflow_datasets"))


def load_tfds_split(name, split, data_dir=None, features=None):
    """Loads `(image uint8 [H, W, C], label int64)` pairs of a prepared split.

    Args:
        name: TFDS name, e.g. `"mnist"` or `"fashion_mnist"` (a version may be
            given as `"mnist:3.0.1"`).
        split: TFDS split, e.g. `"train"`, `"test"`, `"train[:10%]"`.
        data_dir: TFDS data directory; see `resolve_data_dir`.
        features: names of the features to return as a tuple, e.g.
            `("image", "label")`, instead of the data set's supervised keys
            (which not every data set defines).

    Returns:
        `(dataset, info)`: an unshuffled `tf.data.Dataset` and the
        `tfds.core.DatasetInfo`.

    Raises:
        DatasetNotFoundError: the data set is not prepared in `data_dir`.
    """
    import tensorflow_datasets as tfds  # imported lazily: it is slow to import

    data_dir = resolve_data_dir(data_dir)
    base_name = name.split(":")[0]
    # No look at the files first: TFDS itself says when the data are missing
    # (AssertionError "could not find data", or an unknown name or version),
    # and `tfds.testing.mock_data` can then serve a data set without files.
    try:
        dataset, info = tfds.load(
            name,
            split=split,
            data_dir=data_dir,
            as_supervised=features is None,
            with_info=True,
            download=False,
            shuffle_files=False,
            # No TFDS auto-cache: the pipelines read a split into memory once
            # (`in_memory`), and a partly read auto-cache (a few test images
            # for the figures) only warns that it was discarded.
            read_config=tfds.ReadConfig(try_autocache=False),
        )
    except (AssertionError, tfds.core.registered.DatasetNotFoundError) as error:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise DatasetNotFoundError(
            f"TensorFlow-Datasets data set {base_name!r} was not found in "
            f"{data_dir!r} (looked for {os.path.join(data_dir, base_name, '<version>')}). "
            "This project never downloads data: prepare it once with "
            f"`tfds build {base_name}` on a machine with internet access, or point "
            "TFDS at an existing copy with `export TFDS_DATA_DIR=/path/to/tensorflow_datasets` "
            f"(or the --data_dir flag). TFDS said, loading split {split!r}: {reason}"
        ) from None
    if features is not None:
        dataset = dataset.map(
            lambda example: tuple(example[key] for key in features),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
    return dataset, info


def in_memory(dataset):
    """The elements of a finite dataset, decoded once, as a dataset over in-memory tensors.

    What `.cache()` is meant to do, without its catch: Keras stops each epoch
    after the dataset's cardinality in steps, so the iterator never reaches the
    end, `.cache()` discards the partial cache ("The calling iterator did not
    fully read the dataset being cached") and every epoch and every evaluation
    decodes the TFDS files again. Reading the split once here (MNIST's 60,000
    training images are 47 MB as uint8) keeps the same elements in the same
    order and decodes them once per process.

    Args:
        dataset: a finite, non-empty `tf.data.Dataset` of tensors.

    Returns:
        `tf.data.Dataset.from_tensor_slices` over all its elements.
    """
    everything = dataset.batch(2**31 - 1).get_single_element()
    return tf.data.Dataset.from_tensor_slices(everything)


def random_shift(image, max_shift, seed):
    """Shifts an image by up to `max_shift` pixels each way, filling with zeros.

    As the official release: pad by `max_shift` on every side, then crop the
    original size at a random offset. Stateless: the same `seed` always gives
    the same shift.

    Args:
        image: `[H, W, C]` tensor.
        max_shift: python int >= 0.
        seed: int32/int64 tensor of shape `[2]`.

    Returns:
        The shifted image, same shape and dtype.
    """
    if max_shift == 0:
        return image
    height, width, channels = image.shape
    padded = tf.pad(image, [[max_shift, max_shift], [max_shift, max_shift], [0, 0]])
    return tf.image.stateless_random_crop(padded, (height, width, channels), seed=seed)


def translate(image, dy, dx):
    """Translates an image by real-valued pixel offsets, bilinear, zero fill.

    The output pixel `(y, x)` is the input's bilinear interpolation at
    `(y - dy, x - dx)`, reading zeros outside the image: positive `dy`
    moves the content down, positive `dx` right. Integer offsets give the
    whole-pixel shift of `random_shift` exactly.

    Args:
        image: float `[H, W, C]` tensor.
        dy, dx: scalar float offsets in pixels.

    Returns:
        The translated image, same shape and dtype.
    """
    dy = tf.cast(dy, tf.float32)
    dx = tf.cast(dx, tf.float32)
    # ImageProjectiveTransformV3 maps each output point (x, y) to the input
    # point (x + a2, y + b2) for the transform [1, 0, a2, 0, 1, b2, 0, 0].
    transform = tf.stack([1.0, 0.0, -dx, 0.0, 1.0, -dy, 0.0, 0.0])[tf.newaxis]
    translated = tf.raw_ops.ImageProjectiveTransformV3(
        images=image[tf.newaxis],
        transforms=transform,
        output_shape=tf.shape(image)[:2],
        fill_value=tf.constant(0.0, image.dtype),
        interpolation="BILINEAR",
        fill_mode="CONSTANT",
    )
    return tf.ensure_shape(translated[0], image.shape)


def random_subpixel_shift(image, max_shift, seed):
    """Translates an image by real offsets drawn uniformly from [-max_shift, max_shift].

    Each axis draws its own offset; the image is resampled bilinearly with
    zero fill (`translate`). The shifts of CapsNet-Keras (Keras's
    `ImageDataGenerator(width_shift_range=0.1, height_shift_range=0.1)`:
    real offsets of up to 2.8 pixels, bilinear) are of this kind; the
    official release's are whole pixels (`random_shift`). Stateless: the same
    `seed` always gives the same offsets.

    Args:
        image: float `[H, W, C]` tensor.
        max_shift: python number >= 0.
        seed: int32/int64 tensor of shape `[2]`.

    Returns:
        The shifted image, same shape and dtype.
    """
    if max_shift == 0:
        return image
    offsets = tf.random.stateless_uniform(
        [2], seed, minval=-float(max_shift), maxval=float(max_shift)
    )
    return translate(image, offsets[0], offsets[1])


def make_dataset(
    name,
    split,
    batch_size,
    training,
    shift=0,
    seed=0,
    data_dir=None,
    reconstruction=True,
    take=None,
    shuffle_buffer=10_000,
    shift_mode="whole_pixels",
):
    """A batched `tf.data` pipeline for CapsNet's `model.fit`.

    Images are scaled to float32 in [0, 1] and cached once decoded; training
    data are shuffled (reshuffled every epoch, deterministically from `seed`)
    and shifted at random by up to `shift` pixels (a new shift every epoch);
    evaluation data are neither. Elements are `(inputs, targets)` with
    `inputs = {"image", "label"}` and `targets = {"length": label,
    "reconstruction": image}` (without the label input and the reconstruction
    target when `reconstruction` is false).

    Args:
        name: TFDS data set name.
        split: TFDS split.
        batch_size: examples per batch; the last batch may be smaller.
        training: shuffle and augment.
        shift: maximum shift in pixels for training (official MNIST: 2).
        seed: seed of the shuffle order and the shifts.
        data_dir: TFDS data directory.
        reconstruction: include the label input and the image target.
        take: keep only the first `take` examples (for smoke tests).
        shuffle_buffer: shuffle buffer size.
        shift_mode: `"whole_pixels"` (the official release: integer offsets,
            `random_shift`) or `"subpixel"` (real offsets, bilinear,
            `random_subpixel_shift`).

    Returns:
        `(dataset, info)`.
    """
    if batch_size < 1:
        raise ValueError(f"`batch_size` must be >= 1. Received: batch_size={batch_size}")
    if shift < 0:
        raise ValueError(f"`shift` must be >= 0. Received: shift={shift}")
    if shift_mode not in SHIFT_MODES:
        raise ValueError(
            f"`shift_mode` must be one of {', '.join(SHIFT_MODES)}. "
            f"Received: shift_mode={shift_mode!r}"
        )
    dataset, info = load_tfds_split(name, split, data_dir)
    if take is not None:
        dataset = dataset.take(take)

    def scale(image, label):
        return tf.cast(image, tf.float32) / 255.0, tf.cast(label, tf.int32)

    dataset = in_memory(dataset).map(scale, num_parallel_calls=tf.data.AUTOTUNE)
    if training:
        dataset = dataset.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
        if shift:
            shifter = random_subpixel_shift if shift_mode == "subpixel" else random_shift
            dataset = zip_example_seeds(dataset, seed).map(
                lambda example, pair: (shifter(example[0], shift, pair), example[1]),
                num_parallel_calls=tf.data.AUTOTUNE,
            )

    def to_model_format(image, label):
        if reconstruction:
            return {"image": image, "label": label}, {"length": label, "reconstruction": image}
        return {"image": image}, {"length": label}

    dataset = dataset.map(to_model_format, num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.batch(batch_size).prefetch(tf.data.AUTOTUNE)
    return dataset, info


def resumable_training_data(dataset, global_step=0, final=None, epochs_before_final=0):
    """The training batches of every epoch in one stream, from batch `global_step` on.

    `dataset` is one epoch of a training pipeline whose shuffle order and
    augmentation are drawn anew on each pass (`reshuffle_each_iteration`,
    `Dataset.random(rerandomize_each_iteration=True)`), deterministically
    from the seeds: its `k`-th pass is the same in every process with the
    same seed. `model.fit` with `steps_per_epoch` reads the repeated stream
    with one iterator across epochs, so batch `n` of the stream is the one
    trained at optimizer step `n + 1`. A run resumed after `global_step`
    steps skips that many batches and continues with exactly the batches the
    interrupted run would have read next: the same order, the same shifts.

    The skipped batches are computed and dropped (tf.data has no cheaper way
    to advance a reshuffling pass): for in-memory MNIST a few seconds per
    epoch skipped.

    Args:
        dataset: a finite, batched training `tf.data.Dataset` (one epoch).
        global_step: optimizer steps already done.
        final: another pipeline of one epoch with as many batches (e.g. the
            same images unshifted) that replaces `dataset` after
            `epochs_before_final` passes; None: `dataset` throughout.
        epochs_before_final: passes of `dataset` before `final` takes over.

    Returns:
        An endless dataset; pass `steps_per_epoch` to `fit`.
    """
    if global_step < 0:
        raise ValueError(f"`global_step` must be >= 0. Received: global_step={global_step}")
    if epochs_before_final < 0:
        raise ValueError(
            "`epochs_before_final` must be >= 0. "
            f"Received: epochs_before_final={epochs_before_final}"
        )
    if final is None:
        stream = dataset.repeat()
    else:
        stream = dataset.repeat(epochs_before_final).concatenate(final.repeat())
    return stream.skip(global_step) if global_step else stream


def check_pipeline_arguments(batch_size, take, shuffle_buffer):
    """Raises `ValueError` naming the first invalid pipeline argument."""
    if batch_size < 1:
        raise ValueError(f"`batch_size` must be >= 1. Received: batch_size={batch_size}")
    if take is not None and take < 1:
        raise ValueError(f"`take` must be None or >= 1. Received: take={take}")
    if shuffle_buffer < 1:
        raise ValueError(
            f"`shuffle_buffer` must be >= 1. Received: shuffle_buffer={shuffle_buffer}"
        )


def split_size(info, split, dataset):
    """Examples in `split`: from the TFDS info, else the dataset's cardinality.

    Under `tfds.testing.mock_data` without metadata files the info knows no
    splits; the mocked dataset then has a known cardinality.
    """
    try:
        return int(info.splits[split].num_examples)
    except KeyError:
        cardinality = int(dataset.cardinality())
        if cardinality < 0:
            raise ValueError(f"The size of split {split!r} is unknown.") from None
        return cardinality


def zip_example_seeds(dataset, seed):
    """Pairs every example with a stateless seed `[2]`, new every epoch."""
    seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).batch(2)
    return tf.data.Dataset.zip(dataset, seeds)
