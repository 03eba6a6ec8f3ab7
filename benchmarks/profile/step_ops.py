r"""Where a training or inference step's time goes, op by op, from TensorFlow's trace.

Issue 17 asks to measure before changing: this script traces a few
`train_on_batch` steps of the `mnist.flags` CapsNet (batch 100) with
`tf.profiler`, reads the XPlane the profiler writes, and sums the op time
of each TensorFlow op on the CPU threads, grouped by op name and type:

    python benchmarks/profile/step_ops.py --precision=bfloat16 --steps=5 \
        --output=benchmarks/results/NAME/ops_bfloat16.md

With `--inference` it traces the model's inference call instead (the graph
the SavedModel's `serving_float` signature holds), at `--batch_size` (256 in
the benchmark's inference section).

Op times overlap when the two inter-op threads run ops at once, so their sum
can exceed the step's wall time, and an op that shares the cores with another
takes longer than it would alone; the step's wall time (median of as many
steps, timed before tracing) is printed beside them. An XLA-compiled function
(the routing loop) counts as one row. `--timeline=MS` adds one step's ops
of MS or more in time order, with the thread each ran on: the serial chain
of the step and the ops that run side by side.
"""

import argparse
import collections
import glob
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

# oneDNN's CPU kernels on AVX2-only CPUs too, where TensorFlow leaves them off
# (docs/performance.md). Read once, when TensorFlow is first imported; =0 keeps them off.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

import capsnet_tf  # noqa: E402, F401


def op_events(xplane_path):
    """The TF ops (and XLA-compiled functions) on the host's executor threads.

    Returns a list of `(start_ms, end_ms, op_name, op_type, thread)`, sorted
    by start.
    """
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(xplane_path, "rb") as f:
        space.ParseFromString(f.read())
    events = []
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        names = {i: m.name for i, m in plane.event_metadata.items()}
        for line in plane.lines:
            # The executor's threads; the Python line holds the whole step.
            if line.name.startswith("python") or "TraceMe" in line.name:
                continue
            for event in line.events:
                name = names.get(event.metadata_id, "?")
                if name == "CpuExecutable::ExecuteAsyncOnStream":
                    # An XLA-compiled function (the routing loop): its ops are
                    # not TF ops, so the executable's span is their time.
                    name = "XLA-compiled function:XLA"
                elif ":" not in name or "::" in name:
                    # TF ops are "name:Type"; the executors' own spans
                    # ("ExecutorState::Process", "ThunkExecutor::Execute")
                    # contain the ops they run and would count them twice.
                    continue
                op_name, op_type = name.rsplit(":", 1)
                start = (line.timestamp_ns * 1000 + event.offset_ps) / 1e9
                events.append(
                    (start, start + event.duration_ps / 1e9, op_name, op_type, line.id)
                )
    return sorted(events)


def op_times(events):
    """Sums `op_events` per (op name, op type): dict to (total ms, event count)."""
    totals = collections.defaultdict(lambda: [0.0, 0])
    for start, end, op_name, op_type, _ in events:
        entry = totals[(op_name, op_type)]
        entry[0] += end - start
        entry[1] += 1
    return totals


def timeline(events, shortest_ms):
    """Markdown rows of the traced ops longer than `shortest_ms`, in time order.

    Ops that overlap ran side by side (each row names its executor thread),
    which is how a step's serial chain, and an idle core, show.

    Returns:
        The rows and the span from the first op's start to the last op's end, ms.
    """
    origin = events[0][0]
    threads = {}
    rows = ["| start, ms | end, ms | ms | thread | op | type |",
            "| --- | --- | --- | --- | --- | --- |"]
    for start, end, op_name, op_type, thread in events:
        if end - start >= shortest_ms:
            label = threads.setdefault(thread, len(threads) + 1)
            rows.append(f"| {start - origin:.1f} | {end - origin:.1f} | {end - start:.1f} "
                        f"| {label} | `{op_name}` | {op_type} |")
    return rows, max(end for _, end, *_ in events) - origin


def traced_events(step, steps):
    """`op_events` of `steps` calls of `step` under TensorFlow's profiler."""
    import tensorflow as tf

    logdir = tempfile.mkdtemp(prefix="capsnet_profile_")
    tf.profiler.experimental.start(logdir)
    for _ in range(steps):
        step()
    tf.profiler.experimental.stop()
    paths = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
    if not paths:
        raise SystemExit(f"The profiler wrote no .xplane.pb under {logdir}.")
    return op_events(paths[0])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--precision", choices=["float32", "bfloat16"], default="bfloat16")
    parser.add_argument("--batch_size", type=int, default=100)
    parser.add_argument("--steps", type=int, default=5, help="traced steps (after 3 untraced)")
    parser.add_argument("--top", type=int, default=25, help="rows of the per-op table")
    parser.add_argument("--timeline", type=float, default=0.0, metavar="MS",
                        help="also trace one step alone and list its ops of MS or more")
    parser.add_argument("--inference", action="store_true",
                        help="trace inference calls (lengths, no training) instead")
    parser.add_argument("--output", default="", help="also write the tables to this file")
    args = parser.parse_args()
    if args.steps < 1 or args.batch_size < 1:
        parser.error(f"--steps and --batch_size must be positive. Received: "
                     f"{args.steps}, {args.batch_size}")
    import tensorflow as tf

    from capsnet_tf import benchmarking

    # The model and the batch that experiments/benchmark.py times.
    model = benchmarking.mnist_capsnet(args.precision)
    x, y = benchmarking.random_mnist_batch(args.batch_size)
    if args.inference:
        inference = tf.function(
            lambda images: model.inference_model()(images, training=False)["length"],
            autograph=False,
        )

        def step():
            benchmarking.blocking(inference(x["image"]))
    else:

        def step():
            model.train_on_batch(x, y)

    for _ in range(3):
        step()
    walls = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        walls.append(time.perf_counter() - start)
    totals = op_times(traced_events(step, args.steps))

    per_step = {key: (ms / args.steps, count / args.steps) for key, (ms, count) in totals.items()}
    by_type = collections.defaultdict(float)
    for (_, op_type), (ms, _) in per_step.items():
        by_type[op_type] += ms
    step_ms = 1e3 * statistics.median(walls)
    lines = [
        f"{args.precision}{' inference' if args.inference else ''}, batch {args.batch_size}: "
        f"step {step_ms:.1f} ms wall "
        f"(median of {args.steps}, {args.batch_size / step_ms * 1e3:.1f} images/s); "
        f"op time {sum(by_type.values()):.1f} ms a step over {args.steps} traced steps",
        "", "| op | type | ms a step | calls a step |", "| --- | --- | --- | --- |"]
    for (op_name, op_type), (ms, count) in sorted(per_step.items(), key=lambda kv: -kv[1][0])[
            :args.top]:
        lines.append(f"| `{op_name}` | {op_type} | {ms:.1f} | {count:.0f} |")
    lines += ["", "| op type | ms a step |", "| --- | --- |"]
    for op_type, ms in sorted(by_type.items(), key=lambda kv: -kv[1])[:args.top]:
        lines.append(f"| {op_type} | {ms:.1f} |")
    if args.timeline > 0:
        # One more step traced alone, so that its ops are the whole trace.
        rows, span = timeline(traced_events(step, 1), args.timeline)
        lines += ["", f"One more step traced alone: {span:.1f} ms from its first op to its "
                  f"last; its ops of {args.timeline:g} ms or more, in order:", ""] + rows
    text = "\n".join(lines) + "\n"
    print(text)
    if args.output:
        os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
        with open(args.output, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
