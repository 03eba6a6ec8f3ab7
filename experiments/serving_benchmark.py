r"""Measures an exported CapsNet in every format it was exported to: latency, size, accuracy.

Usage:

    python experiments/serving_benchmark.py --model=/tmp/capsnet_serving/1 \
        --repeats=200 --agreement_dataset=mnist --output=/tmp/capsnet_serving_benchmark.json

Loads the SavedModel with `tf.saved_model.load` and times its
`serving_default` signature (uint8 input): single-image latency (median and
90th percentile of `--repeats` calls after warm-up) and the throughput of
`--batch_size` batches (median over `max(3, repeats // 20)` calls). Every other
format in the version directory is timed the same way in its own runtime:
`model.tflite` and the quantized `model_<mode>.tflite` files in LiteRT
(`ai_edge_litert`), `model.onnx` in ONNX Runtime (these need the `export`
extra). With `--agreement_dataset=mnist` the whole test split is classified
by every format: accuracy, the fraction of images given the SavedModel's
class, and the largest probability difference from the SavedModel. Prints a
table and writes it as JSON, with the file sizes, the CPU count and the load
average (the machine may be shared: compare runs made under the same load).
"""

import glob
import json
import os
import platform
import statistics
import sys
import time

from absl import app, flags

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))  # the repository, when not installed

# oneDNN's CPU kernels on AVX2-only CPUs too, where TensorFlow leaves them off
# (docs/performance.md). Read once, when TensorFlow is first imported; =0 keeps them off.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

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


def load_test_split(dataset, data_dir):
    """All test images (uint8 `[n, H, W, C]`) and labels of a TFDS data set."""
    import numpy as np
    import tensorflow_datasets as tfds

    data = tfds.load(dataset, split="test", as_supervised=True, data_dir=data_dir,
                     download=False, batch_size=-1)
    images, labels = tfds.as_numpy(data)
    return np.asarray(images), np.asarray(labels)


def agreement(runtime, reference, images, labels, batch_size):
    """Accuracy of one format on a test split, and how closely it agrees with the SavedModel.

    `reference`: the SavedModel's `(class_ids, probabilities)` on the same
    images, or None when `runtime` is the SavedModel itself.
    """
    import numpy as np

    from capsnet_tf.deploy import classify

    start = time.perf_counter()
    class_ids, probabilities = classify(runtime, images, batch_size)
    result = {
        "examples": len(labels),
        "accuracy": float(np.mean(class_ids == labels)),
        "seconds": time.perf_counter() - start,
    }
    if reference is not None:
        result["same_class_as_saved_model"] = float(np.mean(class_ids == reference[0]))
        result["max_probability_difference"] = float(np.max(np.abs(probabilities - reference[1])))
    return result, (class_ids, probabilities)


def other_formats(model_dir):
    """`{file name: loader}` of the TFLite and ONNX files next to the SavedModel."""
    from capsnet_tf import deploy

    found = {}
    for path in sorted(glob.glob(os.path.join(model_dir, "*.tflite"))):
        found[os.path.basename(path)] = lambda path=path: deploy.litert_interpreter(path)
    onnx_path = os.path.join(model_dir, deploy.ONNX_FILE)
    if os.path.exists(onnx_path):
        found[deploy.ONNX_FILE] = lambda: deploy.onnx_session(onnx_path)
    return found


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
    # The SavedModel alone, without the other formats' files beside it.
    sizes["saved_model_bytes"] = (
        sizes["saved_model_pb_bytes"] + sizes["variables_bytes"] + sizes["assets_bytes"]
    )
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
    from capsnet_tf.deploy import classify

    test = None
    if _AGREEMENT_DATASET.value:
        test = load_test_split(_AGREEMENT_DATASET.value, _DATA_DIR.value)
        results["agreement"], reference = agreement(loaded, None, *test, _BATCH_SIZE.value)
        results["agreement"]["dataset"] = _AGREEMENT_DATASET.value
    formats = {}
    pixels, many = single.numpy(), batch.numpy()
    for name, load in other_formats(model_dir).items():
        runtime = load()
        seconds = _timed(lambda runtime=runtime: classify(runtime, pixels), _REPEATS.value,
                         _WARMUP.value)
        batch_seconds = statistics.median(_timed(
            lambda runtime=runtime: classify(runtime, many, len(many)), batch_repeats, 1
        ))
        entry = {
            "bytes": os.path.getsize(os.path.join(model_dir, name)),
            "single_image_latency_ms": {
                "median": 1000 * statistics.median(seconds),
                "p90": 1000 * _percentile(seconds, 0.9),
                "repeats": len(seconds),
            },
            "batch_images_per_second": _BATCH_SIZE.value / batch_seconds,
        }
        if test is not None:
            entry["agreement"], _ = agreement(runtime, reference, *test, _BATCH_SIZE.value)
        formats[name] = entry
    results["formats"] = formats
    results["machine"]["load_average_at_end"] = list(os.getloadavg())
    print(f"SavedModel {model_dir}: {sizes['saved_model_bytes'] / 2**20:.1f} MiB on disk "
          f"(variables {sizes['variables_bytes'] / 2**20:.1f} MiB), loaded in {load_seconds:.1f} s")
    print(f"single image: median {results['single_image_latency_ms']['median']:.2f} ms, "
          f"p90 {results['single_image_latency_ms']['p90']:.2f} ms over {len(latency)} calls")
    print(f"batch of {_BATCH_SIZE.value}: {batch_median:.3f} s, "
          f"{results['batch_throughput']['images_per_second']:.0f} images/s")
    if "agreement" in results:
        found = results["agreement"]
        print(f"{found['dataset']} test ({found['examples']} images): SavedModel accuracy "
              f"{100 * found['accuracy']:.2f}%")
    for name, entry in results["formats"].items():
        line = (f"{name}: {entry['bytes'] / 2**20:.1f} MiB, single image median "
                f"{entry['single_image_latency_ms']['median']:.2f} ms, batch of "
                f"{_BATCH_SIZE.value} {entry['batch_images_per_second']:.0f} images/s")
        if "agreement" in entry:
            found = entry["agreement"]
            line += (f", accuracy {100 * found['accuracy']:.2f}%, same class as the "
                     f"SavedModel {100 * found['same_class_as_saved_model']:.2f}%, "
                     f"probabilities within {found['max_probability_difference']:.2g}")
        print(line)
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    with open(_OUTPUT.value, "w") as file:
        json.dump(results, file, indent=2)
    print(f"Wrote {_OUTPUT.value}")


if __name__ == "__main__":
    app.run(main)
