r"""Classifies images with an exported CapsNet SavedModel.

Usage:

    python experiments/predict.py --model=/tmp/capsnet_serving/1 digit.png other.png
    python experiments/predict.py --model=/tmp/capsnet_serving digits.npy \
        --reconstruction_dir=/tmp/reconstructions

Prints one line per image: `<file>: class <id> (<name>) probability <p>`,
where the probability is the length of the predicted class's capsule. With
`--reconstruction_dir` the decoder's reconstruction of every image is written
there as a PNG (`<file stem>_reconstruction.png`).

Inputs: PNG, JPEG (or any image PIL reads) of exactly the model's size, 28x28
for MNIST, or of any size with `--resize` (as a run with `--image_size`
resized its training images); colour images are converted to grayscale
(ITU-R 601-2 luma) for a grayscale model, grayscale ones to RGB for a colour
model. The class names printed are the export's `assets/labels.txt`: an
image folder's sub-folder names for a run on `--image_folder`. `.npy`
arrays of shape `[28, 28]`, `[28, 28, 1]` (one image) or `[N, 28, 28]`,
`[N, 28, 28, 1]` (N images, printed as `file[i]`), uint8 in [0, 255] or
float in [0, 1]. MNIST digits are white on black.

`--model` is a version directory (`<export_dir>/1`) or the export directory
itself, whose highest version is used. Only TensorFlow, NumPy and PIL are
needed: the SavedModel runs without capsnet_tf.
"""

import os
import sys

from absl import app, flags

_MODEL = flags.DEFINE_string(
    "model", None, "SavedModel directory: <export_dir>/<version>, or <export_dir> for its "
    "highest version.", required=True,
)
_RECONSTRUCTION_DIR = flags.DEFINE_string(
    "reconstruction_dir", None, "Write each image's reconstruction there as a PNG."
)
_RESIZE = flags.DEFINE_bool(
    "resize", False, "Resize images of another size to the model's (bilinear), as "
    "--image_size did for the training images; .npy arrays must still fit.",
)
_BATCH_SIZE = flags.DEFINE_integer(
    "batch_size", 256, "Images per call of the model.", lower_bound=1
)


class InputError(ValueError):
    """An input file that cannot be classified; the message names the file."""


def resolve_model_dir(path):
    """`path` if it is a SavedModel, else its highest numbered version."""
    if os.path.exists(os.path.join(path, "saved_model.pb")):
        return path
    versions = []
    if os.path.isdir(path):
        versions = [
            int(name)
            for name in os.listdir(path)
            if name.isdigit() and os.path.exists(os.path.join(path, name, "saved_model.pb"))
        ]
    if not versions:
        raise InputError(
            f"--model={path} is neither a SavedModel directory (with saved_model.pb) nor "
            "an export directory holding numbered versions; export one with "
            "experiments/export.py."
        )
    return os.path.join(path, str(max(versions)))


def _expected(image_shape):
    height, width, channels = image_shape
    if channels == 1:
        return (
            f"expected a {width}x{height} grayscale image, or a .npy array of shape "
            f"[{height}, {width}], [{height}, {width}, 1], [N, {height}, {width}] or "
            f"[N, {height}, {width}, 1]"
        )
    return (
        f"expected a {width}x{height} image with {channels} channels, or a .npy array of "
        f"shape [{height}, {width}, {channels}] or [N, {height}, {width}, {channels}]"
    )


def load_images(path, image_shape, resize=False):
    """Reads one image file (PNG, JPEG, ...) or `.npy` file.

    `resize`: an image of another size is resized to `image_shape` (bilinear).

    Returns:
        `(images, batched)`: float32 images `[n, H, W, C]` in [0, 1], and
        whether the file held a batch (an `[N, ...]` array) rather than one
        image.

    Raises:
        InputError: unreadable file, wrong size, or values out of range.
    """
    import numpy as np

    height, width, channels = image_shape
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such file")
    if path.lower().endswith(".npy"):
        try:
            array = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as error:
            raise InputError(f"{path}: not a readable .npy array ({error})") from None
        shape = array.shape
        if shape[-2:] == (height, width) and channels == 1 and array.ndim in (2, 3):
            batched = array.ndim == 3
            array = array.reshape((-1, height, width, 1))
        elif shape[-3:] == (height, width, channels) and array.ndim in (3, 4):
            batched = array.ndim == 4
            array = array.reshape((-1, height, width, channels))
        else:
            raise InputError(f"{path}: array of shape {list(shape)}; {_expected(image_shape)}")
        if array.dtype.kind in "biu":
            if array.size and (array.min() < 0 or array.max() > 255):
                raise InputError(f"{path}: integer values must be in [0, 255]")
            return array.astype("float32") / 255.0, batched
        if array.dtype.kind != "f":
            raise InputError(f"{path}: unsupported dtype {array.dtype}; use uint8 or float")
        if array.size and not (np.all(array >= 0.0) and np.all(array <= 1.0)):
            raise InputError(
                f"{path}: float values must be in [0, 1] (found "
                f"[{np.nanmin(array):g}, {np.nanmax(array):g}]); save uint8 for 0-255 pixels"
            )
        return array.astype("float32"), batched
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            image.load()
            size, mode = image.size, image.mode
            if size != (width, height) and resize:
                image = image.convert("L" if channels == 1 else "RGB").resize(
                    (width, height), Image.Resampling.BILINEAR
                )
            elif size != (width, height):
                raise InputError(
                    f"{path}: image is {size[0]}x{size[1]} ({mode}); {_expected(image_shape)} "
                    "(or pass --resize)"
                )
            image = image.convert("L" if channels == 1 else "RGB")
            array = np.asarray(image, dtype=np.uint8)
    except (UnidentifiedImageError, OSError) as error:
        raise InputError(f"{path}: not a readable image ({error})") from None
    return array.reshape((1, height, width, channels)).astype("float32") / 255.0, False


def write_png(path, image):
    """Writes a float image `[H, W, C]` in [0, 1] as an 8-bit PNG."""
    import numpy as np
    from PIL import Image

    pixels = np.clip(np.rint(np.asarray(image) * 255.0), 0, 255).astype(np.uint8)
    if pixels.shape[-1] == 1:
        pixels = pixels[..., 0]
    Image.fromarray(pixels).save(path)


def main(argv):
    paths = argv[1:]
    if not paths:
        raise app.UsageError("Give one or more image files (PNG, JPEG or .npy) to classify.")
    import numpy as np
    import tensorflow as tf

    try:
        model_dir = resolve_model_dir(_MODEL.value)
    except InputError as error:
        sys.exit(f"error: {error}")
    loaded = tf.saved_model.load(model_dir)
    signature = loaded.signatures["serving_float"]
    image_shape = tuple(signature.structured_input_signature[1]["images"].shape[1:])
    labels_path = os.path.join(model_dir, "assets", "labels.txt")
    class_names = None
    if os.path.exists(labels_path):
        with open(labels_path) as file:
            class_names = file.read().splitlines()

    names, batches = [], []
    try:
        for path in paths:
            images, batched = load_images(path, image_shape, _RESIZE.value)
            batches.append(images)
            if batched:
                names += [f"{path}[{index}]" for index in range(len(images))]
            else:
                names.append(path)
    except InputError as error:
        sys.exit(f"error: {error}")
    images = np.concatenate(batches, axis=0)

    outputs = {"probabilities": [], "class_ids": [], "reconstruction": []}
    for start in range(0, len(images), _BATCH_SIZE.value):
        result = signature(images=tf.constant(images[start:start + _BATCH_SIZE.value]))
        for key in outputs:
            if key in result:
                outputs[key].append(result[key].numpy())
    probabilities = np.concatenate(outputs["probabilities"])
    class_ids = np.concatenate(outputs["class_ids"])
    for name, class_id, lengths in zip(names, class_ids, probabilities):
        label = class_names[class_id] if class_names else str(class_id)
        print(f"{name}: class {class_id} ({label}) probability {lengths[class_id]:.4f}")

    if _RECONSTRUCTION_DIR.value:
        if not outputs["reconstruction"]:
            sys.exit("error: this model has no decoder, so there are no reconstructions")
        os.makedirs(_RECONSTRUCTION_DIR.value, exist_ok=True)
        reconstructions = np.concatenate(outputs["reconstruction"])
        used = set()
        for name, reconstruction in zip(names, reconstructions):
            stem = os.path.splitext(os.path.basename(name.split("[")[0]))[0]
            if "[" in name:
                stem += "_" + name.rsplit("[", 1)[1].rstrip("]")
            filename, counter = f"{stem}_reconstruction.png", 1
            while filename in used:
                counter += 1
                filename = f"{stem}_{counter}_reconstruction.png"
            used.add(filename)
            write_png(os.path.join(_RECONSTRUCTION_DIR.value, filename), reconstruction)
        print(f"Wrote {len(names)} reconstruction(s) to {_RECONSTRUCTION_DIR.value}")


if __name__ == "__main__":
    app.run(main)
