r"""Speed benchmark of CapsNet on this machine: training, inference, input pipeline.

    python experiments/benchmark.py --output_dir=benchmarks/results
    python experiments/benchmark.py --batch_size=100 --rounds=10 --steps=10

Every goal is a ratio measured inside one run, because a shared machine's
timings move: the benchmark alternates the reference measurement (the float32
forward+backward rate of the PrimaryCaps convolution, which is 94% of the
model's FLOPs: the "ceiling") with the model's own, `--rounds` times, and
reports medians and spreads of the times and of the per-round ratios. Warm-up
steps (tracing, compilation, oneDNN kernel selection) are excluded.

Writes `benchmark.json` and `benchmark.md` (a Markdown table) to
`--output_dir`.
"""

import json
import os
import platform
import resource
import statistics
import sys
import time

from absl import app, flags

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))

_OUTPUT_DIR = flags.DEFINE_string("output_dir", "benchmarks/results", "Where to write results.")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 100, "Training batch size.", lower_bound=1)
_INFERENCE_BATCH = flags.DEFINE_integer(
    "inference_batch_size", 256, "Inference batch size.", lower_bound=1
)
_ROUNDS = flags.DEFINE_integer("rounds", 10, "Alternating measurement rounds.", lower_bound=1)
_STEPS = flags.DEFINE_integer("steps", 5, "Timed steps per measurement.", lower_bound=1)
_WARMUP = flags.DEFINE_integer("warmup", 3, "Untimed steps before measuring.", lower_bound=1)
_ROUTING = flags.DEFINE_integer("routing_iterations", 3, "Routing iterations.", lower_bound=1)
_MIXED = flags.DEFINE_enum(
    "mixed_precision", "float32", ["float32", "bfloat16", "float16"], "Compute precision."
)
_JIT = flags.DEFINE_bool("jit_compile", False, "XLA-compile the train and predict steps.")
_PIPELINE = flags.DEFINE_bool("pipeline", True, "Also time the tf.data input pipeline.")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "TFDS data directory.")


def model_flops_per_image(routing_iterations=3):
    """Forward FLOPs (multiply-adds x 2) of the MNIST CapsNet, per image."""
    conv1 = 2 * 20 * 20 * 9 * 9 * 1 * 256
    primary = 2 * 6 * 6 * 9 * 9 * 256 * 256
    votes = 2 * 1152 * 10 * 8 * 16
    # per iteration: weighted sum (2 i j e) + agreement (2 i j e) except the last
    routing = 2 * 1152 * 10 * 16 * (2 * routing_iterations - 1)
    decoder = 2 * (160 * 512 + 512 * 1024 + 1024 * 784)
    return conv1 + primary + votes + routing + decoder


def _median_spread(values):
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def main(argv):
    del argv
    import keras
    import numpy as np
    import tensorflow as tf

    from capsnet_tf.training import ExperimentConfig, build_model, compile_model

    policy = {"float32": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}
    keras.config.set_dtype_policy(policy[_MIXED.value])
    keras.utils.set_random_seed(0)
    batch = _BATCH_SIZE.value
    config = ExperimentConfig(
        routing_iterations=_ROUTING.value,
        jit_compile=_JIT.value,
        mixed_precision=_MIXED.value,
    )
    model = compile_model(build_model(config, (28, 28, 1), 10), config)
    rng = np.random.default_rng(0)
    images = rng.random((batch, 28, 28, 1)).astype("float32")
    labels = rng.integers(0, 10, batch).astype("int32")
    inputs = {"image": tf.constant(images), "label": tf.constant(labels)}
    targets = {"length": tf.constant(labels), "reconstruction": tf.constant(images)}

    # Reference: float32 PrimaryCaps convolution, forward + backward.
    conv_input = tf.Variable(tf.random.uniform((batch, 20, 20, 256)), dtype=tf.float32)
    conv_kernel = tf.Variable(tf.random.normal((9, 9, 256, 256), stddev=0.01))

    @tf.function
    def ceiling_step():
        with tf.GradientTape() as tape:
            out = tf.nn.conv2d(conv_input, conv_kernel, 2, "VALID")
            loss = tf.reduce_sum(out)
        return tape.gradient(loss, [conv_input, conv_kernel])

    conv_flops = 3 * 2 * batch * 6 * 6 * 9 * 9 * 256 * 256  # forward + 2 backward

    inference = model.inference_model()
    inference_images = tf.constant(
        rng.random((_INFERENCE_BATCH.value, 28, 28, 1)).astype("float32")
    )

    @tf.function(jit_compile=_JIT.value)
    def predict_step(x):
        return inference(x, training=False)["length"]

    def timed(function, steps):
        start = time.perf_counter()
        for _ in range(steps):
            result = function()
        # Block until the last step's values exist.
        tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, result)
        return (time.perf_counter() - start) / steps

    train = lambda: model.train_on_batch(inputs, targets, return_dict=False)  # noqa: E731
    predict = lambda: predict_step(inference_images)  # noqa: E731
    for function in (ceiling_step, train, predict):
        for _ in range(_WARMUP.value):
            function()

    rows = {"ceiling": [], "train": [], "predict": []}
    for _ in range(_ROUNDS.value):
        rows["ceiling"].append(timed(ceiling_step, _STEPS.value))
        rows["train"].append(timed(train, _STEPS.value))
        rows["predict"].append(timed(predict, _STEPS.value))

    train_flops = 3 * model_flops_per_image(_ROUTING.value) * batch
    predict_flops = model_flops_per_image(_ROUTING.value) * _INFERENCE_BATCH.value
    ceiling_rates = [conv_flops / t for t in rows["ceiling"]]
    train_fractions = [
        (train_flops / t_train) / (conv_flops / t_ceiling)
        for t_train, t_ceiling in zip(rows["train"], rows["ceiling"])
    ]
    results = {
        "machine": {
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "tensorflow": tf.__version__,
            "keras": keras.__version__,
            "devices": [d.name for d in tf.config.list_logical_devices()],
        },
        "settings": {
            "batch_size": batch,
            "inference_batch_size": _INFERENCE_BATCH.value,
            "rounds": _ROUNDS.value,
            "steps": _STEPS.value,
            "routing_iterations": _ROUTING.value,
            "mixed_precision": _MIXED.value,
            "jit_compile": _JIT.value,
        },
        "model_gflop_per_image_forward": model_flops_per_image(_ROUTING.value) / 1e9,
        "ceiling_gflops": _median_spread([r / 1e9 for r in ceiling_rates]),
        "train_step_seconds": _median_spread(rows["train"]),
        "train_images_per_second": _median_spread([batch / t for t in rows["train"]]),
        "train_fraction_of_ceiling": _median_spread(train_fractions),
        "predict_images_per_second": _median_spread(
            [_INFERENCE_BATCH.value / t for t in rows["predict"]]
        ),
        "predict_fraction_of_ceiling": _median_spread(
            [
                (predict_flops / t_predict) / (conv_flops / t_ceiling)
                for t_predict, t_ceiling in zip(rows["predict"], rows["ceiling"])
            ]
        ),
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }

    if _PIPELINE.value:
        from capsnet_tf.data import make_dataset

        dataset, _ = make_dataset(
            "mnist", "train", batch, training=True, shift=2, data_dir=_DATA_DIR.value
        )
        for _ in dataset:  # fill the cache
            pass
        start, count = time.perf_counter(), 0
        for element, _ in dataset:
            count += int(element["image"].shape[0])
        pipeline_rate = count / (time.perf_counter() - start)
        results["pipeline_images_per_second"] = pipeline_rate
        results["pipeline_over_training_rate"] = (
            pipeline_rate / results["train_images_per_second"]["median"]
        )

    os.makedirs(_OUTPUT_DIR.value, exist_ok=True)
    suffix = f"{_MIXED.value}{'_xla' if _JIT.value else ''}_b{batch}_r{_ROUTING.value}"
    with open(os.path.join(_OUTPUT_DIR.value, f"benchmark_{suffix}.json"), "w") as file:
        json.dump(results, file, indent=2)
    table = [
        "| measure | median | min | max |",
        "| --- | --- | --- | --- |",
    ]
    for name in (
        "ceiling_gflops",
        "train_images_per_second",
        "train_fraction_of_ceiling",
        "predict_images_per_second",
        "predict_fraction_of_ceiling",
        "train_step_seconds",
    ):
        entry = results[name]
        table.append(
            f"| {name} | {entry['median']:.3f} | {entry['min']:.3f} | {entry['max']:.3f} |"
        )
    table.append(f"| peak_rss_gib | {results['peak_rss_gib']:.2f} | | |")
    if "pipeline_images_per_second" in results:
        table.append(f"| pipeline_images_per_second | {results['pipeline_images_per_second']:.0f} | | |")
        table.append(f"| pipeline_over_training_rate | {results['pipeline_over_training_rate']:.1f} | | |")
    markdown = "\n".join(table)
    with open(os.path.join(_OUTPUT_DIR.value, f"benchmark_{suffix}.md"), "w") as file:
        file.write(f"Settings: {json.dumps(results['settings'])}\n\n{markdown}\n")
    print(json.dumps(results["settings"]))
    print(markdown)


if __name__ == "__main__":
    app.run(main)
