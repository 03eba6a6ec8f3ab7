r"""Exports a trained CapsNet as a TensorFlow SavedModel for serving.

Usage, from the repository root or from `experiments/`:

    python experiments/export.py --workdir=/tmp/capsnet_mnist --export_dir=/tmp/capsnet_serving
    python experiments/export.py --workdir=... --export_dir=... --version=2 --tflite

Reads the best (or `--checkpoint=latest`) checkpoint of a training work
directory (`experiments/mnist.py --workdir=...`) and writes
`<export_dir>/<version>/`: the SavedModel (signatures `serving_default` for
uint8 images, `serving_float` for float32 images in [0, 1], `decode` for
capsules), `assets/labels.txt`, `assets/capsnet_metadata.json`,
`assets/README.txt` and, with `--tflite`, `model.tflite`. An existing
version is never replaced unless `--overwrite` is given. Serve it with

    tensorflow_model_server --model_name=capsnet --model_base_path=<export_dir>
"""

import os
import sys

from absl import app, flags

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))  # the repository, when not installed

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


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    from capsnet_tf.export import (
        DATASET_CLASS_NAMES,
        ExportExistsError,
        check_export_target,
        export_saved_model,
    )
    from capsnet_tf.workdir import load_trained_model

    try:
        # Refuse an occupied version before the (slow) model loading.
        check_export_target(_EXPORT_DIR.value, _VERSION.value, _OVERWRITE.value)
    except ExportExistsError as error:
        sys.exit(f"error: {error}")
    try:
        model, config = load_trained_model(_WORKDIR.value, checkpoint=_CHECKPOINT.value)
    except (FileNotFoundError, ValueError) as error:
        sys.exit(f"error: {error}")
    class_names = DATASET_CLASS_NAMES.get(config.dataset)
    if class_names is not None and len(class_names) != model.num_classes:
        class_names = None
    source = {
        "workdir": os.path.abspath(_WORKDIR.value),
        "checkpoint": f"checkpoints/{_CHECKPOINT.value}.weights.h5",
        "dataset": config.dataset,
        "model_config": model.get_config(),
    }
    try:
        path = export_saved_model(
            model,
            _EXPORT_DIR.value,
            version=_VERSION.value,
            overwrite=_OVERWRITE.value,
            class_names=class_names,
            metadata=source,
            tflite=_TFLITE.value,
        )
    except (ExportExistsError, ValueError) as error:
        sys.exit(f"error: {error}")
    print(f"Exported {_WORKDIR.value} ({_CHECKPOINT.value} checkpoint) to {path}")
    if _TFLITE.value:
        print(f"TFLite model: {os.path.join(path, 'model.tflite')}")


if __name__ == "__main__":
    app.run(main)
