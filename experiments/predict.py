r"""Classifies images with an exported CapsNet SavedModel.

Usage:

    python experiments/predict.py --model=/tmp/capsnet_serving/1 digit.png other.png
    python experiments/predict.py --model=/tmp/capsnet_serving digits.npy \
        --reconstruction_dir=/tmp/reconstructions

Prints one line per image: `<file>: class <id> (<name>) probability <p>`,
where the probability is the length of the predicted class's capsule. With
`--reconstruction_dir` the decoder's reconstruction of every image is written
there as a PNG (`<file stem>_reconstruction.png`).

Inputs: PNG, JPEG, BMP, GIF, TIFF, WebP or PPM images (recognised by their
content, not their name; no other format Pillow knows, so an EPS never
reaches Ghostscript) of exactly the model's size, 28x28 for MNIST, or of any
size up to 50 megapixels with `--resize` (as a run with `--image_size`
resized its training images); colour images are converted to grayscale
(ITU-R 601-2 luma) for a grayscale model, grayscale ones to RGB for a colour
model. The class names printed are the export's `assets/labels.txt`: an
image folder's sub-folder names for a run on `--image_folder`. `.npy`
arrays of shape `[28, 28]`, `[28, 28, 1]` (one image) or `[N, 28, 28]`,
`[N, 28, 28, 1]` (N images, printed as `file[i]`), uint8 in [0, 255] or
float in [0, 1]. MNIST digits are white on black.

`--model` is a version directory (`<export_dir>/1`) or the export directory
itself, whose highest version is used. Only TensorFlow, NumPy and PIL are
needed: the SavedModel runs without capsnet_tf. A SavedModel is a program:
load only exports you trust.

A file or model that cannot be used stops the script with one line,
`error: <file>: <the problem>`, and exit status 1: an image's size is read
from its header and a `.npy` array's shape and dtype from its header before
anything is decoded or loaded, and with an export's recorded input shape
(`assets/capsnet_metadata.json`) every file is checked before TensorFlow is
imported.
"""

import json
import math
import os
import sys
import warnings

from absl import app, flags

# oneDNN's CPU kernels on AVX2-only CPUs too, where TensorFlow leaves them off
# (docs/performance.md). Read once, when TensorFlow is first imported; =0 keeps them off.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

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


# The image formats read: those a digit is kept in. Not all that Pillow can
# open: EPS and PDF would hand the file to Ghostscript.
IMAGE_FORMATS = ("PNG", "JPEG", "BMP", "GIF", "TIFF", "WEBP", "PPM")
# The most pixels read from one image (with --resize; without it an image must
# have the model's size): a 50-megapixel photograph.
MAX_IMAGE_PIXELS = 50_000_000


class InputError(ValueError):
    """An input file or model that cannot be used; the message names it."""


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

    Nothing is decoded or loaded before its size is known to fit: an image's
    size comes from its header, a `.npy` array's shape and dtype from its
    header.

    `resize`: an image of another size is resized to `image_shape` (bilinear).

    Returns:
        `(images, batched)`: float32 images `[n, H, W, C]` in [0, 1], and
        whether the file held a batch (an `[N, ...]` array) rather than one
        image.

    Raises:
        InputError: unreadable file, wrong size, or values out of range.
    """
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such file")
    if path.lower().endswith(".npy"):
        return _load_npy(path, image_shape)
    return _load_image(path, image_shape, resize), False


def _load_npy(path, image_shape):
    """`(images, batched)` of a `.npy` file; its header is checked before its data is read."""
    import numpy as np

    height, width, channels = image_shape
    try:
        with open(path, "rb") as file:
            version = np.lib.format.read_magic(file)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, _, dtype = read_header(file)
            data_bytes = os.fstat(file.fileno()).st_size - file.tell()
    except (OSError, ValueError, SyntaxError, TypeError) as error:
        raise InputError(f"{path}: not a readable .npy array ({_one_line(error)})") from None
    if dtype.kind not in "biuf":
        raise InputError(f"{path}: unsupported dtype {dtype}; use uint8 or float")
    if shape[-2:] == (height, width) and channels == 1 and len(shape) in (2, 3):
        batched = len(shape) == 3
        target = (-1, height, width, 1)
    elif shape[-3:] == (height, width, channels) and len(shape) in (3, 4):
        batched = len(shape) == 4
        target = (-1, height, width, channels)
    else:
        raise InputError(f"{path}: array of shape {list(shape)}; {_expected(image_shape)}")
    expected_bytes = math.prod(shape) * dtype.itemsize
    if data_bytes != expected_bytes:  # before NumPy allocates what the header claims
        raise InputError(
            f"{path}: its header describes {expected_bytes:,} bytes of {dtype} {list(shape)}, "
            f"but the file holds {data_bytes:,}: a damaged or incomplete .npy file"
        )
    try:
        array = np.load(path, allow_pickle=False).reshape(target)
    except (OSError, ValueError, EOFError) as error:  # e.g. the data is cut short
        raise InputError(f"{path}: not a readable .npy array ({_one_line(error)})") from None
    if array.dtype.kind in "biu":
        if array.size and (array.min() < 0 or array.max() > 255):
            raise InputError(f"{path}: integer values must be in [0, 255]")
        return array.astype("float32") / 255.0, batched
    if array.size and not (np.all(array >= 0.0) and np.all(array <= 1.0)):
        raise InputError(
            f"{path}: float values must be in [0, 1] (found "
            f"[{np.nanmin(array):g}, {np.nanmax(array):g}]); save uint8 for 0-255 pixels"
        )
    return array.astype("float32"), batched


def _load_image(path, image_shape, resize):
    """float32 `[1, H, W, C]` of an image file; its size is checked before it is decoded."""
    import numpy as np
    from PIL import Image, UnidentifiedImageError

    height, width, channels = image_shape
    mode = "L" if channels == 1 else "RGB"
    # Pillow checks an image's size against this when it reads the header;
    # above it, its warning is raised as an error here.
    Image.MAX_IMAGE_PIXELS = MAX_IMAGE_PIXELS
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(path, formats=IMAGE_FORMATS)
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as error:
        raise InputError(f"{path}: more than {MAX_IMAGE_PIXELS:,} pixels, too large to read "
                         f"(Pillow: {error})") from None
    except UnidentifiedImageError:
        raise InputError(
            f"{path}: not an image in a format predict.py reads ({', '.join(IMAGE_FORMATS)}) "
            "nor a .npy array"
        ) from None
    except Exception as error:  # a damaged header: Pillow's OSError, SyntaxError, ValueError
        raise InputError(f"{path}: not a readable image ({_one_line(error)})") from None
    try:
        with image:
            size = image.size  # from the header: nothing is decoded yet
            if size != (width, height) and not resize:
                raise InputError(
                    f"{path}: image is {size[0]}x{size[1]} ({image.mode}); "
                    f"{_expected(image_shape)} (or pass --resize)"
                )
            image.draft(mode, (width, height))  # a JPEG decodes at a reduced scale
            image = image.convert(mode)  # decodes
            if image.size != (width, height):
                image = image.resize((width, height), Image.Resampling.BILINEAR)
            array = np.asarray(image, dtype=np.uint8)
    except InputError:
        raise
    except Exception as error:  # any failure to decode is the file's
        # Pillow reports damaged pixel data as OSError, SyntaxError,
        # ValueError, EOFError or zlib.error, depending on where it is.
        raise InputError(f"{path}: not a readable image ({_one_line(error)})") from None
    return array.reshape((1, height, width, channels)).astype("float32") / 255.0


def _one_line(error, limit=300):
    """`Type: message` of an exception, on one line of at most `limit` characters."""
    text = " ".join(str(error).split()) or "no details"
    text = f"{type(error).__name__}: {text}"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def write_png(path, image):
    """Writes a float image `[H, W, C]` in [0, 1] as an 8-bit PNG."""
    import numpy as np
    from PIL import Image

    pixels = np.clip(np.rint(np.asarray(image) * 255.0), 0, 255).astype(np.uint8)
    if pixels.shape[-1] == 1:
        pixels = pixels[..., 0]
    Image.fromarray(pixels).save(path)


def write_reconstructions(directory, names, reconstructions):
    """Writes each reconstruction as `<file stem>[_<index>]_reconstruction.png`."""
    os.makedirs(directory, exist_ok=True)
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
        write_png(os.path.join(directory, filename), reconstruction)


def load_all(paths, image_shape, resize):
    """`(names, images [n, H, W, C])` of every file, in order (`load_images`)."""
    import numpy as np

    names, batches = [], []
    for path in paths:
        images, batched = load_images(path, image_shape, resize)
        batches.append(images)
        if batched:
            names += [f"{path}[{index}]" for index in range(len(images))]
        else:
            names.append(path)
    return names, np.concatenate(batches, axis=0)


def metadata_image_shape(model_dir):
    """The input shape `(H, W, C)` that a capsnet_tf export records, or None.

    Read from `assets/capsnet_metadata.json` without TensorFlow; `load_model`
    checks it against the signature.
    """
    try:
        with open(os.path.join(model_dir, "assets", "capsnet_metadata.json")) as file:
            shape = json.load(file).get("image_shape")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(shape, list) and len(shape) == 3 and all(
        type(size) is int and size > 0 for size in shape
    ):
        return tuple(shape)
    return None


def load_model(model_dir):
    """`(serving_float signature, image shape (H, W, C), class names or None)` of an export.

    Raises:
        InputError: the directory does not load as a SavedModel, or it is not
            a capsnet_tf export (no `serving_float` signature taking `images`
            and giving `probabilities` and `class_ids`), or its
            `assets/labels.txt` does not name one class per output.
    """
    import tensorflow as tf

    try:
        loaded = tf.saved_model.load(model_dir)
    except Exception as error:  # a damaged directory fails in TensorFlow's or protobuf's ways
        raise InputError(f"--model={model_dir}: cannot load the SavedModel ({_one_line(error)})")
    signatures = dict(loaded.signatures)
    signature = signatures.get("serving_float")
    if signature is None:
        raise InputError(
            f"--model={model_dir} has no 'serving_float' signature (it has {sorted(signatures)}): "
            "not a capsnet_tf export; export one with experiments/export.py"
        )
    images = signature.structured_input_signature[1].get("images")
    outputs = signature.structured_outputs
    if images is None or images.shape.rank != 4 or not {"probabilities", "class_ids"} <= set(
        outputs
    ):
        raise InputError(
            f"--model={model_dir}: its 'serving_float' signature does not take 'images' "
            "[batch, H, W, C] and give 'probabilities' and 'class_ids': not a capsnet_tf export"
        )
    image_shape = tuple(images.shape[1:])
    num_classes = outputs["probabilities"].shape[-1]
    labels_path = os.path.join(model_dir, "assets", "labels.txt")
    class_names = None
    if os.path.exists(labels_path):
        try:
            with open(labels_path, encoding="utf-8") as file:
                class_names = file.read().splitlines()
        except (OSError, UnicodeDecodeError) as error:
            raise InputError(f"{labels_path}: not readable ({_one_line(error)})")
        if num_classes is not None and len(class_names) != num_classes:
            raise InputError(
                f"{labels_path} names {len(class_names)} classes, but the model has "
                f"{num_classes}: the file does not belong to this export"
            )
    return signature, image_shape, class_names


def main(argv):
    paths = argv[1:]
    if not paths:
        raise app.UsageError("Give one or more image files (PNG, JPEG or .npy) to classify.")
    import numpy as np

    try:
        model_dir = resolve_model_dir(_MODEL.value)
        # With the export's recorded input shape the files are read before
        # TensorFlow is imported: a bad file is reported at once, in one line.
        recorded_shape = metadata_image_shape(model_dir)
        if recorded_shape is not None:
            names, images = load_all(paths, recorded_shape, _RESIZE.value)
        import tensorflow as tf

        signature, image_shape, class_names = load_model(model_dir)
        if recorded_shape is None:
            names, images = load_all(paths, image_shape, _RESIZE.value)
        elif recorded_shape != image_shape:
            raise InputError(
                f"--model={model_dir}: assets/capsnet_metadata.json records images of shape "
                f"{list(recorded_shape)}, but the model takes {list(image_shape)}: the "
                "metadata does not belong to this export"
            )
    except InputError as error:
        sys.exit(f"error: {error}")

    outputs = {"probabilities": [], "class_ids": [], "reconstruction": []}
    for start in range(0, len(images), _BATCH_SIZE.value):
        try:
            result = signature(images=tf.constant(images[start:start + _BATCH_SIZE.value]))
        except (tf.errors.OpError, ValueError, TypeError) as error:
            sys.exit(f"error: --model={model_dir} failed on the images ({_one_line(error)})")
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
        try:
            write_reconstructions(_RECONSTRUCTION_DIR.value, names,
                                  np.concatenate(outputs["reconstruction"]))
        except OSError as error:
            sys.exit(f"error: --reconstruction_dir={_RECONSTRUCTION_DIR.value}: "
                     f"{_one_line(error)}")
        print(f"Wrote {len(names)} reconstruction(s) to {_RECONSTRUCTION_DIR.value}")


if __name__ == "__main__":
    app.run(main)
