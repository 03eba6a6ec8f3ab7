r"""The fastest a training step could be on this machine, against the step as it is.

Issue 17 asks for a training step at 0.85 of TensorFlow's matmul rate. This
script bounds what any step built on PrimaryCaps' matmuls (the project's
im2col, one matmul per pass, col2im) could reach on this machine, from parts
measured in the same process, alternating round by round with TensorFlow's
2048^3 matmuls and the real `train_on_batch` of the `mnist.flags` CapsNet:

    python benchmarks/profile/floor.py --rounds=8 \
        --output_dir=benchmarks/results/NAME

Per precision and round:

- the PrimaryCaps matmuls, 94% of the step's FLOPs: its product at
  `--batch_size` and both gradients, as training computes them
  (`kernels.patch_product` under a gradient tape), each alone and the three side
  by side in one function; the faster of the two counts;
- the least memory traffic the rest of the step must add
  (`capsnet_tf.benchmarking.step_traffic_bytes`: patches, their gradients,
  the routing's votes, Adam), credited at the fastest rate TensorFlow moved
  bytes here in the same round (a sum reduction or a scale of tensors of
  32 MiB, 64 MiB and the bfloat16 patches' size);
- the floor, their sum: every other op (conv1, casts, transposes, the
  decoder, the routing's arithmetic) counts as free and nothing overlaps
  the matmuls. The training FLOPs over the floor, over the matmul rate, is
  the largest fraction of the matmul rate a step could reach here;
- the same floor with PrimaryCaps' matmuls credited at the 2048^3 matmul's
  rate, whatever their shapes: the most any step of this design could
  reach here;
- the other design: TensorFlow's own (oneDNN's) convolution forward and
  backward, which writes no patches, plus the rest of the least traffic.

Writes `floor.json` and `floor.md` under `--output_dir`.
"""

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

# oneDNN's CPU kernels on AVX2-only CPUs too, where TensorFlow leaves them off
# (docs/performance.md). Read once, when TensorFlow is first imported; =0 keeps them off.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

import capsnet_tf  # noqa: E402, F401

GOAL = 0.85  # issue 17's fraction of the matmul rate


def corner(*tensors):
    """One number from each tensor, summed: a result that is cheap to fetch."""
    import tensorflow as tf

    return tf.add_n([tf.cast(tf.reshape(t, [-1])[0], tf.float32) for t in tensors])


def primary_matmuls(patches, kernel, upstream):
    """PrimaryCaps' product and its gradients in training's forms (`kernels.patch_product`).

    Args:
        patches: `[batch * 36, 9 * 9 * channels]` variable, the im2col's rows.
        kernel: `[9, 9, channels, filters]` variable.
        upstream: `[batch, 6, 6, filters]`, the output's gradient.

    Returns:
        Dict of functions: `forward`, `kernel_gradient` and `input_gradient`
        alone, and `all` three in one function (TensorFlow runs them side by
        side). Each returns the sum of the first element of each of its
        products, so that fetching the result copies nothing large.
    """
    import tensorflow as tf

    from capsnet_tf.kernels import patch_product

    def products(forward, sources):
        with tf.GradientTape() as tape:
            outputs = patch_product(patches, kernel, 6, 6)
        gradients = tape.gradient(outputs, sources, output_gradients=upstream)
        return corner(*([outputs] if forward else []), *gradients)

    return {
        name: tf.function(lambda forward=forward, sources=sources: products(forward, sources),
                          autograph=False)
        for name, forward, sources in (
            ("forward", True, []),
            ("kernel_gradient", False, [kernel]),
            ("input_gradient", False, [patches]),
            ("all", True, [patches, kernel]),
        )
    }


def streams(sizes):
    """Functions that move memory, and the bytes each moves a call.

    For each size (bytes): a sum over a float32 tensor of that size (reads
    it) and the tensor scaled into a new one (reads and writes it). Small
    tensors pay per-op overheads and large ones leave the caches, so the
    fastest of them is the rate the floor credits.

    Returns:
        Dict name -> `(function, bytes moved a call)`.
    """
    import tensorflow as tf

    functions = {}
    for size in sizes:
        tensor = tf.Variable(tf.random.uniform((size // 4,), seed=9))
        megabytes = round(size / 2**20)
        functions[f"stream_read_{megabytes}MiB"] = (
            tf.function(lambda tensor=tensor: tf.reduce_sum(tensor), autograph=False), size)
        functions[f"stream_scale_{megabytes}MiB"] = (
            tf.function(lambda tensor=tensor: tensor * 1.5 + 0.5, autograph=False), 2 * size)
    return functions


_PARTS = ("forward", "kernel_gradient", "input_gradient", "all")
# The traffic of the im2col design that a direct convolution does not have.
_PATCH_TRAFFIC = ("patches", "patch_gradients")


def analyse(times, precisions, batch, traffic, stream_bytes, matmul_flops):
    """Per precision: per-round rates, the floors and the fractions, summarised.

    Args:
        times: `benchmarking.alternate`'s seconds per call, by function name.
        precisions: the precisions timed.
        batch: examples a step.
        traffic: precision -> `step_traffic_bytes` of its step.
        stream_bytes: stream function name -> bytes it moves a call.
        matmul_flops: FLOPs of one reference matmul.
    """
    from capsnet_tf.benchmarking import primary_conv_flops, summary, training_flops_per_image

    train_flops = training_flops_per_image() * batch
    rounds = len(times[f"matmul_{precisions[0]}"])
    # The fastest rate TensorFlow moved bytes at, round by round (reads and writes alike).
    bandwidth = [
        max(moved / times[name][k] for name, moved in stream_bytes.items())
        for k in range(rounds)
    ]
    results = {"bytes_per_second": summary(bandwidth), "train_flops": train_flops}
    for precision in precisions:
        rows = {}

        def add(name, value, rows=rows):
            rows.setdefault(name, []).append(value)

        for k in range(rounds):
            rate = matmul_flops / times[f"matmul_{precision}"][k]
            step = times[f"step_{precision}"][k]
            parts = {part: times[f"{part}_{precision}"][k] for part in _PARTS}
            # Whichever is faster: the three side by side, or one after another.
            gemms = min(parts["all"], sum(parts[part] for part in _PARTS[:3]))
            ideal_gemms = primary_conv_flops(batch) / rate
            moved = sum(traffic[precision].values()) / bandwidth[k]
            goal_step = train_flops / (GOAL * rate)
            add("matmul_gflops", rate / 1e9)
            add("step_ms", 1e3 * step)
            add("fraction_now", train_flops / step / rate)
            for part in _PARTS:
                add(f"{part}_ms", 1e3 * parts[part])
            add("primary_matmuls_ms", 1e3 * gemms)
            add("primary_matmuls_fraction", ideal_gemms / gemms)
            add("traffic_ms", 1e3 * moved)
            add("floor_ms", 1e3 * (gemms + moved))
            add("most_attainable_fraction", train_flops / (gemms + moved) / rate)
            add("ideal_floor_ms", 1e3 * (ideal_gemms + moved))
            add("most_attainable_fraction_ideal", train_flops / (ideal_gemms + moved) / rate)
            # The other design: TensorFlow's (oneDNN's) own convolution, no patches.
            convolution = times[f"convolution_{precision}"][k]
            conv_moved = sum(
                size for item, size in traffic[precision].items() if item not in _PATCH_TRAFFIC
            ) / bandwidth[k]
            add("convolution_ms", 1e3 * convolution)
            add("convolution_floor_ms", 1e3 * (convolution + conv_moved))
            add("most_attainable_fraction_convolution",
                train_flops / (convolution + conv_moved) / rate)
            add("goal_step_ms", 1e3 * goal_step)
            add("goal_ms_beside_primary_matmuls", 1e3 * (goal_step - gemms))
            add("ms_beside_primary_matmuls_now", 1e3 * (step - gemms))
        results[precision] = {name: summary(values) for name, values in rows.items()}
        results[precision]["traffic_bytes"] = traffic[precision]
    return results


def markdown(results, precisions, machine, args):
    """The results as a table, one column per precision (medians [ranges] of the rounds)."""

    def cell(precision, name, digits):
        s = results[precision][name]
        return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}-{s['max']:.{digits}f}]"

    labels = (
        ("matmul_gflops", "TensorFlow's 2048^3 matmul, GFLOP/s", 0),
        ("step_ms", "training step now (`train_on_batch`), ms", 1),
        ("fraction_now", "**now: fraction of the matmul rate**", 3),
        ("forward_ms", "PrimaryCaps' product alone, ms", 1),
        ("kernel_gradient_ms", "its kernel gradient alone, ms", 1),
        ("input_gradient_ms", "its input (patch) gradient alone, ms", 1),
        ("all_ms", "the three in one function, side by side, ms", 1),
        ("primary_matmuls_fraction", "the faster of those two, as a fraction of the matmul rate",
         3),
        ("traffic_ms", "least traffic beside them, at the fastest rate measured, ms", 1),
        ("floor_ms", "floor: PrimaryCaps' matmuls as measured + that traffic, ms", 1),
        ("most_attainable_fraction", "**at most: fraction of the matmul rate**", 3),
        ("ideal_floor_ms", "floor with PrimaryCaps' matmuls at the 2048^3 rate, ms", 1),
        ("most_attainable_fraction_ideal", "**at most, so: fraction of the matmul rate**", 3),
        ("convolution_ms", "TensorFlow's own convolution, forward and both gradients, ms", 1),
        ("convolution_floor_ms", "floor with it (no patches to write or fold), ms", 1),
        ("most_attainable_fraction_convolution", "**at most, with it: fraction of the matmul "
         "rate**", 3),
        ("goal_step_ms", f"step at {GOAL} of the matmul rate, ms", 1),
        ("goal_ms_beside_primary_matmuls",
         "  ... of it left beside PrimaryCaps' matmuls as measured, ms", 1),
        ("ms_beside_primary_matmuls_now", "time beside PrimaryCaps' matmuls now, ms", 1),
    )
    bandwidth = results["bytes_per_second"]
    lines = [
        f"{machine}; batch {args.batch_size}, {args.rounds} rounds of {args.steps} calls, "
        "medians [ranges] of the rounds.",
        "",
        "| | " + " | ".join(precisions) + " |",
        "| --- |" + " --- |" * len(precisions),
    ]
    for name, label, digits in labels:
        lines.append(f"| {label} | " + " | ".join(
            cell(precision, name, digits) for precision in precisions) + " |")
    lines.append("| least traffic beside them, MB | " + " | ".join(
        " + ".join(f"{item} {size / 1e6:.0f}"
                   for item, size in results[precision]["traffic_bytes"].items())
        for precision in precisions) + " |")
    lines += [
        "",
        f"Fastest rate TensorFlow moved bytes at: {bandwidth['median'] / 1e9:.1f} GB/s "
        f"[{bandwidth['min'] / 1e9:.1f}-{bandwidth['max'] / 1e9:.1f}] (the fastest of a sum "
        "over and a scaled copy of float32 tensors of 32 MiB, 64 MiB and the bfloat16 "
        "patches' size).",
    ]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3, help="calls of each function a round")
    parser.add_argument("--batch_size", type=int, default=100)
    parser.add_argument("--precisions", default="float32,bfloat16",
                        help="comma-separated: float32, bfloat16")
    parser.add_argument("--output_dir", default="", help="write floor.json and floor.md here")
    args = parser.parse_args()
    precisions = [p for p in args.precisions.split(",") if p]
    unknown = sorted(set(precisions) - {"float32", "bfloat16"})
    if unknown or not precisions:
        parser.error(f"--precisions: choose from float32, bfloat16. Received: {args.precisions!r}")
    if min(args.rounds, args.steps, args.batch_size) < 1:
        parser.error("--rounds, --steps and --batch_size must be positive. Received: "
                     f"{args.rounds}, {args.steps}, {args.batch_size}")
    import tensorflow as tf

    from capsnet_tf import benchmarking, cpu

    batch = args.batch_size
    inputs, targets = benchmarking.random_mnist_batch(batch)
    matmuls, matmul_flops = benchmarking.matmul_ceilings()
    functions = {f"matmul_{p}": matmuls[p] for p in precisions}
    traffic = {}
    for precision in precisions:
        model = benchmarking.mnist_capsnet(precision)
        functions[f"step_{precision}"] = (
            lambda model=model: model.train_on_batch(inputs, targets))
        dtype = tf.as_dtype(precision)
        operands = (
            tf.Variable(tf.cast(tf.random.uniform((batch * 36, 9 * 9 * 256), seed=6), dtype)),
            tf.Variable(tf.cast(tf.random.normal((9, 9, 256, 256), stddev=0.01, seed=7), dtype)),
            tf.cast(tf.random.normal((batch, 6, 6, 256), seed=8), dtype),
        )
        for part, function in primary_matmuls(*operands).items():
            functions[f"{part}_{precision}"] = function
        convolution, _ = benchmarking.conv_ceilings(batch, dtype)
        functions[f"convolution_{precision}"] = tf.function(
            lambda convolution=convolution: corner(*tf.nest.flatten(convolution())),
            autograph=False)
        parameters = sum(int(w.shape.num_elements()) for w in model.trainable_weights)
        traffic[precision] = benchmarking.step_traffic_bytes(batch, dtype.size, parameters)
    # From the size of one routing slice's votes to that of the bfloat16 patches.
    stream_bytes = {}
    patches = benchmarking.step_traffic_bytes(batch, 2, 0)["patches"]
    for name, (function, moved) in streams([32 * 2**20, 64 * 2**20, patches]).items():
        functions[name] = function
        stream_bytes[name] = moved
    times = benchmarking.alternate(functions, args.rounds, args.steps, warmup=2)

    results = analyse(times, precisions, batch, traffic, stream_bytes, matmul_flops)
    machine = (f"{cpu.model_name()} (family/model {cpu.family_and_model()}), "
               f"{cpu.usable_cores()} cores, {', '.join(cpu.instruction_sets())}")
    results["machine"] = machine
    results["seconds"] = times
    text = markdown(results, precisions, machine, args)
    print(text)
    if args.output_dir:
        os.makedirs(args.output_dir, exist_ok=True)
        with open(os.path.join(args.output_dir, "floor.json"), "w") as f:
            json.dump(results, f, indent=1)
        with open(os.path.join(args.output_dir, "floor.md"), "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
