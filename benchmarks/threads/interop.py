r"""Training step against the matmul rate with a given number of inter-op threads.

Issue 17's probe of whether one inter-op thread (ops run one at a time, each
on every core) beats TensorFlow's default (independent ops side by side).
The thread count can only be set before TensorFlow starts, so each setting
runs in its own process; alternate them:

    for n in 0 1 0 1; do python benchmarks/threads/interop.py --inter_op=$n; done

Each process alternates TensorFlow's 2048^3 matmul in float32 and bfloat16
with `train_on_batch` of the `mnist.flags` CapsNet at batch 100 in float32
and mixed bfloat16, and prints each precision's training rate times the
training FLOPs per image over that precision's matmul rate.
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--inter_op", type=int, default=0, help="inter-op threads; 0: default")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--batch_size", type=int, default=100)
    args = parser.parse_args()
    import numpy as np
    import tensorflow as tf

    if args.inter_op:
        tf.config.threading.set_inter_op_parallelism_threads(args.inter_op)
    from capsnet_tf.benchmarking import (
        alternate,
        matmul_ceilings,
        mnist_capsnet,
        random_mnist_batch,
        training_flops_per_image,
    )

    inputs, targets = random_mnist_batch(args.batch_size)

    def training_step(precision):
        model = mnist_capsnet(precision)
        return lambda: model.train_on_batch(inputs, targets)

    matmuls, matmul_flops = matmul_ceilings()
    functions = {
        "matmul_float32": matmuls["float32"],
        "matmul_bfloat16": matmuls["bfloat16"],
        "train_float32": training_step("float32"),
        "train_bfloat16": training_step("bfloat16"),
    }
    times = alternate(functions, rounds=args.rounds, steps=2, warmup=2)
    median = {name: float(np.median(seconds)) for name, seconds in times.items()}
    train_flops = training_flops_per_image()
    for precision in ("float32", "bfloat16"):
        rate = args.batch_size / median["train_" + precision]
        ceiling = matmul_flops / median["matmul_" + precision]
        print(f"inter_op={args.inter_op or 'default'} {precision}: train {rate:.1f} images/s, "
              f"matmul {ceiling / 1e9:.0f} GFLOP/s, ratio {rate * train_flops / ceiling:.3f}")


if __name__ == "__main__":
    main()
