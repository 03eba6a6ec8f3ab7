"""benchmarks/profile/floor.py and the traffic it counts, against the model and by hand."""

import importlib.util
import os

import numpy as np
import pytest
import tensorflow as tf

from capsnet_tf import benchmarking
from capsnet_tf.kernels import im2col
from tests.conftest import REPO_ROOT

_SPEC = importlib.util.spec_from_file_location(
    "floor", os.path.join(REPO_ROOT, "benchmarks", "profile", "floor.py")
)
floor = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(floor)


def test_traffic_counts_the_models_own_tensors():
    """The patches and votes the count assumes are the sizes the layers make."""
    batch, parameters = 3, 1234
    traffic = benchmarking.step_traffic_bytes(batch, 2, parameters, routing_iterations=3)
    # conv1's output of an MNIST image, gathered the way PrimaryCaps does.
    patches, _, _ = im2col(tf.zeros((batch, 20, 20, 256), tf.bfloat16), 9, 2)
    assert traffic["patches"] == patches.shape.num_elements() * 2
    assert traffic["patch_gradients"] == traffic["patches"]
    model = benchmarking.mnist_capsnet("float32")
    capsules = next(layer for layer in model.layers if hasattr(layer, "routing_iterations"))
    input_capsules, outputs, _, dim = capsules.kernel.shape
    votes = batch * input_capsules * outputs * dim
    # written once, read in 3 forward iterations and 2 of the 3 backward ones
    assert traffic["votes"] == 6 * votes * 2
    assert traffic["adam"] == 7 * 4 * parameters
    more = benchmarking.step_traffic_bytes(batch, 4, parameters, routing_iterations=4)
    assert more["votes"] == 8 * votes * 4 and more["patches"] == 2 * traffic["patches"]


def test_floor_fractions_from_hand_made_times():
    """One round, numbers chosen so that every fraction is computed by hand below."""
    matmul_flops = 2e9
    traffic = {"float32": {"patches": 3e6, "patch_gradients": 3e6, "votes": 2e6, "adam": 2e6}}
    times = {
        "matmul_float32": [0.01],  # 200 GFLOP/s
        "step_float32": [1.0],
        "forward_float32": [0.1], "kernel_gradient_float32": [0.1],
        "input_gradient_float32": [0.2], "all_float32": [0.3],  # beats 0.1 + 0.1 + 0.2
        "convolution_float32": [0.5],
        "read": [0.001],  # 1e6 bytes in 1 ms: 1 GB/s, the fastest
        "scale": [0.004],  # 2e6 bytes moved in 4 ms: 0.5 GB/s
    }
    streams = {"read": 1e6, "scale": 2e6}
    results = floor.analyse(times, ["float32"], 100, traffic, streams, matmul_flops)
    train_flops = 3 * benchmarking.model_flops_per_image() * 100
    rate = 200e9
    f32 = results["float32"]
    assert results["bytes_per_second"]["median"] == pytest.approx(1e9)
    assert f32["fraction_now"]["median"] == pytest.approx(train_flops / 1.0 / rate)
    assert f32["primary_matmuls_ms"]["median"] == pytest.approx(300.0)
    assert f32["traffic_ms"]["median"] == pytest.approx(10.0)  # 1e7 bytes at 1 GB/s
    assert f32["most_attainable_fraction"]["median"] == pytest.approx(train_flops / 0.31 / rate)
    ideal = benchmarking.primary_conv_flops(100) / rate
    assert f32["most_attainable_fraction_ideal"]["median"] == pytest.approx(
        train_flops / (ideal + 0.01) / rate)
    # TensorFlow's convolution writes no patches: only votes and Adam, 4 ms.
    assert f32["convolution_floor_ms"]["median"] == pytest.approx(504.0)
    assert f32["goal_step_ms"]["median"] == pytest.approx(1e3 * train_flops / (0.85 * rate))
    assert f32["ms_beside_primary_matmuls_now"]["median"] == pytest.approx(700.0)
    text = floor.markdown(results, ["float32"], "a CPU", type("A", (), {
        "batch_size": 100, "rounds": 1, "steps": 1})())
    assert "| **at most: fraction of the matmul rate** |" in text and "1.0 GB/s" in text


@pytest.mark.parametrize("amx", [False, True])
def test_primary_matmuls_against_a_float64_reference(amx, monkeypatch):
    """Each timed part returns the first element of each of its products."""
    from capsnet_tf import cpu

    monkeypatch.setattr(cpu, "vector_unit", lambda: "amx" if amx else "avx2")
    rng = np.random.default_rng(3)
    batch, channels, filters = 2, 3, 4
    p = rng.standard_normal((batch * 36, 81 * channels))
    k = rng.standard_normal((9, 9, channels, filters))
    up = rng.standard_normal((batch, 6, 6, filters))
    # bfloat16 takes AMX's transposed product where the CPU is AMX; values alike.
    dtype = tf.bfloat16 if amx else tf.float32
    parts = floor.primary_matmuls(
        tf.Variable(tf.cast(p, dtype)), tf.Variable(tf.cast(k, dtype)), tf.cast(up, dtype))
    if amx:  # the operands as bfloat16 holds them
        p, k, up = (tf.cast(tf.cast(a, tf.bfloat16), tf.float64).numpy() for a in (p, k, up))
    rows = k.reshape(-1, filters)
    # Patch rows run (example, output column, output row): row 0 is position (0, 0).
    up_rows = up.transpose(0, 2, 1, 3).reshape(-1, filters)
    forward = (p @ rows)[0, 0]
    input_gradient = (up_rows @ rows.T)[0, 0]
    kernel_gradient = (p.T @ up_rows)[0, 0]
    tolerance = dict(rtol=0.03, atol=0.3) if amx else dict(rtol=1e-4, atol=1e-3)
    for name, expected in (
        ("forward", forward),
        ("kernel_gradient", kernel_gradient),
        ("input_gradient", input_gradient),
        ("all", forward + kernel_gradient + input_gradient),
    ):
        np.testing.assert_allclose(parts[name]().numpy(), expected, **tolerance, err_msg=name)
    graph = parts["all"].get_concrete_function().graph
    assert len([op for op in graph.get_operations() if op.type == "MatMul"]) == 3


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
def test_convolution_ceiling_in_either_precision(dtype):
    tf.random.set_seed(0)  # the same operands in both calls
    forward_backward, forward = benchmarking.conv_ceilings(1, dtype)
    outputs, (input_grad, kernel_grad) = forward_backward()
    assert outputs.dtype == dtype and input_grad.dtype == dtype
    tf.random.set_seed(0)
    reference, _ = benchmarking.conv_ceilings(1)
    np.testing.assert_allclose(
        tf.cast(forward(), tf.float32).numpy(), reference()[0].numpy(), rtol=0.05, atol=0.05
    )
