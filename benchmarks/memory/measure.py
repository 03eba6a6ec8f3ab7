r"""Measured peak memory (VmHWM) of CapsNet training steps against `capsnet_tf.memory`.

Each configuration runs in a fresh process: it builds the model of an
`ExperimentConfig` the way `experiments/mnist.py` does (`build_model`,
`compile_model`), trains `--steps` steps with `model.fit` on random images
held in memory, and reads its peak resident memory (`VmHWM` of
`/proc/self/status`). The parent compares it with
`capsnet_tf.memory.estimate_training_memory` for the same configuration and
writes `results.json` next to this file.

    python benchmarks/memory/measure.py                          # every configuration
    python benchmarks/memory/measure.py --only=mnist_28x28x1_b32  # one of them
    python benchmarks/memory/measure.py --baseline               # TensorFlow's own memory
    python benchmarks/memory/measure.py --script=all             # experiments/mnist.py itself
    python benchmarks/memory/measure.py --reestimate             # new estimates, old peaks

`--baseline` trains a CapsNet too small for its tensors to matter (one
primary capsule type, batch 1): its VmHWM less the estimate of those tensors
is `capsnet_tf.memory.TENSORFLOW_BASELINE_BYTES`, TensorFlow's and the
graph's own memory. Run it before the others when TensorFlow changes.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(_HERE)))

# --allocator=bfc: TensorFlow's BFC allocator in the measured processes
# instead of its default CPU allocator (which experiments/mnist.py uses).
_ALLOCATOR = "TF_CPU_ALLOCATOR_USE_BFC"

# name: (image shape, classes, batch size, ExperimentConfig overrides)
CONFIGURATIONS = {
    "mnist_28x28x1_b32": ((28, 28, 1), 10, 32, {}),
    "mnist_28x28x1_b128": ((28, 28, 1), 10, 128, {}),
    "cifar_32x32x3_b32": ((32, 32, 3), 10, 32, {}),
    "cifar_32x32x3_same_b16": ((32, 32, 3), 10, 16, {"padding": "same", "reconstruction": False}),
    "rgb_48x48x3_b16": ((48, 48, 3), 3, 16, {}),
    "rgb_64x64x3_b8": ((64, 64, 3), 3, 8, {}),
    "rgb_128x128x3_b4": ((128, 128, 3), 3, 4, {}),
    "rgb_128x128x3_b8": ((128, 128, 3), 3, 8, {}),
    "rgb_128x128x3_stem1_b16": ((128, 128, 3), 3, 16, {"stem_layers": 1}),
    "rgb_128x128x3_stem2_b16": ((128, 128, 3), 3, 16, {"stem_layers": 2}),
    "rgb_128x128x3_stem2_b32": ((128, 128, 3), 3, 32, {"stem_layers": 2}),
}


def vm_hwm():
    """This process's peak resident memory so far (`VmHWM`), in bytes."""
    with open("/proc/self/status") as file:
        for line in file:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def training_setup(name, steps):
    """`CONFIGURATIONS[name]` built as `experiments/mnist.py` builds it, and one random batch.

    Returns:
        `(model, inputs, targets)`: the compiled model and the batch's input
        and target dicts, in the structure `model.fit` and `train_on_batch` take.
    """
    import keras
    import numpy as np

    from capsnet_tf.config import ExperimentConfig
    from capsnet_tf.training import build_model, compile_model

    shape, classes, batch, overrides = CONFIGURATIONS[name]
    config = ExperimentConfig(batch_size=batch, **overrides)
    keras.utils.set_random_seed(0)
    model = compile_model(build_model(config, shape, classes), config, steps_per_epoch=steps)
    rng = np.random.default_rng(0)
    images = rng.random((batch, *shape), dtype=np.float32)
    labels = rng.integers(0, classes, batch).astype(np.int32)
    if config.reconstruction:
        return model, {"image": images, "label": labels}, {"length": labels,
                                                            "reconstruction": images}
    return model, {"image": images}, {"length": labels}


def child(name, steps):
    """Trains `CONFIGURATIONS[name]` for `steps` steps; prints its VmHWM as JSON."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    model, inputs, targets = training_setup(name, steps)
    element = (inputs, targets)
    data = tf.data.Dataset.from_tensors(element).repeat()
    start = time.perf_counter()
    model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0)
    seconds = time.perf_counter() - start
    print(json.dumps({"vm_hwm": vm_hwm(), "seconds": seconds,
                      "params": int(model.count_params())}))


# The baseline: CapsNet's graph (every op and kernel, the XLA-compiled routing)
# with tensors too small to matter: 1 primary capsule type, batch 1.
BASELINE = ((28, 28, 1), 10, 1, {"primary_capsule_types": 1})


def estimate(name, **options):
    """`capsnet_tf.memory.estimate_training_memory` of `CONFIGURATIONS[name]`'s steps."""
    from capsnet_tf.config import ExperimentConfig, capsnet_options
    from capsnet_tf.memory import estimate_training_memory

    shape, classes, batch, overrides = CONFIGURATIONS[name]
    config = ExperimentConfig(batch_size=batch, **overrides)
    return estimate_training_memory(
        shape, classes, batch,
        **capsnet_options(config),
        # the data: one batch of images and labels (the parent's random batch)
        data_bytes=4 * batch * (shape[0] * shape[1] * shape[2]) * 2,
        checkpoints=False,  # these steps write no checkpoints
        **options,
    )


# End to end: experiments/mnist.py itself, its input pipeline, checkpoints and
# evaluation included; the estimate is the one the script logs. name: (image
# size of a generated folder, examples/shapes_folder.py, or None for MNIST; flags).
SCRIPT_RUNS = {
    "script_mnist_b128": (None, ["--flagfile=mnist.flags", "--batch_size=128"]),
    "script_folder_48x48x3_b16": (48, ["--flagfile=mnist.flags", "--batch_size=16"]),
    "script_folder_128x128x3_stem1_b16": (
        128, ["--flagfile=mnist.flags", "--batch_size=16", "--stem_layers=1"]
    ),
    "script_folder_128x128x3_stem2_b16": (
        128, ["--flagfile=mnist.flags", "--batch_size=16", "--stem_layers=2"]
    ),
}


def run_script(name, steps, scratch):
    """Runs `SCRIPT_RUNS[name]` for `steps` steps; its peak against the estimate it logged."""
    import re
    import resource
    import shutil

    size, flags = SCRIPT_RUNS[name]
    if size:
        folder = os.path.join(scratch, f"shapes{size}")
        if not os.path.isdir(folder):
            sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(_HERE)), "examples"))
            from shapes_folder import write_shapes_folder

            write_shapes_folder(folder, size=size, per_class=100)
        flags = [*flags, f"--image_folder={folder}"]
    workdir = os.path.join(scratch, name)
    shutil.rmtree(workdir, ignore_errors=True)
    script = os.path.join(os.path.dirname(os.path.dirname(_HERE)), "experiments", "mnist.py")
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, script, *flags, f"--steps_per_epoch={steps}", "--epochs=1",
         "--eval_examples=64", f"--workdir={workdir}", "--verbose=0"],
        capture_output=True, text=True, check=False,
    )
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-3000:])
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # the largest child
    found = re.search(r"Estimated peak memory of a training step at batch size \d+: "
                      r"([\d.]+) (GiB|MiB)", result.stderr)
    logged = float(found.group(1)) * (2**30 if found.group(2) == "GiB" else 2**20)
    return {"measured_vm_hwm_mib": round(peak / 2**20, 1),
            "estimate_mib": round(logged / 2**20, 1),
            "estimate_over_measured": round(logged / peak, 3),
            "flags": flags, "steps": steps, "seconds": round(seconds, 1)}


def run_child_script(name, steps, scratch):
    """`run_script` in a process of its own, so that each peak is its own."""
    return run_child(["--child=script:" + name, f"--steps={steps}", f"--scratch={scratch}"])


def run_child(arguments):
    """This script with `arguments` in a fresh process; the JSON of its last line."""
    result = subprocess.run(
        [sys.executable, os.path.abspath(__file__), *arguments],
        capture_output=True, text=True, check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def measure_baseline(results, steps):
    """`results["tensorflow_baseline"]`: the VmHWM of `BASELINE` less its tensors."""
    measured = run_child(["--child=baseline", f"--steps={steps}"])
    tensors = estimate("baseline", baseline_bytes=0).total
    results["tensorflow_baseline"] = {
        "configuration": "CapsNet 28x28x1, 1 primary capsule type, batch 1",
        "vm_hwm_mib": round(measured["vm_hwm"] / 2**20, 1),
        "its_tensors_estimated_mib": round(tensors / 2**20, 1),
        "baseline_mib": round((measured["vm_hwm"] - tensors) / 2**20, 1),
    }
    print(f"baseline: {(measured['vm_hwm'] - tensors) / 2**20:.0f} MiB (VmHWM "
          f"{measured['vm_hwm'] / 2**20:.0f} MiB less {tensors / 2**20:.0f} MiB of tensors)")


def measure_steps(results, names, steps):
    """`results["runs"][name]`: training steps of `CONFIGURATIONS[name]`, each in its process."""
    for name in names:
        measured = run_child([f"--child={name}", f"--steps={steps}"])
        results.setdefault("runs", {})[name] = run = {
            "params": measured["params"], "steps": steps,
            "seconds": round(measured["seconds"], 1),
        }
        _record(run, estimate(name), measured["vm_hwm"])
        print(f"{name}: measured {run['measured_vm_hwm_mib']:.0f} MiB, estimate "
              f"{run['estimate_mib']:.0f} MiB, ratio {run['estimate_over_measured']:.2f}",
              flush=True)


def measure_scripts(results, names, steps, scratch):
    """`results["script_runs"][name]`: `experiments/mnist.py` runs of `SCRIPT_RUNS`."""
    os.makedirs(scratch, exist_ok=True)
    for name in names:
        measured = run_child_script(name, steps, scratch)
        results.setdefault("script_runs", {})[name] = measured
        print(f"{name}: measured {measured['measured_vm_hwm_mib']:.0f} MiB, logged estimate "
              f"{measured['estimate_mib']:.0f} MiB, ratio "
              f"{measured['estimate_over_measured']:.2f}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--baseline", action="store_true",
                        help="measure TensorFlow's own memory (TENSORFLOW_BASELINE_BYTES)")
    parser.add_argument("--only", default="", help="comma-separated configuration names")
    parser.add_argument("--script", default="",
                        help="comma-separated SCRIPT_RUNS names (end-to-end runs), or 'all'")
    parser.add_argument("--reestimate", action="store_true",
                        help="recompute the estimates of the runs in --output, measuring nothing")
    parser.add_argument("--allocator", choices=("default", "bfc"), default="default",
                        help="TensorFlow's CPU allocator in the measured processes: its "
                        "default (as experiments/mnist.py runs) or its BFC allocator")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--scratch", default="/tmp/capsnet_memory",
                        help="generated image folders and work directories of --script")
    parser.add_argument("--output", default=os.path.join(_HERE, "results.json"))
    args = parser.parse_args()
    if not args.child:  # the children inherit it
        os.environ[_ALLOCATOR] = "true" if args.allocator == "bfc" else "false"
    if args.child and args.child.startswith("script:"):
        print(json.dumps(run_script(args.child[len("script:"):], args.steps, args.scratch)))
        return
    CONFIGURATIONS["baseline"] = BASELINE
    if args.child:
        child(args.child, args.steps)
        return
    results = {}
    if os.path.exists(args.output):
        with open(args.output) as file:
            results = json.load(file)
    if args.script:
        names = list(SCRIPT_RUNS) if args.script == "all" else args.script.split(",")
        measure_scripts(results, names, args.steps, args.scratch)
    elif args.reestimate:
        for name, run in results.get("runs", {}).items():
            _record(run, estimate(name), run["measured_vm_hwm_mib"] * 2**20)
    elif args.baseline:
        measure_baseline(results, args.steps)
    else:
        names = [n for n in args.only.split(",") if n] or [
            n for n in CONFIGURATIONS if n != "baseline"
        ]
        measure_steps(results, names, args.steps)
    for name, run in {**results.get("runs", {}), **results.get("script_runs", {})}.items():
        print(f"{name}: measured {run['measured_vm_hwm_mib']:.0f} MiB, estimate "
              f"{run['estimate_mib']:.0f} MiB, ratio {run['estimate_over_measured']:.2f}")
    results["machine"] = {"processor": _cpu_model(), "python": platform.python_version()}
    results["allocator"] = args.allocator
    with open(args.output, "w") as file:
        json.dump(results, file, indent=2, sort_keys=True)


def _record(run, predicted, measured):
    """Writes the estimate and its ratio to the measured peak into `run`."""
    run.update({
        "measured_vm_hwm_mib": round(measured / 2**20, 1),
        "estimate_mib": round(predicted.total / 2**20, 1),
        "estimate_over_measured": round(predicted.total / measured, 3),
        "estimate_parts_mib": {k: round(v / 2**20, 1) for k, v in predicted.parts.items()},
        "params_estimated": predicted.parameters,
        "primary_capsules": predicted.primary_capsules,
    })


def _cpu_model():
    from capsnet_tf import cpu  # here: the measured runs are subprocesses, this one writes

    return cpu.model_name() or platform.processor()


if __name__ == "__main__":
    main()
