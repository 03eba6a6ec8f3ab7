"""Any prepared TFDS image-classification data set, by name (`--dataset=NAME`).

A data set qualifies when its examples have an `image` feature (uint8,
`[H, W, C]`) and a `label` feature (`ClassLabel`): `tf_flowers`, `cifar100`,
`eurosat/rgb`, `kmnist`, ... Like the built-in ones it is read from a prepared
TFDS directory, never downloaded, with the same `DatasetNotFoundError` message
when it is missing (`capsnet_tf.data.pipeline.load_tfds_split`). The test
split is `test`, else `validation`. Images of varying size need
`image_size`. The batches come from
`capsnet_tf.data.images.make_image_pipeline`.
"""

import tensorflow as tf

from capsnet_tf.data.images import make_image_pipeline, parse_image_size, resize_uint8
from capsnet_tf.data.pipeline import DatasetNotFoundError, load_tfds_split, resolve_data_dir
from capsnet_tf.data.spec import DatasetSpec

__all__ = ["load_tfds_images", "make_tfds_image_dataset"]


def _features(name, data_dir):
    """The `image` and `label` features and split names of a prepared data set."""
    import tensorflow_datasets as tfds  # imported lazily: it is slow to import

    try:
        builder = tfds.builder(name, data_dir=resolve_data_dir(data_dir))
    except tfds.core.registered.DatasetNotFoundError:
        load_tfds_split(name, "train", data_dir)  # raises its DatasetNotFoundError
        raise
    if not builder.is_prepared():
        load_tfds_split(name, "train", data_dir)
        raise DatasetNotFoundError(f"TFDS data set {name!r} is not prepared.")
    info = builder.info
    features = info.features
    # A FeaturesDict has `in` and `[]` but no `.get`.
    image = features["image"] if "image" in features else None  # noqa: SIM401
    label = features["label"] if "label" in features else None  # noqa: SIM401
    if image is None or label is None or not hasattr(label, "names"):
        raise ValueError(
            f"TFDS data set {name!r} is not an image-classification data set this project "
            "can read: it needs an `image` feature and a `label` ClassLabel feature "
            f"(it has {', '.join(sorted(features.keys()))})."
        )
    return info, image, label


def _test_split(info, name):
    for split in ("test", "validation"):
        if split in info.splits:
            return split
    raise ValueError(
        f"TFDS data set {name!r} has no test or validation split (it has "
        f"{', '.join(sorted(info.splits.keys()))})."
    )


def load_tfds_images(name, split, data_dir=None, image_size=None):
    """`(dataset of (uint8 image, label), info, image_shape, class_names, split)`.

    Args:
        name: TFDS name (with an optional `:version` or `/config`).
        split: `"train"` or `"test"` (`"test"` falls back to `validation`);
            a TFDS slice such as `train[:-500]` is passed on.
        data_dir: TFDS data directory.
        image_size: `(height, width)` to resize to, or None.

    Raises:
        DatasetNotFoundError: not prepared in `data_dir`.
        ValueError: not an image-classification data set, or images of
            varying size without `image_size`.
    """
    info, image_feature, label_feature = _features(name, data_dir)
    if split == "test":
        split = _test_split(info, name)
    size = parse_image_size(image_size)
    height, width, channels = image_feature.shape
    if size is None and (height is None or width is None):
        raise ValueError(
            f"The images of TFDS data set {name!r} vary in size: pass --image_size (e.g. 64 "
            "or height,width) to resize them."
        )
    channels = channels or 3
    shape = (*(size or (height, width)), channels)
    dataset, _ = load_tfds_split(name, split, data_dir, features=("image", "label"))
    dataset = dataset.map(
        lambda image, label: (resize_uint8(image, size) if size else image, label),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    return dataset, info, shape, tuple(label_feature.names), split


def make_tfds_image_dataset(
    name,
    split,
    batch_size,
    training,
    seed=0,
    shift=0,
    horizontal_flip=False,
    data_dir=None,
    reconstruction=True,
    take=None,
    image_size=None,
):
    """The batched pipeline and `DatasetSpec` of a TFDS image-classification split.

    Arguments as `capsnet_tf.data.folder.make_image_folder_dataset`, plus the
    TFDS `name`, `data_dir` and `image_size` (see `load_tfds_images`).
    """
    dataset, info, shape, class_names, split = load_tfds_images(
        name, split, data_dir, image_size
    )
    num_examples = int(info.splits[split].num_examples)  # slices ("train[:-500]") too
    if take is not None:
        dataset = dataset.take(take)
        count = min(take, num_examples)
    else:
        count = num_examples
    batches = make_image_pipeline(
        dataset,
        count,
        shape,
        batch_size,
        training,
        shift=shift,
        horizontal_flip=horizontal_flip,
        seed=seed,
        reconstruction=reconstruction,
    )
    spec = DatasetSpec(
        name=name,
        image_shape=shape,
        num_classes=len(class_names),
        num_examples=num_examples,
        class_names=class_names,
    )
    return batches, spec
