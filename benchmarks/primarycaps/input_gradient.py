r"""PrimaryCaps' two input-gradient forms, alternated in one process.

Issue 17's probe: `_valid_conv_as_matmul` picks `"backprop_input"` (oneDNN's
`Conv2DBackpropInput`) in bfloat16 on CPUs with AVX-512 BF16 and no AMX, and
`"col2im"` (a matmul into patch gradients and two 0/1 fold matmuls)
everywhere else. Each was chosen by measuring on one kind of CPU; this script
times both on the CPU it runs on:

    python benchmarks/primarycaps/input_gradient.py --rounds=8

It alternates TensorFlow's 2048^3 matmul in float32 and bfloat16 with
`train_on_batch` of the `mnist.flags` CapsNet at batch 100 for each form,
in mixed bfloat16 and (with `--float32`) in float32, and prints each rate,
its ratio to the matmul rate of its precision (1.2026 GFLOP per training
image), and the per-round speed-up of col2im over backprop_input.
"""

import argparse
import json
import os
import sys
from unittest import mock

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import capsnet_tf  # noqa: E402, F401  (first: its TF_ENABLE_ONEDNN_OPTS default, before TensorFlow)


def forms():
    """The `bfloat16_unit()` answer that makes `_valid_conv_as_matmul` pick each form.

    col2im keeps this CPU's answer where it is AMX, so that its bfloat16
    product takes AMX's transposed form (`_patch_product`) as in training.
    """
    from capsnet_tf import cpu

    return {"backprop_input": "avx512_bf16",
            "col2im": "amx" if cpu.bfloat16_unit() == "amx" else None}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--batch_size", type=int, default=100)
    parser.add_argument("--float32", action="store_true", help="time float32 steps too")
    parser.add_argument("--output", default="", help="write the rates to this JSON file")
    args = parser.parse_args()
    import numpy as np

    from capsnet_tf import cpu
    from capsnet_tf.benchmarking import (
        alternate,
        matmul_ceilings,
        mnist_capsnet,
        random_mnist_batch,
        training_flops_per_image,
    )

    inputs, targets = random_mnist_batch(args.batch_size)

    def training_step(precision, unit):
        model = mnist_capsnet(precision)

        def step():
            # The form is chosen when the step is traced (its first call).
            with mock.patch.object(cpu, "bfloat16_unit", return_value=unit):
                return model.train_on_batch(inputs, targets)

        return step

    matmuls, matmul_flops = matmul_ceilings()
    functions = {"matmul_float32": matmuls["float32"], "matmul_bfloat16": matmuls["bfloat16"]}
    precisions = ["bfloat16", "float32"] if args.float32 else ["bfloat16"]
    for precision in precisions:
        for form, unit in forms().items():
            if precision == "float32" and form == "backprop_input":
                # In float32 backprop_input is only reachable by name.
                continue
            functions[f"{form}_{precision}"] = training_step(precision, unit)
    times = alternate(functions, rounds=args.rounds, steps=3, warmup=2)
    train_flops = training_flops_per_image()
    report = {"instruction_sets": cpu.instruction_sets(), "rounds": args.rounds, "rates": {}}
    for name, seconds in times.items():
        if name.startswith("matmul"):
            continue
        precision = name.rsplit("_", 1)[1]
        rates = args.batch_size / np.array(seconds)
        ratios = rates * train_flops * np.array(times["matmul_" + precision]) / matmul_flops
        report["rates"][name] = {"images_per_s": float(np.median(rates)),
                                 "matmul_ratio": float(np.median(ratios))}
        print(f"{name}: {np.median(rates):.1f} images/s [{rates.min():.1f}-{rates.max():.1f}], "
              f"{np.median(ratios):.3f} of the {precision} matmul rate")
    for precision in ("float32", "bfloat16"):
        seconds = np.array(times["matmul_" + precision])
        print(f"matmul {precision}: {np.median(matmul_flops / seconds) / 1e9:.0f} GFLOP/s")
    speedup = np.array(times["backprop_input_bfloat16"]) / np.array(times["col2im_bfloat16"])
    report["col2im_speedup_bfloat16"] = {"median": float(np.median(speedup)),
                                         "min": float(speedup.min()), "max": float(speedup.max())}
    print(f"col2im over backprop_input, bfloat16: {np.median(speedup):.3f}x "
          f"({speedup.min():.3f}-{speedup.max():.3f}) per round")
    if args.output:
        with open(args.output, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
