"""Export of a trained CapsNet for serving: TensorFlow SavedModel and TFLite.

`export_saved_model(model, export_dir, version=1)` writes
`export_dir/<version>/`, the layout TensorFlow Serving watches (it serves the
highest numbered version). The SavedModel needs nothing but TensorFlow to load
(`tf.saved_model.load`, `saved_model_cli`, TensorFlow Serving): no
`capsnet_tf`, no Keras custom objects. It holds four functions:

- `serving_default(images)`: `images` uint8 `[batch, H, W, C]` in [0, 255]
  (any batch size, `[batch, 28, 28, 1]` for MNIST); returns
  `probabilities` (capsule lengths, float32 `[batch, num_classes]`; each in
  [0, 1), they do not sum to one), `class_ids` (int32 `[batch]`, the longest
  capsule), `capsules` (float32 `[batch, num_classes, capsule_dim]`, not
  masked) and `reconstruction` (float32 `[batch, H, W, C]` in [0, 1], decoded
  from the capsule of `class_ids`).
- `serving_float(images)`: the same for float32 images in [0, 1].
- `decode(capsules, class_ids)`: `capsules` float32
  `[batch, num_classes, capsule_dim]` (masked or not: every capsule but the
  one of `class_ids` is zeroed here) and `class_ids` int32 `[batch]`; returns
  `reconstruction` float32 `[batch, H, W, C]`. Perturbing one dimension of
  `capsules[:, class_id]` and decoding draws the paper's figure 4.
- `predict(images)` (Python only, not a signature): like `serving_default`
  for uint8, like `serving_float` for float32, and also accepts
  `[batch, H, W]` when `C == 1`.

The signatures have fixed input specs, so `saved_model_cli show` and
TensorFlow Serving's metadata show the expected shape and dtype. A wrong dtype
is refused by TensorFlow before the model runs; a wrong shape or value range
by a check at the start of every signature, whose error names the signature
and the expected input. Signatures take rank-4 images only: add the channel
axis to `[batch, 28, 28]` arrays (`images[..., None]`).

`assets/` carries what a server or client needs: `labels.txt` (one class name
per line, line `i` for class id `i`), `capsnet_metadata.json` (input format,
signatures, class names, model configuration, provenance) and `README.txt`.
After `tf.saved_model.load`, `loaded.labels_file.asset_path` and
`loaded.metadata_file.asset_path` hold their paths.

`convert_to_tflite(saved_model_dir)` converts those signatures to TFLite with
built-in operators only (routing's loop becomes a TFLite `WHILE`).

The graphs are traced with portable forms (`kernels="portable"`, see
`capsnet_tf.kernels`): PrimaryCaps' convolution as a `Conv2D`, the routing
of the whole batch in one loop, so an export made on a CPU runs on a GPU as
one made there would. `kernels="this_machine"` keeps the forms fastest on
the machine that exports (on CPUs: im2col and a matmul, inference routed in
chunks), for serving on that kind of machine only.
"""

import datetime
import json
import os
import shutil
import tempfile

import keras
import numpy as np
import tensorflow as tf

import capsnet_tf
from capsnet_tf.kernels import use_kernels
from capsnet_tf.serving_checks import checked_decode_inputs, checked_images

__all__ = [
    "DATASET_CLASS_NAMES",
    "ExportExistsError",
    "LABELS_FILE",
    "METADATA_FILE",
    "SIGNATURE_KEYS",
    "check_export_target",
    "convert_to_tflite",
    "export_saved_model",
    "load_metadata",
    "make_serving_module",
]

# Class names of the data sets this project trains on (TFDS label order).
DATASET_CLASS_NAMES = {
    "mnist": [str(digit) for digit in range(10)],
    "fashion_mnist": [
        "T-shirt/top",
        "Trouser",
        "Pullover",
        "Dress",
        "Coat",
        "Sandal",
        "Shirt",
        "Sneaker",
        "Bag",
        "Ankle boot",
    ],
}

SIGNATURE_KEYS = ("serving_default", "serving_float", "decode")
LABELS_FILE = "labels.txt"
METADATA_FILE = "capsnet_metadata.json"
README_FILE = "README.txt"
TFLITE_FILE = "model.tflite"
# Largest difference between the exported model and the Keras model accepted
# by the check after saving (observed: ~1e-8 for lengths and capsules).
_VERIFY_TOLERANCE = 1e-5


class ExportExistsError(FileExistsError):
    """The version directory of an export already holds something."""


def _inference_model(model):
    """The image-only inference model of a `CapsNet` or of an inference model."""
    if hasattr(model, "inference_model") and callable(model.inference_model):
        model = model.inference_model()
    if not isinstance(model, keras.Model) or len(model.inputs) != 1:
        raise ValueError(
            "Expected a CapsNet or its `inference_model()` (one image input). "
            f"Received: {type(model).__name__}"
        )
    outputs = model.output
    if isinstance(outputs, dict) and "probabilities" in outputs and "capsules" not in outputs:
        raise ValueError(
            "This is the baseline CNN (--model=baseline): the export writes CapsNet's "
            "serving signatures (capsules, reconstructions) and does not serve the "
            "baseline. Save it with `model.export(path)` from Keras instead."
        )
    if not isinstance(outputs, dict) or not {"length", "capsules"} <= set(outputs):
        raise ValueError(
            "The model must return a dict with 'length' and 'capsules' (and "
            "optionally 'reconstruction'), as `CapsNet.inference_model()` does. "
            f"Received outputs: {outputs!r}"
        )
    if "reconstruction" in outputs and len(outputs["reconstruction"].shape) != 4:
        raise ValueError(
            "Only one-target CapsNets can be exported (the serving signatures "
            "return one class and one reconstruction per image); this model "
            "reconstructs several targets per image (num_targets > 1, MultiMNIST): "
            f"reconstruction shape {tuple(outputs['reconstruction'].shape)}."
        )
    return model


def _checked_class_names(class_names, num_classes):
    """One name per class, as strings (default `"0"`, `"1"`, ...).

    Raises:
        ValueError: another number of names, or a name with a newline.
    """
    if class_names is None:
        class_names = [str(index) for index in range(num_classes)]
    class_names = [str(name) for name in class_names]
    if len(class_names) != num_classes or any("\n" in name for name in class_names):
        raise ValueError(
            f"`class_names` must hold {num_classes} names without newlines. "
            f"Received: {class_names!r}"
        )
    return class_names


def _serving_functions(inference, info):
    """The Python functions behind the signatures: `serving_default`, `serving_float`,
    `decode` (None without a decoder) and `predict`."""
    image_shape = tuple(info["image_shape"])
    num_classes, capsule_dim = info["num_classes"], info["capsule_dim"]
    has_decoder = info["has_decoder"]
    decoder = inference.get_layer("decoder") if has_decoder else None

    def outputs_for(images):
        # float32 outputs even for a model built under a mixed-precision policy.
        outputs = {
            key: tf.cast(value, tf.float32)
            for key, value in inference(images, training=False).items()
        }
        lengths = outputs["length"]
        result = {
            "probabilities": lengths,
            "class_ids": tf.argmax(lengths, axis=-1, output_type=tf.int32),
            "capsules": outputs["capsules"],
        }
        if has_decoder:
            result["reconstruction"] = outputs["reconstruction"]
        return result

    def serving_default(images):
        images = checked_images(images, image_shape, "serving_default", "uint8")
        return outputs_for(tf.cast(images, tf.float32) / 255.0)

    def serving_float(images):
        return outputs_for(checked_images(images, image_shape, "serving_float", "float32"))

    def decode(capsules, class_ids):
        capsules, class_ids = checked_decode_inputs(capsules, class_ids, num_classes,
                                                     capsule_dim)
        mask = tf.one_hot(class_ids, num_classes, dtype=capsules.dtype)
        reconstruction = decoder(capsules * mask[..., None], training=False)
        return {"reconstruction": tf.cast(reconstruction, tf.float32)}

    def predict(images):
        if images.shape.rank == 3:
            images = images[..., None]
        if images.dtype == tf.uint8:
            return serving_default(images)
        return serving_float(images)

    return serving_default, serving_float, decode if has_decoder else None, predict


def _traced_module(functions, info, kernels):
    """`(module, signatures)`: the functions traced with `kernels` on a trackable module."""
    serving_default, serving_float, decode, predict = functions
    image_shape = tuple(info["image_shape"])
    num_classes, capsule_dim = info["num_classes"], info["capsule_dim"]
    module = tf.__internal__.tracking.AutoTrackable()
    spec = (None,) + image_shape
    module.serving_default = tf.function(
        serving_default,
        input_signature=[tf.TensorSpec(spec, tf.uint8, name="images")],
        autograph=False,
    )
    module.serving_float = tf.function(
        serving_float,
        input_signature=[tf.TensorSpec(spec, tf.float32, name="images")],
        autograph=False,
    )
    signatures = {
        "serving_default": module.serving_default,
        "serving_float": module.serving_float,
    }
    if decode is not None:
        module.decode = tf.function(
            decode,
            input_signature=[
                tf.TensorSpec((None, num_classes, capsule_dim), tf.float32, name="capsules"),
                tf.TensorSpec((None,), tf.int32, name="class_ids"),
            ],
            autograph=False,
        )
        signatures["decode"] = module.decode
    module.predict = tf.function(predict, autograph=False)
    with use_kernels(kernels):  # every trace happens here
        concrete = [function.get_concrete_function() for function in signatures.values()]
        for dtype in (tf.uint8, tf.float32):
            concrete.append(module.predict.get_concrete_function(tf.TensorSpec(spec, dtype)))
            if image_shape[-1] == 1:
                concrete.append(
                    module.predict.get_concrete_function(tf.TensorSpec(spec[:-1], dtype))
                )
    # Track the variables the functions capture (not only Keras' wrappers), as
    # keras.export.ExportArchive does: TFLite's converter then freezes them.
    captured = {}
    for function in concrete:
        for variable in function.variables:
            captured.setdefault(id(variable), variable)
    module.variables = list(captured.values())
    return module, signatures


def make_serving_module(model, class_names=None, kernels="portable"):
    """The `tf.Module`-like object that `export_saved_model` saves.

    Args:
        model: a `CapsNet` (its weights are used as they are) or its
            `inference_model()`.
        class_names: one name per class (default `"0"`, `"1"`, ...).
        kernels: the forms the functions are traced with, one of
            `capsnet_tf.kernels.KERNEL_SETS` (see the module docstring).

    Returns:
        `(module, signatures, info)`: a trackable object with the functions
        `serving_default`, `serving_float`, `decode` (when the model has a
        decoder) and `predict`; the dict of signatures for
        `tf.saved_model.save`; and a dict describing shapes and names.

    Example:

    >>> from capsnet_tf import CapsNet
    >>> model = CapsNet(image_shape=(12, 12, 1), conv_filters=4,
    ...                 conv_kernel_size=3, primary_capsule_types=2,
    ...                 primary_capsule_dim=4, primary_kernel_size=3,
    ...                 capsule_dim=6, decoder_units=(8,))
    >>> module, signatures, info = make_serving_module(model)
    >>> sorted(signatures), info["image_shape"]
    (['decode', 'serving_default', 'serving_float'], [12, 12, 1])
    """
    inference = _inference_model(model)
    _, num_classes, capsule_dim = inference.output["capsules"].shape
    info = {
        "image_shape": [int(size) for size in inference.inputs[0].shape[1:]],
        "num_classes": int(num_classes),
        "capsule_dim": int(capsule_dim),
        "class_names": _checked_class_names(class_names, num_classes),
        "has_decoder": "reconstruction" in inference.output,
        "kernels": kernels,
    }
    module, signatures = _traced_module(_serving_functions(inference, info), info, kernels)
    return module, signatures, info


def _describe(info):
    """`(signatures, input_format)`: the metadata's description of each signature and input."""
    shape = [-1] + info["image_shape"]
    outputs = _output_docs(info, shape)
    signatures = {
        "serving_default": _images_signature(
            "uint8", shape, "pixel values in [0, 255]; white on black as in MNIST", outputs
        ),
        "serving_float": _images_signature(
            "float32", shape, "pixel values in [0, 1] (uint8 / 255)", outputs
        ),
    }
    if info["has_decoder"]:
        signatures["decode"] = _decode_signature(info, outputs["reconstruction"])
    return signatures, _input_format(info)


def _output_docs(info, shape):
    """The outputs of the image signatures, described for clients: dtype, shape, meaning."""
    outputs = {
        "probabilities": {
            "dtype": "float32",
            "shape": [-1, info["num_classes"]],
            "description": "capsule lengths in [0, 1), one per class; they do not sum to 1",
        },
        "class_ids": {
            "dtype": "int32",
            "shape": [-1],
            "description": "predicted class: index of the longest capsule; its name is "
            f"line class_id of assets/{LABELS_FILE}",
        },
        "capsules": {
            "dtype": "float32",
            "shape": [-1, info["num_classes"], info["capsule_dim"]],
            "description": "class capsules (instantiation parameters), not masked",
        },
    }
    if info["has_decoder"]:
        outputs["reconstruction"] = {
            "dtype": "float32",
            "shape": shape,
            "description": "decoder output in [0, 1] from the capsule of class_ids",
        }
    return outputs


def _images_signature(dtype, shape, description, outputs):
    """An image signature's description: its one `images` input and `outputs`."""
    return {
        "inputs": {
            "images": {
                "dtype": dtype,
                "shape": shape,
                "description": description,
            }
        },
        "outputs": outputs,
    }


def _decode_signature(info, reconstruction):
    """The `decode` signature's description: capsules and class ids in, `reconstruction` out."""
    return {
        "inputs": {
            "capsules": {
                "dtype": "float32",
                "shape": [-1, info["num_classes"], info["capsule_dim"]],
                "description": "class capsules, masked or not: all but the capsule "
                "of class_ids are zeroed before decoding",
            },
            "class_ids": {
                "dtype": "int32",
                "shape": [-1],
                "description": f"the class to decode, in [0, {info['num_classes']})",
            },
        },
        "outputs": {"reconstruction": reconstruction},
    }


def _input_format(info):
    """One sentence on the images the signatures take, for the metadata and README."""
    height, width, channels = info["image_shape"]
    return (
        f"Batches of {height}x{width} images with {channels} channel(s), shape "
        f"[batch, {height}, {width}, {channels}] (any batch size, rank 4: add the "
        "channel axis to [batch, height, width] arrays): uint8 in [0, 255] for "
        "serving_default, float32 in [0, 1] for serving_float."
    )


def _readme(metadata):
    lines = [
        "CapsNet (Sabour et al., 2017, arXiv:1710.09829) exported by capsnet_tf.",
        "",
        "Input: " + metadata["input_format"],
        f"Classes ({metadata['num_classes']}): see {LABELS_FILE}, line i names class id i.",
        "",
        "Signatures:",
    ]
    for name, signature in metadata["signatures"].items():
        inputs = ", ".join(
            f"{key} {value['dtype']} {value['shape']}" for key, value in signature["inputs"].items()
        )
        outputs = ", ".join(
            f"{key} {value['dtype']} {value['shape']}"
            for key, value in signature["outputs"].items()
        )
        lines.append(f"  {name}({inputs}) -> {outputs}")
    lines += [
        "",
        "Shapes use -1 for the batch size. Python:",
        "  loaded = tf.saved_model.load(path)",
        "  out = loaded.signatures['serving_default'](images=tf.constant(uint8_images))",
        "",
        f"Full description: {METADATA_FILE}.",
        "",
    ]
    return "\n".join(lines)


def _has_content(path):
    return os.path.isdir(path) and bool(os.listdir(path))


def _verify(saved_model_dir, inference, info):
    """Loads the export and compares it with the Keras model on a probe batch."""
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(3, *info["image_shape"]), dtype=np.uint8)
    expected = inference(pixels.astype("float32") / 255.0, training=False)
    loaded = tf.saved_model.load(saved_model_dir)
    actual = loaded.signatures["serving_default"](images=tf.constant(pixels))
    pairs = [("probabilities", "length"), ("capsules", "capsules")]
    if info["has_decoder"]:
        pairs.append(("reconstruction", "reconstruction"))
    for name, keras_name in pairs:
        difference = float(
            np.max(np.abs(actual[name].numpy() - np.asarray(expected[keras_name])))
        )
        if not difference <= _VERIFY_TOLERANCE:
            raise RuntimeError(
                f"The exported SavedModel disagrees with the Keras model: its {name!r} "
                f"differs by {difference:.3g} (tolerance {_VERIFY_TOLERANCE}). Nothing was "
                "published; please report this."
            )


def check_export_target(export_dir, version, overwrite=False):
    """Checks that `export_dir/<version>` may be written; returns its path.

    Args:
        export_dir: the base directory of the export.
        version: positive integer version.
        overwrite: whether an existing, non-empty version may be replaced.

    Returns:
        The path `export_dir/<version>`.

    Raises:
        ExportExistsError: the version exists and is not an empty directory,
            and `overwrite` is false (or it is not a directory at all).
        ValueError: `version` is not a positive integer.
    """
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ValueError(f"`version` must be a positive integer. Received: version={version!r}")
    export_dir = os.fspath(export_dir)
    target = os.path.join(export_dir, str(version))
    if os.path.lexists(target) and not os.path.isdir(target):
        raise ExportExistsError(
            f"{target} exists and is not a directory; refusing to touch it. Remove it "
            "or choose another version or export directory."
        )
    if _has_content(target) and not overwrite:
        what = (
            "a SavedModel"
            if os.path.exists(os.path.join(target, "saved_model.pb"))
            else f"{len(os.listdir(target))} file(s)"
        )
        raise ExportExistsError(
            f"The export directory {target} already holds {what}; nothing was written. "
            "Choose another version (TensorFlow Serving serves the highest version in "
            f"{export_dir}) or export directory, or pass overwrite=True (--overwrite) "
            "to replace it."
        )
    return target


def export_saved_model(
    model,
    export_dir,
    version=1,
    overwrite=False,
    class_names=None,
    metadata=None,
    tflite=False,
    verify=True,
    derived=None,
    kernels="portable",
):
    """Writes the inference model as a SavedModel into `export_dir/<version>/`.

    The export is written into a hidden staging directory next to the target
    (`export_dir/.staging-<version>-*`, which TensorFlow Serving ignores),
    checked against the Keras model, and only then renamed into place, so a
    server never sees a half-written version and a failed export leaves the
    target as it was. See the module docstring for the signatures and assets.

    Args:
        model: a `CapsNet` or its `inference_model()`, weights loaded.
        export_dir: the base directory (TensorFlow Serving's `--model_base_path`).
        version: positive integer version, the subdirectory name.
        overwrite: replace `export_dir/<version>` when it already holds
            something; otherwise that raises `ExportExistsError`.
        class_names: one name per class, written to `assets/labels.txt`
            (default: `"0"`, `"1"`, ...).
        metadata: JSON-serialisable dict added under `"source"` to
            `assets/capsnet_metadata.json` (e.g. the work directory and
            checkpoint the weights came from).
        tflite: also write `model.tflite` (see `convert_to_tflite`) into the
            version directory.
        verify: reload the written SavedModel and compare it with the Keras
            model before publishing it.
        derived: optional callable given the staged SavedModel directory
            before it is published, to write files made from it there (the
            quantized TFLite and ONNX models of `capsnet_tf.deploy`); if it
            raises, nothing is published.
        kernels: `"portable"` (default: runs on every device as an export
            made there would), `"this_machine"` (the forms fastest on this
            machine) or `"straight_line"` (portable, routing without loops);
            see `capsnet_tf.kernels`.

    Returns:
        The path of the version directory.

    Raises:
        ExportExistsError: the version directory is not empty and `overwrite`
            is false (nothing is changed).
        ValueError: invalid `version`, `class_names` or model.

    Example:

    >>> import tempfile
    >>> from capsnet_tf import CapsNet
    >>> model = CapsNet(image_shape=(12, 12, 1), conv_filters=4,
    ...                 conv_kernel_size=3, primary_capsule_types=2,
    ...                 primary_capsule_dim=4, primary_kernel_size=3,
    ...                 capsule_dim=6, decoder_units=(8,))
    >>> with tempfile.TemporaryDirectory() as export_dir:
    ...     path = export_saved_model(model, export_dir, version=3)
    ...     loaded = tf.saved_model.load(path)
    ...     print(os.path.basename(path), sorted(loaded.signatures))
    ...     print(sorted(os.listdir(os.path.join(path, "assets"))))
    3 ['decode', 'serving_default', 'serving_float']
    ['README.txt', 'capsnet_metadata.json', 'labels.txt']
    """
    target = check_export_target(export_dir, version, overwrite)
    export_dir = os.fspath(export_dir)

    inference = _inference_model(model)
    module, signatures, info = make_serving_module(inference, class_names, kernels)
    full_metadata = _export_metadata(info, kernels, version, metadata)

    os.makedirs(export_dir, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".staging-{version}-", dir=export_dir)
    try:
        saved = _save_staged(module, signatures, info, full_metadata, staging, kernels)
        if verify:
            _verify(saved, inference, info)
        if tflite:
            convert_to_tflite(saved, os.path.join(saved, TFLITE_FILE))
        if derived is not None:
            derived(saved)
        _publish(saved, target, staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _export_metadata(info, kernels, version, source):
    """`capsnet_metadata.json`'s contents: input format, signatures, classes and provenance."""
    signature_docs, input_format = _describe(info)
    full_metadata = {
        "format": "capsnet_tf SavedModel",
        "model": "CapsNet (Sabour, Frosst & Hinton, 2017, arXiv:1710.09829)",
        "input_format": input_format,
        "image_shape": info["image_shape"],
        "num_classes": info["num_classes"],
        "capsule_dim": info["capsule_dim"],
        "class_names": info["class_names"],
        "labels_file": f"assets/{LABELS_FILE}",
        "signatures": signature_docs,
        "kernels": kernels,
        "version": version,
        "exported_at": datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"
        ),
        "tensorflow_version": tf.__version__,
        "keras_version": keras.__version__,
        "source": source or {},
    }
    full_metadata["capsnet_tf_version"] = capsnet_tf.__version__
    return full_metadata


def _save_staged(module, signatures, info, full_metadata, staging, kernels):
    """Saves `module` with its assets under `staging`, traced with `kernels`; returns the path."""
    with tempfile.TemporaryDirectory() as sources:
        files = {
            LABELS_FILE: "\n".join(info["class_names"]) + "\n",
            METADATA_FILE: json.dumps(full_metadata, indent=2) + "\n",
            README_FILE: _readme(full_metadata),
        }
        for name, text in files.items():
            with open(os.path.join(sources, name), "w") as file:
                file.write(text)
        module.labels_file = tf.saved_model.Asset(os.path.join(sources, LABELS_FILE))
        module.metadata_file = tf.saved_model.Asset(os.path.join(sources, METADATA_FILE))
        module.readme_file = tf.saved_model.Asset(os.path.join(sources, README_FILE))
        saved = os.path.join(staging, "model")
        with use_kernels(kernels):  # in case saving traces anything anew
            tf.saved_model.save(module, saved, signatures=signatures)
    return saved


def _publish(saved, target, staging):
    """Renames `saved` to `target`, so a server sees the whole version or none of it.

    A version already at `target` is moved into `staging` first (removed
    with it) and put back if the rename fails.
    """
    backup = None
    if os.path.lexists(target):
        backup = os.path.join(staging, "previous")
        os.rename(target, backup)
    try:
        os.rename(saved, target)
    except OSError:
        if backup is not None:
            os.rename(backup, target)
        raise


def load_metadata(saved_model_dir):
    """The `capsnet_metadata.json` of an export, as a dict (needs no TensorFlow)."""
    with open(os.path.join(saved_model_dir, "assets", METADATA_FILE)) as file:
        return json.load(file)


def convert_to_tflite(saved_model_dir, output_path=None, signature_keys=None):
    """Converts an exported SavedModel to TFLite, built-in operators only.

    Every signature is kept (`serving_default`, `serving_float`, `decode`);
    the TFLite interpreter's `get_signature_runner(name)` runs each. The
    converter drops the SavedModel's in-graph input checks (TFLite has no
    `Assert` operator; keeping them would need SELECT_TF_OPS): the TFLite
    interpreter refuses a wrong dtype, but a signature runner resizes its
    inputs to whatever shape it is given, so TFLite callers must pass the
    documented shape and value range themselves. The weights stay float32,
    so the file has the size of the float32 parameters (~33 MB for the
    paper's MNIST CapsNet).

    Args:
        saved_model_dir: a directory written by `export_saved_model`.
        output_path: where to write the `.tflite` file (None: do not write).
        signature_keys: signatures to convert (default: all).

    Returns:
        The TFLite flatbuffer as bytes.

    Example:

    >>> import tempfile
    >>> from capsnet_tf import CapsNet
    >>> model = CapsNet(image_shape=(12, 12, 1), conv_filters=4,
    ...                 conv_kernel_size=3, primary_capsule_types=2,
    ...                 primary_capsule_dim=4, primary_kernel_size=3,
    ...                 capsule_dim=6, decoder_units=(8,))
    >>> with tempfile.TemporaryDirectory() as export_dir:
    ...     flatbuffer = convert_to_tflite(
    ...         export_saved_model(model, export_dir, verify=False))
    >>> flatbuffer[4:8]  # the TFLite file identifier
    b'TFL3'
    """
    converter = tf.lite.TFLiteConverter.from_saved_model(
        os.fspath(saved_model_dir),
        signature_keys=list(signature_keys) if signature_keys else None,
    )
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    flatbuffer = converter.convert()
    if output_path is not None:
        with open(output_path, "wb") as file:
            file.write(flatbuffer)
    return flatbuffer
