r"""Keras's Adam against `capsnet_tf.optimizers.FusedAdam`, alternated in one process.

Issue 17's probe: `compile_model` now trains with `FusedAdam` (the same
update in one `ResourceApplyAdam` kernel per variable). This script times
`train_on_batch` of the `mnist.flags` CapsNet at batch 100 with each
optimizer, in float32 and mixed bfloat16, alternating with TensorFlow's
2048^3 matmuls, and prints each rate, its fraction of the matmul rate of its
precision (1.2026 GFLOP per training image) and the per-round speed-up:

    python benchmarks/optimizer/fused_adam.py --rounds=8 --output=fused_adam.json
"""

import argparse
import json
import os
import statistics
import sys
from unittest import mock

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import capsnet_tf  # noqa: E402, F401  (first: its TF_ENABLE_ONEDNN_OPTS default, before TensorFlow)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--batch_size", type=int, default=100)
    parser.add_argument("--output", default="", help="write the rates to this JSON file")
    args = parser.parse_args()
    import keras

    from capsnet_tf import cpu, training
    from capsnet_tf.benchmarking import (
        alternate,
        matmul_ceilings,
        mnist_capsnet,
        random_mnist_batch,
        training_flops_per_image,
    )

    inputs, targets = random_mnist_batch(args.batch_size)

    def training_step(precision, optimizer):
        if optimizer == "keras_adam":
            with mock.patch.object(training, "FusedAdam", keras.optimizers.Adam):
                model = mnist_capsnet(precision)
        else:
            model = mnist_capsnet(precision)
        assert type(model.optimizer).__name__ == ("Adam" if optimizer == "keras_adam"
                                                  else "FusedAdam")
        return lambda: model.train_on_batch(inputs, targets, return_dict=False)

    matmuls, matmul_flops = matmul_ceilings()
    functions = {f"matmul_{name}": function for name, function in matmuls.items()}
    for precision in ("float32", "bfloat16"):
        for optimizer in ("keras_adam", "fused_adam"):
            functions[f"{optimizer}_{precision}"] = training_step(precision, optimizer)
    times = alternate(functions, rounds=args.rounds, steps=3, warmup=2)
    train_flops = training_flops_per_image() * args.batch_size
    report = {"machine": {"cpu_model": cpu.model_name(),
                          "instruction_sets": cpu.instruction_sets()},
              "rounds": args.rounds, "batch_size": args.batch_size, "rates": {}}
    for precision in ("float32", "bfloat16"):
        matmul = times[f"matmul_{precision}"]
        for optimizer in ("keras_adam", "fused_adam"):
            step = times[f"{optimizer}_{precision}"]
            report["rates"][f"{optimizer}_{precision}"] = {
                "images_per_second": statistics.median(args.batch_size / t for t in step),
                "fraction_of_matmul_rate": statistics.median(
                    train_flops * m / (matmul_flops * t) for m, t in zip(matmul, step)
                ),
            }
        speedups = [k / f for k, f in zip(times[f"keras_adam_{precision}"],
                                          times[f"fused_adam_{precision}"])]
        report["rates"][f"speedup_{precision}"] = {
            "median": statistics.median(speedups), "min": min(speedups), "max": max(speedups),
        }
    print(json.dumps(report, indent=1))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
