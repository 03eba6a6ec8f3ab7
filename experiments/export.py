r"""Exports a trained CapsNet as a TensorFlow SavedModel for serving.

Usage, from the repository root or from `experiments/`:

    python experiments/export.py --workdir=/tmp/capsnet_mnist --export_dir=/tmp/capsnet_serving
    python experiments/export.py --workdir=... --export_dir=... --version=2 --tflite
    python experiments/export.py --workdir=... --export_dir=... --tflite \
        --quantize=dynamic,float16,int8 --onnx

Reads the best (or `--checkpoint=latest`) checkpoint of a training work
directory (`experiments/mnist.py --workdir=...`) and writes
`<export_dir>/<version>/`: the SavedModel (signatures `serving_default` for
uint8 images, `serving_float` for float32 images in [0, 1], `decode` for
capsules), `assets/labels.txt`, `assets/capsnet_metadata.json`,
`assets/README.txt` and, with `--tflite`, `model.tflite`; with `--quantize`,
`model_<mode>.tflite`; with `--onnx`, `model.onnx` (`capsnet_tf.deploy`, the
`export` extra). An existing
version is never replaced unless `--overwrite` is given. The graphs use
portable forms, which run on any device as an export made there would;
`--kernels=this_machine` keeps the forms fastest on this machine instead
(`capsnet_tf.kernels`; the quantized TFLite files are always portable). Serve it with

    tensorflow_model_server --model_name=capsnet --model_base_path=<export_dir>
"""

import os
import sys

from absl import app, flags

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))  # the repository, when not installed

# oneDNN's CPU kernels on AVX2-only CPUs too, where TensorFlow leaves them off
# (docs/performance.md). Read once, when TensorFlow is first imported; =0 keeps them off.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Training work directory (config.json, model.json, checkpoints/).",
    required=True,
)
_EXPORT_DIR = flags.DEFINE_string(
    "export_dir", None, "Base directory of the export; the model goes to <export_dir>/<version>.",
    required=True,
)
_VERSION = flags.DEFINE_integer(
    "version", 1, "Version number: the subdirectory TensorFlow Serving loads.", lower_bound=1
)
_CHECKPOINT = flags.DEFINE_enum(
    "checkpoint", "best", ["best", "latest"], "Which checkpoint of --workdir to export."
)
_OVERWRITE = flags.DEFINE_bool(
    "overwrite", False, "Replace <export_dir>/<version> when it already holds a model."
)
_TFLITE = flags.DEFINE_bool(
    "tflite", False, "Also write <export_dir>/<version>/model.tflite (built-in TFLite ops)."
)
_QUANTIZE = flags.DEFINE_list(
    "quantize", [],
    "Also write model_<mode>.tflite for each mode, comma-separated: dynamic (int8 weights), "
    "float16 (float16 weights), int8 (full integer, uint8 input and output, calibrated on "
    "--calibration_examples training images). Needs the export extra.",
)
flags.register_validator(
    "quantize",
    lambda modes: all(mode in ("dynamic", "float16", "int8") for mode in modes),
    message="--quantize takes modes from dynamic, float16, int8 (comma-separated)",
)
_CALIBRATION_EXAMPLES = flags.DEFINE_integer(
    "calibration_examples", 500, "Training images that calibrate --quantize=int8.",
    lower_bound=1,
)
_KERNELS = flags.DEFINE_enum(
    "kernels", "portable", ["portable", "this_machine"],
    "Forms the graphs are traced with: portable (PrimaryCaps as a Conv2D, the routing of the "
    "whole batch in one loop; runs on any device as an export made there) or this_machine "
    "(the forms fastest here, e.g. im2col and chunked routing on CPUs).",
)
_ONNX = flags.DEFINE_bool(
    "onnx", False, "Also write model.onnx (tf2onnx, serving_float signature). Needs the export "
    "extra.",
)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    from capsnet_tf.export import (
        DATASET_CLASS_NAMES,
        ExportExistsError,
        check_export_target,
        export_saved_model,
    )
    from capsnet_tf.workdir import load_trained_model, read_class_names

    if _QUANTIZE.value or _ONNX.value:
        from capsnet_tf.deploy import check_export_extra
        from capsnet_tf.extras import MissingDependencyError

        try:  # before anything slow
            check_export_extra(onnx=_ONNX.value, tflite=bool(_QUANTIZE.value))
        except MissingDependencyError as error:
            sys.exit(f"error: {error}")
    try:
        # Refuse an occupied version before the (slow) model loading.
        check_export_target(_EXPORT_DIR.value, _VERSION.value, _OVERWRITE.value)
    except ExportExistsError as error:
        sys.exit(f"error: {error}")
    try:
        model, config = load_trained_model(_WORKDIR.value, checkpoint=_CHECKPOINT.value)
    except (FileNotFoundError, ValueError) as error:
        sys.exit(f"error: {error}")
    # The run's own labels.txt (an image folder's class names), else the data set's.
    class_names = read_class_names(_WORKDIR.value, model.num_classes)
    if class_names is None:
        class_names = DATASET_CLASS_NAMES.get(config.dataset)
    if class_names is not None and len(class_names) != model.num_classes:
        class_names = None
    source = {
        "workdir": os.path.abspath(_WORKDIR.value),
        "checkpoint": f"checkpoints/{_CHECKPOINT.value}.weights.h5",
        "dataset": config.dataset,
        "model_config": model.get_config(),
    }
    calibration = None
    if "int8" in _QUANTIZE.value:
        try:
            calibration = _calibration_images(config, _CALIBRATION_EXAMPLES.value)
        except (FileNotFoundError, ValueError) as error:
            sys.exit(f"error: {error}")
    written = []

    def derived(saved):
        """The quantized TFLite files and the ONNX model, made from the staged SavedModel."""
        from capsnet_tf import deploy

        for mode in _QUANTIZE.value:
            name = deploy.quantized_tflite_name(mode)
            deploy.quantize_tflite(model, mode, calibration, os.path.join(saved, name))
            written.append(name)
        if _ONNX.value:
            deploy.convert_to_onnx(saved, os.path.join(saved, deploy.ONNX_FILE))
            written.append(deploy.ONNX_FILE)

    try:
        path = export_saved_model(
            model,
            _EXPORT_DIR.value,
            version=_VERSION.value,
            overwrite=_OVERWRITE.value,
            class_names=class_names,
            metadata=source,
            tflite=_TFLITE.value,
            derived=derived if _QUANTIZE.value or _ONNX.value else None,
            kernels=_KERNELS.value,
        )
    except (ExportExistsError, ValueError) as error:
        sys.exit(f"error: {error}")
    print(f"Exported {_WORKDIR.value} ({_CHECKPOINT.value} checkpoint) to {path}")
    if _TFLITE.value:
        written.insert(0, "model.tflite")
    for name in written:
        file = os.path.join(path, name)
        print(f"  {name}: {os.path.getsize(file) / 2**20:.1f} MiB")


def _calibration_images(config, count):
    """The first `count` training images of the run's data set, uint8 (never test images)."""
    import numpy as np

    from capsnet_tf.data.pipeline import load_tfds_split

    if config.dataset not in ("mnist", "fashion_mnist"):
        raise ValueError(
            f"--quantize=int8 calibrates on TFDS training images; {config.dataset!r} runs "
            "are not supported. Use --quantize=dynamic or float16."
        )
    dataset, _ = load_tfds_split(config.dataset, f"train[:{count}]", config.data_dir)
    return np.stack([image for image, _ in dataset.as_numpy_iterator()])


if __name__ == "__main__":
    app.run(main)
