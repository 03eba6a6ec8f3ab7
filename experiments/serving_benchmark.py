r"""Measures an exported CapsNet: latency, throughput and size on disk.

Usage:

    python experiments/serving_benchmark.py --model=/tmp/capsnet_serving/1 \
        --repeats=200 --output=/tmp/capsnet_serving_benchmark.json

Loads the SavedModel with `tf.saved_model.load` and times its
`serving_default` signature (uint8 input): single-image latency (median and
90th percentile of `--repeats` calls after warm-up) and the throughput of
`--batch_size` batches (median over `max(3, repeats // 20)` calls). When the
version directory holds `model.tflite`, its single-image latency is timed
with the TFLite interpreter too. With `--agreement_dataset=mnist` the whole
test split is classified by the SavedModel (accuracy) and by the TFLite model
(fraction of equal classes, largest probability difference). Prints a summary
and writes it as JSON, with the sizes of the export's files, the CPU count and
the load average (the machine may be shared: compare runs made under the same
load).
"""

import json
import os
import platform
import statistics
import sys
import time
import warnings

from absl import app, flags

# tf.lite.Interpreter still works in TensorFlow 2.21; ai_edge_litert replaces it.
warnings.filterwarnings("ignore", message=".*tf.lite.Interpreter is deprecated")

_MODEL = flags.DEFINE_string(
    "model", None, "SavedModel directory (<export_dir>/<version>).", required=True
)
_REPEATS = flags.DEFINE_integer(
    "repeats", 200, "Timed single-image calls (the median is reported).", lower_bound=1
)
_BATCH_SIZE = flags.DEFINE_integer(
    "batch_size", 256, "Batch size of the throughput measurement.", lower_bound=1
)
_WARMUP = flags.DEFINE_integer(
    "warmup", 5, "Untimed calls before each measurement.", lower_bound=0
)
_OUTPUT = flags.DEFINE_string(
    "output", "serving_benchmark.json", "Where to write the JSON results."
)
_AGREEMENT_DATASET = flags.DEFINE_string(
    "agreement_dataset", None, "Optional TFDS data set (e.g. mnist): classify its test split "
    "with the SavedModel and, when present, model.tflite, and report accuracy and agreement.",
)
_DATA_DIR = flags.DEFINE_string(
    "data_dir", None, "TFDS data directory for --agreement_dataset (default: $TFDS_DATA_DIR)."
)


def agreement(serve, tflite_path, dataset, data_dir, batch_size):
    """Accuracy of the SavedModel on a test split, and how closely TFLite agrees."""
    import numpy as np
    import tensorflow as tf
    import tensorflow_datasets as tfds

    data = tfds.load(dataset, split="test", as_supervised=True, data_dir=data_dir,
                     download=False).batch(batch_size)
    runner = None
    if tflite_path:
        runner = tf.lite.Interpreter(model_path=tflite_path).get_signature_runner(
            "serving_default"
        )
    count = correct = same_class = 0
    max_difference = 0.0
    start = time.perf_counter()
    for images, labels in data:
        outputs = serve(images=images)
        class_ids = outputs["class_ids"].numpy()
        count += len(class_ids)
        correct += int(np.sum(class_ids == labels.numpy()))
        if runner is not None:
            lite = runner(images=images.numpy())
            same_class += int(np.sum(lite["class_ids"] == class_ids))
            max_difference = max(
                max_difference,
                float(np.max(np.abs(lite["probabilities"] - outputs["probabilities"].numpy()))),
            )
    result = {
        "dataset": dataset,
        "examples": count,
        "saved_model_accuracy": correct / count,
        "seconds": time.perf_counter() - start,
    }
    if runner is not None:
        result["tflite_same_class_fraction"] = same_class / count
        result["tflite_max_probability_difference"] = max_difference
    return result


def directory_size(path):
    """Total bytes of the files under `path`."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            total += os.path.getsize(os.path.join(root, name))
    return total


# _timed and _percentile are capsnet_tf.benchmarking's call_seconds and
# percentile, kept here so that this script runs against a SavedModel where
# capsnet_tf is not installed.
def _timed(function, repeats, warmup):
    for _ in range(warmup):
        function()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        seconds.append(time.perf_counter() - start)
    return seconds


def _percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    import numpy as np
    import tensorflow as tf

    model_dir = _MODEL.value
    if not os.path.exists(os.path.join(model_dir, "saved_model.pb")):
        sys.exit(f"error: {model_dir} is not a SavedModel directory (no saved_model.pb)")
    start = time.perf_counter()
    loaded = tf.saved_model.load(model_dir)
    load_seconds = time.perf_counter() - start
    serve = loaded.signatures["serving_default"]
    image_shape = tuple(serve.structured_input_signature[1]["images"].shape[1:])
    rng = np.random.default_rng(0)
    single = tf.constant(rng.integers(0, 256, (1, *image_shape), dtype=np.uint8))
    batch = tf.constant(rng.integers(0, 256, (_BATCH_SIZE.value, *image_shape), dtype=np.uint8))

    def run_single():
        return serve(images=single)["probabilities"].numpy()

    def run_batch():
        return serve(images=batch)["probabilities"].numpy()

    latency = _timed(run_single, _REPEATS.value, _WARMUP.value)
    batch_repeats = max(3, _REPEATS.value // 20)
    batch_seconds = _timed(run_batch, batch_repeats, min(_WARMUP.value, 2))
    batch_median = statistics.median(batch_seconds)

    sizes = {
        "total_bytes": directory_size(model_dir),
        "saved_model_pb_bytes": os.path.getsize(os.path.join(model_dir, "saved_model.pb")),
        "variables_bytes": directory_size(os.path.join(model_dir, "variables")),
        "assets_bytes": directory_size(os.path.join(model_dir, "assets")),
    }
    results = {
        "model": os.path.abspath(model_dir),
        "image_shape": list(image_shape),
        "load_seconds": load_seconds,
        "single_image_latency_ms": {
            "median": 1000 * statistics.median(latency),
            "p90": 1000 * _percentile(latency, 0.9),
            "min": 1000 * min(latency),
            "repeats": len(latency),
        },
        "batch_throughput": {
            "batch_size": _BATCH_SIZE.value,
            "median_batch_seconds": batch_median,
            "images_per_second": _BATCH_SIZE.value / batch_median,
            "repeats": batch_repeats,
        },
        "size_on_disk": sizes,
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "tensorflow_version": tf.__version__,
        },
    }
    tflite_path = os.path.join(model_dir, "model.tflite")
    if os.path.exists(tflite_path):
        interpreter = tf.lite.Interpreter(model_path=tflite_path)
        runner = interpreter.get_signature_runner("serving_default")
        pixels = single.numpy()
        tflite_latency = _timed(lambda: runner(images=pixels), _REPEATS.value, _WARMUP.value)
        sizes["tflite_bytes"] = os.path.getsize(tflite_path)
        sizes["saved_model_bytes_without_tflite"] = sizes["total_bytes"] - sizes["tflite_bytes"]
        results["tflite_single_image_latency_ms"] = {
            "median": 1000 * statistics.median(tflite_latency),
            "p90": 1000 * _percentile(tflite_latency, 0.9),
            "repeats": len(tflite_latency),
        }
    if _AGREEMENT_DATASET.value:
        results["agreement"] = agreement(
            serve,
            tflite_path if os.path.exists(tflite_path) else None,
            _AGREEMENT_DATASET.value,
            _DATA_DIR.value,
            _BATCH_SIZE.value,
        )
    results["machine"]["load_average_at_end"] = list(os.getloadavg())
    print(f"SavedModel {model_dir}: {sizes['total_bytes'] / 2**20:.1f} MiB on disk "
          f"(variables {sizes['variables_bytes'] / 2**20:.1f} MiB), loaded in {load_seconds:.1f} s")
    print(f"single image: median {results['single_image_latency_ms']['median']:.2f} ms, "
          f"p90 {results['single_image_latency_ms']['p90']:.2f} ms over {len(latency)} calls")
    print(f"batch of {_BATCH_SIZE.value}: {batch_median:.3f} s, "
          f"{results['batch_throughput']['images_per_second']:.0f} images/s")
    if "tflite_single_image_latency_ms" in results:
        print(f"TFLite ({sizes['tflite_bytes'] / 2**20:.1f} MiB): single image median "
              f"{results['tflite_single_image_latency_ms']['median']:.2f} ms")
    if "agreement" in results:
        found = results["agreement"]
        print(f"{found['dataset']} test ({found['examples']} images): SavedModel accuracy "
              f"{100 * found['saved_model_accuracy']:.2f}%", end="")
        if "tflite_same_class_fraction" in found:
            print(f"; TFLite gives the same class for "
                  f"{100 * found['tflite_same_class_fraction']:.3f}%, probabilities within "
                  f"{found['tflite_max_probability_difference']:.2g}", end="")
        print()
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    with open(_OUTPUT.value, "w") as file:
        json.dump(results, file, indent=2)
    print(f"Wrote {_OUTPUT.value}")


if __name__ == "__main__":
    app.run(main)
