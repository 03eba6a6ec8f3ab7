"""Your own images: a folder with one sub-folder of image files per class.

The layout is the one `keras.utils.image_dataset_from_directory` reads:

    PATH/cat/001.jpg, PATH/cat/002.png, ..., PATH/dog/001.jpg, ...

or the same under `PATH/train/` and `PATH/test/`, which are then the two
splits. Without them a seeded `test_fraction` of each class is the test set.
Class names are the sub-folder names, sorted; label `i` is the `i`-th name.

`scan_image_folder` lists and checks the files before TensorFlow reads any:
every file is opened with PIL (its header only), so that a folder that does
not exist, a single class, an empty class folder, a file that is not an image
(named) or images of different sizes without `image_size` stop with one line
(`ImageFolderError`). Grayscale and colour images mixed are converted to RGB
(alpha and palettes are dropped as well), and `ImageFolder.notes` says so.
`make_image_folder_dataset` then decodes the files with `tf.io.decode_image`
in a `tf.data` pipeline (`capsnet_tf.data.images.make_image_pipeline`).
"""

import dataclasses
import os

import numpy as np
import tensorflow as tf

from capsnet_tf.data.images import make_image_pipeline, parse_image_size, resize_uint8
from capsnet_tf.data.spec import DatasetSpec

__all__ = [
    "IMAGE_EXTENSIONS",
    "ImageFolder",
    "ImageFolderError",
    "make_image_folder_dataset",
    "scan_image_folder",
]

# What `tf.io.decode_image` reads (and Keras's image_dataset_from_directory lists).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")
_GRAY_MODES = ("1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "F")


class ImageFolderError(ValueError):
    """An image folder that cannot be trained on; the message says why, in one line."""


@dataclasses.dataclass(frozen=True)
class ImageFolder:
    """The checked contents of an image folder.

    Attributes:
        path: the folder.
        class_names: sub-folder names, sorted; label order.
        splits: `{"train": (paths, labels), "test": (paths, labels)}`, each a
            seeded shuffle of its files.
        image_shape: `(height, width, channels)` the model sees (after any
            resizing).
        layout: `"train/test"` (given splits) or `"split"` (seeded split).
        resize: the images are resized to `image_shape` (`image_size` given).
        notes: lines worth printing (conversions made, files skipped).
    """

    path: str
    class_names: tuple
    splits: dict
    image_shape: tuple
    layout: str
    resize: bool = False
    notes: tuple = ()


def _class_files(root):
    """`{class name: [image paths]}` of the sub-folders of `root`, and the files skipped."""
    classes, skipped = {}, 0
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if not entry.is_dir() or entry.name.startswith("."):
            continue
        files = []
        for dirpath, dirnames, names in os.walk(entry.path, followlinks=True):
            dirnames.sort()
            for name in sorted(names):
                if name.startswith("."):
                    continue
                if name.lower().endswith(IMAGE_EXTENSIONS):
                    files.append(os.path.join(dirpath, name))
                else:
                    skipped += 1
        classes[entry.name] = files
    return classes, skipped


def _check_classes(root, classes):
    if len(classes) < 2:
        found = f"found {len(classes)}" + (f" ({next(iter(classes))})" if classes else "")
        raise ImageFolderError(
            f"Image folder {root} needs at least 2 class sub-folders (one per class, holding "
            f"that class's images); {found}."
        )
    for name, files in classes.items():
        if not files:
            raise ImageFolderError(
                f"Class folder {os.path.join(root, name)} holds no image files "
                f"({', '.join(IMAGE_EXTENSIONS)}): add images or remove the folder."
            )


def _read_header(path):
    """`((width, height), mode, format)` of an image file, from its header."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            return image.size, image.mode, image.format
    except (UnidentifiedImageError, OSError, ValueError) as error:
        raise ImageFolderError(
            f"{path} is not a readable image ({type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else 'unknown format'}); remove or "
            "replace it."
        ) from None


def scan_image_folder(path, image_size=None, test_fraction=0.2, seed=0):
    """Lists and checks an image folder (see the module); reads headers only.

    Args:
        path: the folder.
        image_size: `(height, width)` to resize to (see `parse_image_size`),
            or None: all images must have one size.
        test_fraction: without `train/` and `test/`: the share of each
            class held out as the test set (at least one image of every
            class with two or more).
        seed: seed of the split and of the files' order.

    Returns:
        An `ImageFolder`.

    Raises:
        ImageFolderError: the folder cannot be trained on; one line says why.
    """
    _check_folder_arguments(path, test_fraction)
    size = parse_image_size(image_size)
    rng = np.random.default_rng(seed)
    layout, class_names, per_split, skipped = _files_per_split(path, test_fraction, rng)
    splits, sizes, modes = _labelled_splits(per_split, class_names, rng)
    height, width = size or _one_size(path, sizes)
    return ImageFolder(
        path=path,
        class_names=class_names,
        splits=splits,
        image_shape=(height, width, 3 if "colour" in modes else 1),
        layout=layout,
        resize=size is not None,
        notes=_scan_notes(skipped, modes),
    )


def _check_folder_arguments(path, test_fraction):
    """Refuses a missing folder, a file, or a `test_fraction` outside (0, 1), before any listing."""
    if not os.path.exists(path):
        raise ImageFolderError(f"Image folder {path} does not exist.")
    if not os.path.isdir(path):
        raise ImageFolderError(f"Image folder {path} is not a directory.")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"`test_fraction` must be in (0, 1). Received: {test_fraction}")


def _files_per_split(path, test_fraction, rng):
    """`(layout, class_names, {split: {class: files}}, skipped)`: given splits or a seeded one."""
    given = [os.path.join(path, name) for name in ("train", "test")]
    present = [os.path.isdir(folder) for folder in given]
    if any(present) and not all(present):
        have, lack = ("train", "test") if present[0] else ("test", "train")
        raise ImageFolderError(
            f"Image folder {path} has a {have}/ folder but no {lack}/ folder: give both (each "
            "with one sub-folder per class), or put the class folders in it directly for a "
            "seeded split."
        )
    if all(present):
        return ("train/test", *_given_splits(*given))
    return ("split", *_seeded_split(path, test_fraction, rng))


def _given_splits(train_dir, test_dir):
    """`(class_names, per_split, skipped)` of `train/` and `test/`; both name the same classes."""
    train, skipped = _class_files(train_dir)
    test, skipped_test = _class_files(test_dir)
    _check_classes(train_dir, train)
    _check_classes(test_dir, test)
    if sorted(test) != sorted(train):
        raise ImageFolderError(
            f"{train_dir} and {test_dir} must hold the same class folders; train has "
            f"{', '.join(sorted(train))}, test has {', '.join(sorted(test))}."
        )
    return tuple(sorted(train)), {"train": train, "test": test}, skipped + skipped_test


def _seeded_split(path, test_fraction, rng):
    """`(class_names, per_split, skipped)`: a shuffled `test_fraction` of each class held out."""
    classes, skipped = _class_files(path)
    _check_classes(path, classes)
    class_names = tuple(sorted(classes))
    per_split = {"train": {}, "test": {}}
    for name in class_names:
        files = list(classes[name])
        rng.shuffle(files)
        held = int(round(test_fraction * len(files))) if len(files) > 1 else 0
        held = max(held, 1) if len(files) > 1 else 0
        per_split["test"][name] = files[:held]
        per_split["train"][name] = files[held:]
    return class_names, per_split, skipped


def _labelled_splits(per_split, class_names, rng):
    """`(splits, sizes, modes)`: each split's shuffled `(paths, labels)`; the headers' sizes, modes.

    `sizes` maps each `(height, width)` to the first file of that size;
    `modes` maps `"gray"` and `"colour"` to their files.
    """
    splits, sizes, modes = {}, {}, {}
    for split, classes in per_split.items():
        paths, labels = [], []
        for label, name in enumerate(class_names):
            for file in classes.get(name, []):
                (width, height), mode, _ = _read_header(file)
                sizes.setdefault((height, width), file)
                modes.setdefault("gray" if mode in _GRAY_MODES else "colour", []).append(file)
                paths.append(file)
                labels.append(label)
        order = rng.permutation(len(paths))
        splits[split] = ([paths[i] for i in order], np.asarray(labels, np.int32)[order])
    return splits, sizes, modes


def _one_size(path, sizes):
    """The `(height, width)` all images share; without `image_size` two sizes cannot be batched."""
    if len(sizes) > 1:
        (first, first_file), (second, second_file) = list(sizes.items())[:2]
        raise ImageFolderError(
            f"The images of {path} differ in size ({first[1]}x{first[0]} in {first_file}, "
            f"{second[1]}x{second[0]} in {second_file}, {len(sizes)} sizes in all): pass "
            f"--image_size={first[0]} (or height,width) to resize them all."
        )
    return next(iter(sizes))


def _scan_notes(skipped, modes):
    """`ImageFolder.notes`: the files skipped and the conversion to RGB, worth printing."""
    notes = []
    if skipped:
        notes.append(
            f"Skipped {skipped} file(s) without an image extension ({', '.join(IMAGE_EXTENSIONS)})."
        )
    if "colour" in modes and "gray" in modes:
        notes.append(
            f"Mixed channel counts: {len(modes['gray'])} grayscale image(s) (e.g. "
            f"{modes['gray'][0]}) and {len(modes['colour'])} colour image(s); all are "
            "converted to RGB (3 channels)."
        )
    return tuple(notes)


def _decoded(paths, labels, image_shape, resize):
    """`(uint8 image, label)` pairs decoded from `paths` by `tf.io.decode_image`."""
    channels = image_shape[-1]

    def decode(path, label):
        image = tf.io.decode_image(
            tf.io.read_file(path), channels=channels, expand_animations=False
        )
        if resize:
            image = resize_uint8(image, image_shape[:2])
        return tf.ensure_shape(image, image_shape), label

    return tf.data.Dataset.from_tensor_slices((list(paths), labels)).map(
        decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
    )


def _name_the_broken_file(paths):
    """The first file PIL cannot decode fully, or None."""
    from PIL import Image

    for path in paths:
        try:
            with Image.open(path) as image:
                image.load()
        except Exception:  # noqa: BLE001 - any failure names the file
            return path
    return None


def make_image_folder_dataset(
    folder,
    split,
    batch_size,
    training,
    seed=0,
    shift=0,
    horizontal_flip=False,
    reconstruction=True,
    take=None,
):
    """The batched pipeline and `DatasetSpec` of one split of a scanned image folder.

    Args:
        folder: an `ImageFolder` (`scan_image_folder`).
        split: `"train"` or `"test"`.
        batch_size: examples per batch.
        training: shuffle and augment (see `make_image_pipeline`).
        seed: seed of the shuffle order and the augmentation.
        shift: training only: random translation of up to this many pixels.
        horizontal_flip: training only: random horizontal flips.
        reconstruction: include the label input and the reconstruction target.
        take: keep only the first `take` examples.

    Returns:
        `(dataset, spec)`; `spec.class_names` are the folder's class names.

    Raises:
        ImageFolderError: a file cannot be decoded (named).
    """
    if split not in folder.splits:
        raise ValueError(
            f"An image folder has the splits {sorted(folder.splits)}. Received: split={split!r}"
        )
    paths, labels = folder.splits[split]
    if take is not None:
        paths, labels = paths[:take], labels[:take]
    if not paths:
        raise ImageFolderError(f"The {split} split of {folder.path} holds no images.")
    examples = _decoded(paths, labels, folder.image_shape, folder.resize)
    try:
        dataset = make_image_pipeline(
            examples,
            len(paths),
            folder.image_shape,
            batch_size,
            training,
            shift=shift,
            horizontal_flip=horizontal_flip,
            seed=seed,
            reconstruction=reconstruction,
        )
    except tf.errors.InvalidArgumentError as error:
        broken = _name_the_broken_file(paths)
        where = f"{broken} cannot be decoded" if broken else "An image cannot be decoded"
        raise ImageFolderError(
            f"{where} ({str(error).splitlines()[0]}); remove or replace it."
        ) from None
    spec = DatasetSpec(
        name="image_folder",
        image_shape=folder.image_shape,
        num_classes=len(folder.class_names),
        num_examples=len(folder.splits[split][0]),
        class_names=folder.class_names,
    )
    return dataset, spec
