"""Measurement helpers of `experiments/benchmark.py`: FLOP counts, timing, fits.

Flag-free, so notebooks and tests can use them: `alternate` times several
functions in alternation (a shared machine's speed drifts, so references and
models are measured round by round), `conv_ceilings` builds the float32
PrimaryCaps-convolution reference, `linear_fit` fits cost against batch size
or routing iterations, `mnist_capsnet` and `random_mnist_batch` are the model
and the batch every benchmark script times.
"""

import resource
import statistics
import sys
import time

import tensorflow as tf

__all__ = [
    "alternate",
    "blocking",
    "call_seconds",
    "conv_ceilings",
    "linear_fit",
    "mnist_capsnet",
    "model_flops_per_image",
    "peak_rss_gib",
    "matmul_ceilings",
    "percentile",
    "primary_conv_flops",
    "random_mnist_batch",
    "step_traffic_bytes",
    "summary",
    "training_flops_per_image",
]


def model_flops_per_image(routing_iterations=3):
    """Forward FLOPs (multiply-adds x 2) of the MNIST CapsNet, per image."""
    conv1 = 2 * 20 * 20 * 9 * 9 * 1 * 256
    primary = 2 * 6 * 6 * 9 * 9 * 256 * 256
    votes = 2 * 1152 * 10 * 8 * 16
    # per iteration: weighted sum (2 i j e) + agreement (2 i j e) except the last
    routing = 2 * 1152 * 10 * 16 * (2 * routing_iterations - 1)
    decoder = 2 * (160 * 512 + 512 * 1024 + 1024 * 784)
    return conv1 + primary + votes + routing + decoder


def training_flops_per_image(routing_iterations=3):
    """FLOPs of one training image: the forward pass and its two gradients, 3x forward.

    Each layer's input and weight gradients cost what its forward product
    does; every fraction of a matmul rate in the benchmarks divides this by
    the time. For the MNIST CapsNet that is 1.2192 GFLOP: it counts conv1's
    input gradient (0.0166 GFLOP), which training never computes and issue
    17's 1.2026 GFLOP leaves out, so the fractions read 1.4% above the
    issue's count.
    """
    return 3 * model_flops_per_image(routing_iterations)


def primary_conv_flops(batch, backward=True):
    """FLOPs of the PrimaryCaps convolution: forward, or forward + 2 gradients."""
    forward = 2 * batch * 6 * 6 * 9 * 9 * 256 * 256
    return 3 * forward if backward else forward


def step_traffic_bytes(batch, itemsize, parameters, routing_iterations=3):
    """The least memory traffic of an MNIST CapsNet training step, bytes by item.

    A floor, not an estimate of what TensorFlow moves: only the traffic that
    any step built on PrimaryCaps' matmuls (im2col, one matmul per pass,
    col2im) must add to those matmuls' own reads and writes.

    - the patches `[batch * 36, 9 * 9 * 256]`, written once by the im2col;
    - their gradients, read once by the fold;
    - the routing's votes `[batch, 10, 16, 1152]`: written once, read once
      per forward iteration (each agreement fused with the next weighted
      sum) and once per backward iteration but the first (the couplings'
      and the activations' gradients of one iteration share a pass); their
      gradient is not counted, as if it fed the votes' product unwritten;
    - Adam: float32 weights, both moments and gradients read, weights and
      moments written.

    Everything else (conv1 and its gradient, casts, transposes, the decoder,
    the fold's and the gather's other side) counts as free.

    Args:
        batch: examples a step.
        itemsize: bytes per element of the patches and votes (2 in
            bfloat16, 4 in float32).
        parameters: the model's trainable weights, in elements.
        routing_iterations: routing iterations (the paper's 3).

    Returns:
        Dict item -> bytes.
    """
    patches = batch * 6 * 6 * 9 * 9 * 256 * itemsize
    votes = batch * 10 * 16 * 1152 * itemsize
    return {
        "patches": patches,
        "patch_gradients": patches,
        "votes": 2 * routing_iterations * votes,
        "adam": 7 * 4 * parameters,
    }


def summary(values):
    """Median, range and count of a list of numbers."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def linear_fit(xs, ys):
    """Least-squares line `y = slope x + intercept` and its largest relative miss."""
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum(
        (x - mean_x) ** 2 for x in xs
    )
    intercept = mean_y - slope * mean_x
    deviation = max(abs(y - (slope * x + intercept)) / y for x, y in zip(xs, ys))
    return {"slope": slope, "intercept": intercept, "largest_relative_deviation": deviation}


def peak_rss_gib():
    """Peak resident memory of this process so far, in GiB.

    Linux's `VmHWM` (the high-water mark of this process's own memory): unlike
    `getrusage`'s `ru_maxrss`, it starts afresh at `exec`, so a subprocess
    does not report its parent's peak. Falls back to `ru_maxrss` elsewhere.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 2**20  # kB
    except OSError:
        pass
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss / 2**30 if sys.platform == "darwin" else maxrss / 2**20


def blocking(result):
    """Fetches a step's results, so the timer includes the work itself."""
    tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, result)


def alternate(functions, rounds, steps, warmup):
    """Seconds per call of each function, measured in alternation.

    Every function runs `warmup` untimed calls first; then each round times
    `steps` calls of every function in turn.

    Returns:
        Dict name -> list of seconds per call, one entry per round.
    """
    for function in functions.values():
        for _ in range(warmup):
            blocking(function())
    times = {name: [] for name in functions}
    for _ in range(rounds):
        for name, function in functions.items():
            start = time.perf_counter()
            for _ in range(steps):
                result = function()
            blocking(result)
            times[name].append((time.perf_counter() - start) / steps)
    return times


def call_seconds(function, repeats, warmup):
    """Seconds of each of `repeats` calls of `function`, after `warmup` calls."""
    for _ in range(warmup):
        function()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        seconds.append(time.perf_counter() - start)
    return seconds


def percentile(values, fraction):
    """The value at `fraction` (0-1) of the sorted values, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def conv_ceilings(batch, dtype=tf.float32):
    """TensorFlow's PrimaryCaps convolution, forward+backward and forward only.

    The benchmark's ceilings are float32 (the default); `dtype=tf.bfloat16`
    times oneDNN's bfloat16 convolution, as `benchmarks/profile/floor.py`
    compares.
    """
    inputs = tf.Variable(tf.cast(tf.random.uniform((batch, 20, 20, 256), seed=1), dtype))
    kernel = tf.Variable(
        tf.cast(tf.random.normal((9, 9, 256, 256), stddev=0.01, seed=2), dtype)
    )
    upstream = tf.cast(tf.random.normal((batch, 6, 6, 256), seed=3), dtype)

    @tf.function
    def forward_backward():
        with tf.GradientTape() as tape:
            outputs = tf.nn.conv2d(inputs, kernel, 2, "VALID")
        gradients = tape.gradient(outputs, [inputs, kernel], output_gradients=upstream)
        # Returning the outputs keeps the forward convolution in the graph:
        # nothing else needs its values, and an unused one is pruned.
        return outputs, gradients

    @tf.function
    def forward():
        return tf.nn.conv2d(inputs, kernel, 2, "VALID")

    return forward_backward, forward


MATMUL_SIZE = 2048


def matmul_ceilings(size=MATMUL_SIZE, precisions=("float32", "bfloat16")):
    """TensorFlow's `size`^3 matmul in `precisions`: the machine's matmul rate.

    Returns:
        `({"float32": fn, "bfloat16": fn}, flops per call)`, one function
        per precision asked for.
    """
    functions = {}
    for name in precisions:
        dtype = tf.as_dtype(name)
        a = tf.Variable(tf.cast(tf.random.uniform((size, size), seed=4), dtype))
        b = tf.Variable(tf.cast(tf.random.uniform((size, size), seed=5), dtype))
        functions[name] = tf.function(lambda a=a, b=b: tf.matmul(a, b))
    return functions, 2 * size**3


def mnist_capsnet(precision, routing_iterations=3, jit_compile=False):
    """A compiled `mnist.flags` CapsNet in `precision`; the global policy is restored.

    `precision` is a `--mixed_precision` value ("float32", "bfloat16",
    "float16"). Weights are seeded (0), so every script times the same model.
    """
    import keras

    from capsnet_tf.config import PRECISION_POLICIES, ExperimentConfig
    from capsnet_tf.training import build_model, compile_model

    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(PRECISION_POLICIES[precision])
    try:
        keras.utils.set_random_seed(0)
        config = ExperimentConfig(
            routing_iterations=routing_iterations, jit_compile=jit_compile,
            mixed_precision=precision,
        )
        return compile_model(build_model(config, (28, 28, 1), 10), config)
    finally:
        keras.config.set_dtype_policy(previous)


def random_mnist_batch(size, seed=0):
    """`(inputs, targets)` of `size` random MNIST-shaped images, as `train_on_batch` takes them."""
    import numpy as np

    rng = np.random.default_rng(seed)
    images = tf.constant(rng.random((size, 28, 28, 1)).astype("float32"))
    labels = tf.constant(rng.integers(0, 10, size).astype("int32"))
    return {"image": images, "label": labels}, {"length": labels, "reconstruction": images}
