r"""Speed benchmark of CapsNet on this machine: training, serving, input pipeline.

    python experiments/benchmark.py                                # all sections
    python experiments/benchmark.py --sections=train --rounds=10   # one section

Every goal is a ratio measured inside one run, because a shared machine's
timings move: each section alternates its reference measurement with the
model's, `--rounds` times (warm-up steps excluded), and reports the median
and the range of the times and of the per-round ratios.

Sections (`--sections`):

- `train`: the float32 ceiling (forward + backward of the PrimaryCaps
  convolution, 9x9x256x256 stride 2, 94% of the model's FLOPs, through
  TensorFlow in float32), then one training step per precision in
  `--precisions`. Reports images/s, GFLOP/s, the fraction of the ceiling
  (model FLOPs / step time / ceiling rate) and each precision's speed-up over
  float32 in the same rounds.
- `inference`: the model exported as a SavedModel (`capsnet_tf.export`),
  portable (the default export) and with this machine's kernels
  (`kernels="this_machine"`), each one's `serving_float` signature at
  `--inference_batch_size` against the
  forward-only ceiling at that batch and against the matmul rate; the
  in-process Keras inference model per precision; single-image latency of
  `serving_default` (median and p90 of `--latency_calls` calls).
- `pipeline`: the MNIST training `tf.data` pipeline (cached, shuffled,
  shift-augmented, batched) alone, as a multiple of the float32 training rate.
- `scaling`: float32 step time at `--scaling_batch_sizes` and at
  `--scaling_iterations` routing iterations, with least-squares lines (slope,
  intercept, largest deviation), and the routing alone (all iterations,
  forward and backward, as the layer runs it in training) as a share of the
  step.
- `memory`: peak resident memory of short training runs at
  `--memory_batch_sizes`, each in a fresh process, and its growth per image.

FLOPs count multiply-adds as 2; a training step costs 3x the forward pass
(`model_flops_per_image`). Writes `benchmark.json` and `benchmark.md` (a
Markdown table) to `--output_dir`.
"""

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app, flags

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))

# oneDNN's CPU kernels on AVX2-only CPUs too, where TensorFlow leaves them off
# (docs/performance.md). Read once, when TensorFlow is first imported; =0 keeps them off.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

from capsnet_tf import benchmarking, cpu  # noqa: E402
from capsnet_tf.config import PRECISION_POLICIES as _POLICIES  # noqa: E402

_SECTIONS = ("train", "inference", "pipeline", "scaling", "memory")

_OUTPUT_DIR = flags.DEFINE_string("output_dir", "benchmarks/results", "Where to write results.")
_SECTIONS_FLAG = flags.DEFINE_list(
    "sections", list(_SECTIONS), f"What to measure, from {list(_SECTIONS)}."
)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 100, "Training batch size.", lower_bound=1)
_INFERENCE_BATCH = flags.DEFINE_integer(
    "inference_batch_size", 256, "Inference batch size.", lower_bound=1
)
_ROUNDS = flags.DEFINE_integer("rounds", 10, "Alternating measurement rounds.", lower_bound=1)
_STEPS = flags.DEFINE_integer("steps", 3, "Timed steps per measurement.", lower_bound=1)
_WARMUP = flags.DEFINE_integer("warmup", 2, "Untimed steps before measuring.", lower_bound=1)
_ROUTING = flags.DEFINE_integer("routing_iterations", 3, "Routing iterations.", lower_bound=1)
_PRECISIONS = flags.DEFINE_list(
    "precisions", ["float32", "bfloat16"], f"Training precisions, from {sorted(_POLICIES)}."
)
_JIT = flags.DEFINE_bool(
    "jit_compile", False, "XLA-compile the whole train and predict steps (slow on CPUs)."
)
_LATENCY_CALLS = flags.DEFINE_integer(
    "latency_calls", 200, "Single-image calls for the latency.", lower_bound=1
)
_SCALING_BATCHES = flags.DEFINE_list(
    "scaling_batch_sizes", ["25", "50", "100", "200"], "Batch sizes of the scaling section."
)
_SCALING_ITERATIONS = flags.DEFINE_list(
    "scaling_iterations", ["1", "2", "3", "4", "5"], "Routing iterations of the scaling section."
)
_SCALING_ROUNDS = flags.DEFINE_integer(
    "scaling_rounds", 5, "Alternating rounds of the scaling section.", lower_bound=1
)
_MEMORY_BATCHES = flags.DEFINE_list(
    "memory_batch_sizes", ["32", "64", "128", "256"], "Batch sizes of the memory section."
)
_MEMORY_PROBE = flags.DEFINE_integer(
    "memory_probe", None, "Internal: train a few steps at this batch size and print peak RSS."
)
_DATA_DIR = flags.DEFINE_string("data_dir", None, "TFDS data directory.")


def _ratios(numerators, denominators):
    return benchmarking.summary([n / d for n, d in zip(numerators, denominators)])


def _matmul_gflops(times, matmuls, matmul_flops):
    """Per-precision summaries of the alternated matmul ceilings' rates, GFLOP/s."""
    return {
        name: benchmarking.summary([matmul_flops / t / 1e9 for t in times[f"matmul_{name}"]])
        for name in matmuls
    }


def _matmul_of(precision):
    """The matmul ceiling a model in `precision` is measured against.

    float16 against bfloat16's: both are 16-bit inputs on these CPUs.
    """
    return "matmul_float32" if precision == "float32" else "matmul_bfloat16"


def _matmul_ceilings():
    """The matmul ceilings of float32 and of the benchmarked precisions (`_matmul_of`)."""
    wanted = {"float32"} | {_matmul_of(p).removeprefix("matmul_") for p in _PRECISIONS.value}
    return benchmarking.matmul_ceilings(precisions=sorted(wanted))


def _build(precision, routing_iterations=None, jit_compile=None):
    """A compiled MNIST CapsNet in `precision`, routing and XLA from the flags by default."""
    return benchmarking.mnist_capsnet(
        precision,
        routing_iterations=routing_iterations or _ROUTING.value,
        jit_compile=_JIT.value if jit_compile is None else jit_compile,
    )


_batch = benchmarking.random_mnist_batch


def _train_step(model, batch):
    inputs, targets = batch
    return lambda: model.train_on_batch(inputs, targets, return_dict=False)


def run_train(results):
    batch = _BATCH_SIZE.value
    ceiling, _ = benchmarking.conv_ceilings(batch)
    matmuls, matmul_flops = _matmul_ceilings()
    models = {precision: _build(precision) for precision in _PRECISIONS.value}
    data = _batch(batch)
    functions = {"ceiling": ceiling}
    functions.update({f"matmul_{name}": function for name, function in matmuls.items()})
    functions.update({p: _train_step(m, data) for p, m in models.items()})
    times = benchmarking.alternate(functions, _ROUNDS.value, _STEPS.value, _WARMUP.value)
    train_flops = benchmarking.training_flops_per_image(_ROUTING.value) * batch
    ceiling_flops = benchmarking.primary_conv_flops(batch)
    section = {
        "ceiling_gflops": benchmarking.summary(
            [ceiling_flops / t / 1e9 for t in times["ceiling"]]
        ),
        "ceiling_step_seconds": benchmarking.summary(times["ceiling"]),
        "matmul_size": benchmarking.MATMUL_SIZE,
        "matmul_gflops": _matmul_gflops(times, matmuls, matmul_flops),
    }
    for precision in models:
        section[precision] = {
            "step_seconds": benchmarking.summary(times[precision]),
            "images_per_second": benchmarking.summary([batch / t for t in times[precision]]),
            "gflops": benchmarking.summary([train_flops / t / 1e9 for t in times[precision]]),
            # (train FLOPs / t) / (ceiling FLOPs / t_ceiling), round by round
            "fraction_of_float32_ceiling": _ratios(
                [train_flops * t for t in times["ceiling"]],
                [ceiling_flops * t for t in times[precision]],
            ),
        }
        # Against the matmul rate of its own precision, round by round.
        matmul = times[_matmul_of(precision)]
        section[precision]["fraction_of_matmul_ceiling"] = _ratios(
            [train_flops * t for t in matmul], [matmul_flops * t for t in times[precision]]
        )
        if precision != "float32" and "float32" in models:
            section[precision]["speedup_over_float32"] = _ratios(
                times["float32"], times[precision]
            )
    results["train"] = section
    return models


def run_inference(results, models):
    import tensorflow as tf

    from capsnet_tf.export import export_saved_model

    batch = _INFERENCE_BATCH.value
    _, forward_ceiling = benchmarking.conv_ceilings(batch)
    matmuls, matmul_flops = _matmul_ceilings()
    model = models.get("float32") or _build("float32")
    export_root = tempfile.mkdtemp(prefix="capsnet_benchmark_")
    # The default (portable) export, and one with this machine's forms (capsnet_tf.kernels).
    loaded, serving = {}, {}
    for version, (name, kernels) in enumerate(
        (("saved_model", "portable"), ("saved_model_this_machine", "this_machine")), 1
    ):
        path = export_saved_model(model, export_root, version, verify=False, kernels=kernels)
        loaded[name] = tf.saved_model.load(path)
        serving[name] = loaded[name].signatures["serving_float"]
    serving_uint8 = loaded["saved_model"].signatures["serving_default"]
    images, _ = _batch(batch, seed=1)
    images = images["image"]
    functions = {
        "forward_ceiling": forward_ceiling,
        **{f"matmul_{name}": function for name, function in matmuls.items()},
        **{name: lambda s=signature: s(images=images) for name, signature in serving.items()},
    }
    for precision, keras_model in models.items():
        inference = keras_model.inference_model()
        step = tf.function(
            lambda x, m=inference: m(x, training=False)["length"],
            jit_compile=_JIT.value,
            autograph=False,
        )
        functions[f"keras_{precision}"] = lambda s=step: s(images)
    times = benchmarking.alternate(functions, _ROUNDS.value, _STEPS.value, _WARMUP.value)
    forward_flops = benchmarking.model_flops_per_image(_ROUTING.value) * batch
    ceiling_flops = benchmarking.primary_conv_flops(batch, backward=False)
    section = {
        "batch_size": batch,
        "forward_ceiling_gflops": benchmarking.summary(
            [ceiling_flops / t / 1e9 for t in times["forward_ceiling"]]
        ),
        "matmul_gflops": _matmul_gflops(times, matmuls, matmul_flops),
    }
    for name in functions:
        if name == "forward_ceiling" or name.startswith("matmul_"):
            continue
        # The SavedModel serves float32; a Keras model against its own precision's matmul.
        precision = "float32" if name.startswith("saved_model") else name.removeprefix("keras_")
        matmul = times[_matmul_of(precision)]
        section[name] = {
            "images_per_second": benchmarking.summary([batch / t for t in times[name]]),
            "fraction_of_forward_ceiling": _ratios(
                [forward_flops * t for t in times["forward_ceiling"]],
                [ceiling_flops * t for t in times[name]],
            ),
            "fraction_of_matmul_ceiling": _ratios(
                [forward_flops * t for t in matmul], [matmul_flops * t for t in times[name]]
            ),
        }
    single = tf.cast(images[:1] * 255, tf.uint8)
    latencies = benchmarking.call_seconds(
        lambda: benchmarking.blocking(serving_uint8(images=single)),
        _LATENCY_CALLS.value,
        warmup=10,
    )
    section["single_image_latency_ms"] = {
        "median": 1000 * statistics.median(latencies),
        "p90": 1000 * benchmarking.percentile(latencies, 0.9),
        "min": 1000 * min(latencies),
        "n": len(latencies),
    }
    results["inference"] = section


def run_pipeline(results):
    from capsnet_tf.data import make_dataset

    batch = _BATCH_SIZE.value
    try:
        dataset, _ = make_dataset(
            "mnist", "train", batch, training=True, shift=2, data_dir=_DATA_DIR.value
        )
    except Exception as error:  # noqa: BLE001 - reported, the other sections go on
        results["pipeline"] = {"skipped": f"{type(error).__name__}: {error}"}
        return
    for _ in dataset:  # the first pass fills the cache of decoded images
        pass
    rates = []
    for _ in range(3):
        start, count = time.perf_counter(), 0
        for inputs, _ in dataset:
            count += int(inputs["image"].shape[0])
        rates.append(count / (time.perf_counter() - start))
    section = {
        "images_per_second": benchmarking.summary(rates),
        "augmentation": "random shift <= 2 px",
    }
    train = results.get("train", {}).get("float32")
    if train:
        section["over_float32_training_rate"] = (
            statistics.median(rates) / train["images_per_second"]["median"]
        )
    results["pipeline"] = section


def run_scaling(results):
    import tensorflow as tf

    from capsnet_tf.layers.capsule_layer import dynamic_routing

    batch_sizes = [int(b) for b in _SCALING_BATCHES.value]
    iterations = [int(i) for i in _SCALING_ITERATIONS.value]
    base = _build("float32")
    functions = {f"batch_{b}": _train_step(base, _batch(b)) for b in batch_sizes}
    data = _batch(_BATCH_SIZE.value)
    # The step at --batch_size and --routing_iterations is one point of both
    # lines and the routing's denominator: timed once.
    reference = f"batch_{_BATCH_SIZE.value}"
    if reference not in functions:
        functions[reference] = _train_step(base, data)
    for count in iterations:
        if count != _ROUTING.value:
            model = _build("float32", routing_iterations=count)
            functions[f"iterations_{count}"] = _train_step(model, data)
    layer = base.class_capsules
    votes = tf.Variable(
        tf.random.normal((_BATCH_SIZE.value, 10, 1152, 16), stddev=0.01, seed=4)
    )

    @tf.function
    def routing_step():
        with tf.GradientTape() as tape:
            # The layer's own routing call in training, values and gradients.
            outputs = dynamic_routing(
                votes, layer.bias, _ROUTING.value,
                jit_compile=layer.jit_compile in (True, "training"),
            )
        return outputs, tape.gradient(outputs, [votes, layer.bias], output_gradients=outputs)

    functions["routing_alone"] = routing_step
    times = benchmarking.alternate(functions, _SCALING_ROUNDS.value, _STEPS.value, _WARMUP.value)
    times[f"iterations_{_ROUTING.value}"] = times[reference]
    median = {name: statistics.median(t) for name, t in times.items()}
    results["scaling"] = {
        "step_seconds_by_batch": {b: median[f"batch_{b}"] for b in batch_sizes},
        "batch_fit_seconds": benchmarking.linear_fit(
            batch_sizes, [median[f"batch_{b}"] for b in batch_sizes]
        ),
        "step_seconds_by_iterations": {i: median[f"iterations_{i}"] for i in iterations},
        "iterations_fit_seconds": benchmarking.linear_fit(
            iterations, [median[f"iterations_{i}"] for i in iterations]
        ),
        "routing_seconds": benchmarking.summary(times["routing_alone"]),
        "routing_share_of_step": _ratios(times["routing_alone"], times[reference]),
    }


def memory_probe(batch):
    """Trains a few steps at `batch` in this process; prints peak RSS as JSON."""
    import tensorflow as tf

    model = _build(_PRECISIONS.value[0])
    built = benchmarking.peak_rss_gib()
    inputs, targets = _batch(batch)
    dataset = tf.data.Dataset.from_tensors((inputs, targets)).repeat()
    model.fit(dataset, steps_per_epoch=_WARMUP.value + _STEPS.value, epochs=1, verbose=0)
    peak = benchmarking.peak_rss_gib()
    print(json.dumps({"batch_size": batch, "after_build_gib": built, "peak_gib": peak}))


def run_memory(results):
    batch_sizes = [int(b) for b in _MEMORY_BATCHES.value]
    rows = []
    for batch in batch_sizes:
        command = [
            sys.executable, os.path.abspath(__file__), f"--memory_probe={batch}",
            f"--precisions={_PRECISIONS.value[0]}", f"--steps={_STEPS.value}",
            f"--warmup={_WARMUP.value}", f"--routing_iterations={_ROUTING.value}",
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            rows.append({"batch_size": batch, "error": done.stderr.strip()[-500:]})
            continue
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    section = {"precision": _PRECISIONS.value[0], "runs": rows}
    good = [row for row in rows if "peak_gib" in row]
    if len(good) >= 2:
        fit = benchmarking.linear_fit(
            [row["batch_size"] for row in good], [row["peak_gib"] for row in good]
        )
        section["peak_fit_gib"] = fit
        section["mib_per_image"] = fit["slope"] * 1024
    results["memory"] = section


def _row(name, entry, unit="", digits=1):
    if isinstance(entry, dict) and "median" in entry:
        spread = f"{entry['min']:.{digits}f}-{entry['max']:.{digits}f}" if "max" in entry else ""
        return f"| {name} | {entry['median']:.{digits}f}{unit} | {spread} |"
    return f"| {name} | {entry:.{digits}f}{unit} | |"


def markdown_table(results):
    """The results as a Markdown table: measure, median, range over rounds."""
    lines = ["| measure | median | range |", "| --- | --- | --- |"]
    train = results.get("train")
    if train:
        lines.append(
            _row("float32 ceiling (PrimaryCaps conv fwd+bwd), GFLOP/s", train["ceiling_gflops"])
        )
        size = train["matmul_size"]
        for name, entry in train["matmul_gflops"].items():
            lines.append(_row(f"{name} matmul {size}^3 (matmul-rate ceiling), GFLOP/s", entry))
        for precision, entry in train.items():
            if not isinstance(entry, dict) or "step_seconds" not in entry:
                continue
            lines.append(_row(f"training {precision}, images/s", entry["images_per_second"]))
            lines.append(_row(
                f"training {precision}, fraction of the float32 ceiling",
                entry["fraction_of_float32_ceiling"], digits=2,
            ))
            lines.append(_row(
                f"training {precision}, fraction of its precision's matmul-rate ceiling",
                entry["fraction_of_matmul_ceiling"], digits=2,
            ))
            if "speedup_over_float32" in entry:
                lines.append(_row(
                    f"training {precision}, speed-up over float32 (same rounds)",
                    entry["speedup_over_float32"], "x", digits=2,
                ))
    inference = results.get("inference")
    if inference:
        batch = inference["batch_size"]
        lines.append(_row(f"float32 forward ceiling at batch {batch}, GFLOP/s",
                          inference["forward_ceiling_gflops"]))
        for name, entry in inference.get("matmul_gflops", {}).items():
            lines.append(_row(f"{name} matmul (matmul-rate ceiling), GFLOP/s", entry))
        for name, entry in inference.items():
            if isinstance(entry, dict) and "images_per_second" in entry:
                label = {"saved_model": "SavedModel serving_float",
                         "saved_model_this_machine": "SavedModel serving_float (this_machine "
                         "kernels)"}.get(name, name)
                lines.append(_row(f"inference {label}, batch {batch}, images/s",
                                  entry["images_per_second"]))
                lines.append(_row(f"inference {label}, fraction of the forward ceiling",
                                  entry["fraction_of_forward_ceiling"], digits=2))
                if "fraction_of_matmul_ceiling" in entry:
                    lines.append(_row(
                        f"inference {label}, fraction of its precision's matmul-rate ceiling",
                        entry["fraction_of_matmul_ceiling"], digits=2,
                    ))
        latency = inference["single_image_latency_ms"]
        lines.append(f"| SavedModel single-image latency | {latency['median']:.1f} ms "
                     f"| p90 {latency['p90']:.1f} ms, {latency['n']} calls |")
    pipeline = results.get("pipeline")
    if pipeline and "images_per_second" in pipeline:
        lines.append(_row("tf.data pipeline (shift augmentation), images/s",
                          pipeline["images_per_second"], digits=0))
        if "over_float32_training_rate" in pipeline:
            lines.append(_row("tf.data rate / float32 training rate",
                              pipeline["over_float32_training_rate"], "x", digits=0))
    scaling = results.get("scaling")
    if scaling:
        batch_fit, iteration_fit = scaling["batch_fit_seconds"], scaling["iterations_fit_seconds"]
        lines.append(
            f"| float32 step time vs batch size | {1000 * batch_fit['slope']:.2f} ms/image "
            f"+ {1000 * batch_fit['intercept']:.0f} ms | largest miss "
            f"{100 * batch_fit['largest_relative_deviation']:.1f}% |"
        )
        lines.append(
            f"| float32 step time vs routing iterations | {1000 * iteration_fit['slope']:.1f} "
            f"ms/iteration + {1000 * iteration_fit['intercept']:.0f} ms | largest miss "
            f"{100 * iteration_fit['largest_relative_deviation']:.1f}% |"
        )
        lines.append(_row("routing alone (fwd+bwd), share of the float32 step",
                          scaling["routing_share_of_step"], digits=3))
    memory = results.get("memory")
    if memory:
        for row in memory["runs"]:
            if "peak_gib" in row:
                lines.append(f"| peak RSS, {memory['precision']} training, batch "
                             f"{row['batch_size']} | {row['peak_gib']:.2f} GiB | |")
        if "mib_per_image" in memory:
            lines.append(f"| peak RSS growth | {memory['mib_per_image']:.1f} MiB/image "
                         f"+ {memory['peak_fit_gib']['intercept']:.2f} GiB | |")
    return "\n".join(lines)


def main(argv):
    del argv
    if _MEMORY_PROBE.value is not None:
        memory_probe(_MEMORY_PROBE.value)
        return
    for flag, allowed in ((_PRECISIONS, _POLICIES), (_SECTIONS_FLAG, _SECTIONS)):
        unknown = sorted(set(flag.value) - set(allowed))
        if unknown or not flag.value:
            raise app.UsageError(
                f"--{flag.name}: unknown or empty {unknown}; choose from {sorted(allowed)}"
            )
    import keras
    import tensorflow as tf

    sections = set(_SECTIONS_FLAG.value)
    results = {
        "machine": {
            "processor": platform.processor() or platform.machine(),
            "cpu_model": cpu.model_name(),
            "cpu_family_and_model": cpu.family_and_model(),
            "onednn": cpu.onednn_enabled(),
            "cpus": os.cpu_count(),
            "tensorflow": tf.__version__,
            "keras": keras.__version__,
            "devices": [d.name for d in tf.config.list_logical_devices()],
            "instruction_sets": cpu.instruction_sets(),
            # What oneDNN may use: the flags, lowered by ONEDNN_MAX_CPU_ISA where set.
            "vector_unit": cpu.vector_unit(),
            "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"),
        },
        "settings": {
            "sections": [s for s in _SECTIONS if s in sections],
            "batch_size": _BATCH_SIZE.value,
            "inference_batch_size": _INFERENCE_BATCH.value,
            "rounds": _ROUNDS.value,
            "steps": _STEPS.value,
            "warmup": _WARMUP.value,
            "routing_iterations": _ROUTING.value,
            "precisions": _PRECISIONS.value,
            "jit_compile": _JIT.value,
        },
        "model_gflop_per_image_forward": benchmarking.model_flops_per_image(_ROUTING.value) / 1e9,
    }
    started = time.perf_counter()
    models = {}
    for name in _SECTIONS:
        if name not in sections:
            continue
        print(f"[benchmark] {name} ...", flush=True)
        section_start = time.perf_counter()
        if name == "train":
            models = run_train(results)
        elif name == "inference":
            run_inference(results, models)
        elif name == "pipeline":
            run_pipeline(results)
        elif name == "scaling":
            run_scaling(results)
        elif name == "memory":
            run_memory(results)
        print(f"[benchmark] {name}: {time.perf_counter() - section_start:.0f} s", flush=True)
    results["peak_rss_gib"] = benchmarking.peak_rss_gib()
    results["seconds"] = time.perf_counter() - started
    os.makedirs(_OUTPUT_DIR.value, exist_ok=True)
    with open(os.path.join(_OUTPUT_DIR.value, "benchmark.json"), "w") as file:
        json.dump(results, file, indent=2)
    table = markdown_table(results)
    with open(os.path.join(_OUTPUT_DIR.value, "benchmark.md"), "w") as file:
        file.write(f"Machine: {json.dumps(results['machine'])}\n\n")
        file.write(f"Settings: {json.dumps(results['settings'])}\n\n{table}\n")
    print(table)


if __name__ == "__main__":
    app.run(main)
