"""One entry point to every data set an experiment can train on.

`load_experiment_data(name, split, ...)` dispatches to the loader of `name`
(`LOADERS`, one function per built-in data set; `IMAGE_FOLDER` and other
TFDS names have their own) and always returns `(dataset, DatasetSpec)`, so
that the training loop does not need to know where the examples come from:

| name | pipeline | images | classes | targets |
| --- | --- | --- | --- | --- |
| `mnist`, `fashion_mnist` | `make_dataset` (TFDS, random shift) | 28x28x1 | 10 | 1 |
| `multi_mnist` | `make_multimnist_dataset` (generated from MNIST) | 36x36x1 | 10 | 2 |
| `expanded_mnist` | `make_expanded_mnist_dataset` (MNIST on 40x40, shifted) | 40x40x1 | 10 | 1 |
| `affnist` | `make_affnist_dataset` (test only: generated, or the real files) | 40x40x1 | 10 | 1 |
| `cifar10` | `make_cifar10_dataset` (TFDS, official preprocessing) | 24x24x3 | 10 | 1 |
| `smallnorb` | `make_smallnorb_dataset` (TFDS, official preprocessing) | 32x32x2 | 5 | 1 |
| `image_folder` | `make_image_folder_dataset` (your images) | from the files | folders | 1 |
| other TFDS names | `make_tfds_image_dataset` (`image`, `label`) | from TFDS | from TFDS | 1 |
"""

import functools

from capsnet_tf.data.spec import DatasetSpec

__all__ = ["DATASETS", "IMAGE_FOLDER", "LOADERS", "load_experiment_data", "scan_folder"]

# The `dataset` of a run on `image_folder`.
IMAGE_FOLDER = "image_folder"


# One loader per data set: `(name, split, batch_size, training, **options)`
# -> `(dataset, spec)`, `options` being `load_experiment_data`'s keyword
# arguments; each takes the options it uses and ignores the rest (`**_`).


def _load_image_folder(name, split, batch_size, training, *, seed, reconstruction, take,
                       image_folder, image_size, test_fraction, augment, **_):
    from capsnet_tf.data.folder import make_image_folder_dataset

    if not image_folder:
        raise ValueError("`dataset='image_folder'` needs `image_folder` (--image_folder).")
    folder = scan_folder(image_folder, image_size, test_fraction, seed)
    return make_image_folder_dataset(
        folder, split, batch_size, training, seed=seed, reconstruction=reconstruction,
        take=take, **augment,
    )


def _load_tfds_images(name, split, batch_size, training, *, seed, data_dir, reconstruction,
                      take, image_size, augment, **_):
    from capsnet_tf.data.tfds_images import make_tfds_image_dataset

    return make_tfds_image_dataset(
        name, split, batch_size, training, seed=seed, data_dir=data_dir,
        reconstruction=reconstruction, take=take, image_size=image_size, **augment,
    )


def _load_mnist(name, split, batch_size, training, *, seed, shift, data_dir, reconstruction,
                take, shift_mode, **_):
    """`mnist` and `fashion_mnist`."""
    from capsnet_tf.data.pipeline import make_dataset

    dataset, info = make_dataset(
        name,
        split,
        batch_size,
        training=training,
        shift=(shift or 0) if training else 0,
        seed=seed,
        data_dir=data_dir,
        reconstruction=reconstruction,
        take=take,
        shift_mode=shift_mode,
    )
    spec = DatasetSpec(
        name=name,
        image_shape=tuple(info.features["image"].shape),
        num_classes=info.features["label"].num_classes,
        num_examples=info.splits[split].num_examples,
        class_names=tuple(info.features["label"].names),
    )
    return dataset, spec


def _shift_option(shift):
    """The generated MNIST sets' `max_shift`, left to their default when None."""
    return {} if shift is None else {"max_shift": shift}


def _load_multi_mnist(name, split, batch_size, training, *, seed, shift, data_dir,
                      reconstruction, take, test_pairs_per_image, **_):
    from capsnet_tf.data.multimnist import make_multimnist_dataset

    return make_multimnist_dataset(
        split,
        batch_size,
        training=training,
        seed=seed,
        test_pairs_per_image=test_pairs_per_image,
        data_dir=data_dir,
        reconstruction=reconstruction,
        take=take,
        **_shift_option(shift),
    )


def _load_expanded_mnist(name, split, batch_size, training, *, seed, shift, data_dir,
                         reconstruction, take, **_):
    from capsnet_tf.data.affnist import make_expanded_mnist_dataset

    return make_expanded_mnist_dataset(
        split,
        batch_size,
        training=training,
        seed=seed,
        data_dir=data_dir,
        reconstruction=reconstruction,
        take=take,
        **_shift_option(shift),
    )


def _load_affnist(name, split, batch_size, training, *, seed, data_dir, reconstruction, take,
                  affnist_path, **_):
    if split != "test":
        raise ValueError(
            "affNIST is a test set only (train on expanded_mnist). "
            f"Received: split={split!r}"
        )
    from capsnet_tf.data.affnist import make_affnist_dataset

    return make_affnist_dataset(
        batch_size,
        seed=seed,
        data_dir=data_dir,
        path=affnist_path,
        reconstruction=reconstruction,
        take=take,
    )


def _load_cifar10(name, split, batch_size, training, *, seed, data_dir, reconstruction, take,
                  **_):
    from capsnet_tf.data.cifar10 import make_cifar10_dataset

    if reconstruction:
        raise ValueError(
            "CIFAR-10 is trained without reconstruction, as in the official "
            "release (remake=false): pass reconstruction=False (--noreconstruction)."
        )
    return make_cifar10_dataset(
        split, batch_size, training=training, seed=seed, data_dir=data_dir, take=take
    )


def _load_smallnorb(name, split, batch_size, training, *, seed, data_dir, reconstruction, take,
                    **_):
    from capsnet_tf.data.smallnorb import make_smallnorb_dataset

    return make_smallnorb_dataset(
        split,
        batch_size,
        training=training,
        seed=seed,
        data_dir=data_dir,
        reconstruction=reconstruction,
        take=take,
    )


# The built-in data sets and their loaders; any other name is an image folder
# (`IMAGE_FOLDER`) or a TFDS image-classification set (`_load_tfds_images`).
LOADERS = {
    "mnist": _load_mnist,
    "fashion_mnist": _load_mnist,
    "multi_mnist": _load_multi_mnist,
    "expanded_mnist": _load_expanded_mnist,
    "affnist": _load_affnist,
    "cifar10": _load_cifar10,
    "smallnorb": _load_smallnorb,
}

DATASETS = tuple(LOADERS)


def load_experiment_data(
    name,
    split,
    batch_size,
    training,
    seed=0,
    shift=None,
    data_dir=None,
    reconstruction=True,
    take=None,
    test_pairs_per_image=1,
    affnist_path=None,
    image_folder=None,
    image_size=None,
    test_fraction=0.2,
    horizontal_flip=False,
    shift_mode="whole_pixels",
):
    """The `tf.data` pipeline and `DatasetSpec` of one split of a data set.

    Args:
        name: one of `DATASETS`, `IMAGE_FOLDER` (the folder `image_folder`)
            or the name of any prepared TFDS image-classification data set.
        split: `"train"` or `"test"` (`affnist` has only `"test"`).
        batch_size: examples per batch.
        training: shuffle and augment.
        seed: seed of shuffling, augmentation and generated test sets.
        shift: maximum random translation in pixels (MNIST-style data sets;
            `multi_mnist`: each digit's shift, which also sets the canvas
            to 28 + 2 * shift; `expanded_mnist`: the shift on the 40x40
            canvas). None: each pipeline's default (0 for `mnist`, 4 for
            `multi_mnist`, 6 for `expanded_mnist`). Ignored by `cifar10` and
            `smallnorb`, whose augmentation is the official one.
        data_dir: TFDS data directory.
        reconstruction: include the label input and the reconstruction target.
        take: keep only the first `take` examples.
        test_pairs_per_image: `multi_mnist` test pairs per MNIST test image.
        affnist_path: real affNIST data for `affnist` (None: generated).
        image_folder: the folder of an `IMAGE_FOLDER` run.
        image_size: `IMAGE_FOLDER` and other TFDS sets: resize to this size
            (see `capsnet_tf.data.images.parse_image_size`).
        test_fraction: `IMAGE_FOLDER` without `train/` and `test/`: the
            share of each class held out as the test set.
        horizontal_flip: `IMAGE_FOLDER` and other TFDS sets: random
            horizontal flips in training.
        shift_mode: `mnist` and `fashion_mnist`: `"whole_pixels"` or
            `"subpixel"` shifts (see `make_dataset`).

    Returns:
        `(dataset, spec)`.

    Raises:
        ValueError: unknown `name` or split.
        capsnet_tf.data.DatasetNotFoundError: the source data are missing.
        capsnet_tf.data.folder.ImageFolderError: `image_folder` cannot be
            trained on (one line says why).
    """
    loader = _load_image_folder if name == IMAGE_FOLDER else LOADERS.get(name, _load_tfds_images)
    return loader(
        name, split, batch_size, training, seed=seed, shift=shift, data_dir=data_dir,
        reconstruction=reconstruction, take=take, test_pairs_per_image=test_pairs_per_image,
        affnist_path=affnist_path, image_folder=image_folder, image_size=image_size,
        test_fraction=test_fraction, shift_mode=shift_mode,
        augment={"shift": (shift or 0) if training else 0, "horizontal_flip": horizontal_flip},
    )


def scan_folder(path, image_size=None, test_fraction=0.2, seed=0):
    """`capsnet_tf.data.folder.scan_image_folder`, once per process and arguments.

    A run reads the folder for its training split, its test split and its
    sample images; the headers are read once.
    """
    size = None if image_size is None else tuple(str(value) for value in (
        [image_size] if isinstance(image_size, (int, str)) else image_size
    ))
    return _scan(path, size, float(test_fraction), int(seed))


@functools.lru_cache(maxsize=8)
def _scan(path, image_size, test_fraction, seed):
    from absl import logging

    from capsnet_tf.data.folder import scan_image_folder

    folder = scan_image_folder(path, image_size, test_fraction, seed)
    train, test = (len(folder.splits[split][0]) for split in ("train", "test"))
    logging.info(
        "Image folder %s: %d classes (%s), %dx%dx%d images, %d train / %d test (%s).",
        path, len(folder.class_names), ", ".join(folder.class_names), *folder.image_shape,
        train, test,
        "its train/ and test/ folders" if folder.layout == "train/test"
        else f"seeded split, test fraction {test_fraction}",
    )
    for note in folder.notes:
        logging.warning("%s", note)
    return folder
