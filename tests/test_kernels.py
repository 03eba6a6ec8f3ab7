"""capsnet_tf.kernels: every form against a float64 reference, and the one rule that picks them."""

import ast
import os
import pathlib

import numpy as np
import pytest
import tensorflow as tf

from capsnet_tf import CapsuleLayer, PrimaryCapsule, cpu, kernels
from capsnet_tf.layers import capsule_layer
from tests.conftest import REPO_ROOT

IM2COL_FORMS = ("im2col", "im2col_transposed", "im2col_backprop_input")


def conv_reference(x, w, upstream, strides):
    """`conv2d(x, w, strides, "VALID")` and its input and kernel gradients, NumPy float64."""
    kernel_size = w.shape[0]
    out_h, out_w = upstream.shape[1:3]
    outputs = np.zeros(upstream.shape)
    input_grad, kernel_grad = np.zeros_like(x), np.zeros_like(w)
    for i in range(out_h):
        for j in range(out_w):
            rows = slice(strides * i, strides * i + kernel_size)
            cols = slice(strides * j, strides * j + kernel_size)
            outputs[:, i, j] = np.einsum("bpqc,pqcf->bf", x[:, rows, cols, :], w)
            input_grad[:, rows, cols, :] += np.einsum("bf,pqcf->bpqc", upstream[:, i, j], w)
            kernel_grad += np.einsum("bpqc,bf->pqcf", x[:, rows, cols, :], upstream[:, i, j])
    return outputs, input_grad, kernel_grad


@pytest.mark.parametrize(
    "size, kernel_size, strides",
    [(12, 5, 2), (10, 4, 2), (20, 9, 2), (9, 3, 1), (11, 3, 3), ((13, 10), 5, 2)],
)
@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
@pytest.mark.parametrize("form", [*IM2COL_FORMS, "dispatch"])
def test_convolution_forms_match_float64_values_and_gradients(size, kernel_size, strides, dtype,
                                                              form):
    """Every im2col form, and the one `conv2d` picks on this CPU, on any CPU.

    The reference is the definition in NumPy float64 (the backprop_input
    form's input gradient is TensorFlow's own backward-data convolution, so
    `tf.nn.conv2d`'s gradient would not be an independent reference).
    """
    height, width = size if isinstance(size, tuple) else (size, size)
    rng = np.random.default_rng(0)
    x64 = rng.normal(size=(2, height, width, 3))
    w64 = rng.normal(size=(kernel_size, kernel_size, 3, 4))
    out_h = (height - kernel_size) // strides + 1
    out_w = (width - kernel_size) // strides + 1
    upstream = rng.normal(size=(2, out_h, out_w, 4))
    inputs, kernel = tf.cast(x64, dtype), tf.cast(w64, dtype)
    with tf.GradientTape() as tape:
        tape.watch([inputs, kernel])
        if form == "dispatch":
            outputs = kernels.conv2d(inputs, kernel, strides, "valid")
        else:
            outputs = kernels.conv_as_matmul(inputs, kernel, strides, form)
        loss = tf.reduce_sum(tf.cast(outputs, tf.float64) * upstream)
    got = [outputs, *tape.gradient(loss, [inputs, kernel])]
    want = conv_reference(x64, w64, upstream, strides)
    # bfloat16 keeps 8 significant bits: errors of a few 1e-3 of the scale.
    tolerance = 1e-12 if dtype == "float64" else 2e-2
    for g, w in zip(got, want):
        assert tuple(g.shape) == w.shape
        np.testing.assert_allclose(tf.cast(g, tf.float64).numpy(), w,
                                   atol=tolerance * np.abs(w).max())


def test_unknown_im2col_form_is_refused():
    with pytest.raises(ValueError, match="Received: form='fast'"):
        kernels.conv_as_matmul(tf.zeros((1, 7, 7, 2)), tf.zeros((3, 3, 2, 4)), 2, "fast")


@pytest.mark.parametrize(
    "kernel_set, device, padding, static, dtype, unit, training, form",
    [
        ("this_machine", "cpu", "valid", True, "float32", "amx", True, "im2col"),
        ("this_machine", "cpu", "valid", True, "float32", "amx", False, "im2col"),
        ("this_machine", "cpu", "valid", True, "float32", "avx512_bf16", True, "im2col"),
        ("this_machine", "cpu", "valid", True, "float32", "avx512", False, "im2col"),
        ("this_machine", "cpu", "valid", True, "float32", "avx2", True, "im2col"),
        ("this_machine", "cpu", "valid", True, "float32", "avx2", False, "conv"),
        ("this_machine", "cpu", "valid", True, "float32", "other", False, "im2col"),
        ("this_machine", "cpu", "valid", True, "bfloat16", "amx", True, "im2col_transposed"),
        ("this_machine", "cpu", "valid", True, "bfloat16", "amx", False, "im2col_transposed"),
        ("this_machine", "cpu", "valid", True, "bfloat16", "avx512_bf16", True,
         "im2col_backprop_input"),
        ("this_machine", "cpu", "valid", True, "bfloat16", "avx2", True, "im2col"),
        ("this_machine", "cpu", "valid", True, "bfloat16", "avx2", False, "im2col"),
        ("this_machine", "cpu", "same", True, "float32", "avx2", True, "conv"),
        ("this_machine", "cpu", "valid", False, "bfloat16", "amx", True, "conv"),
        ("this_machine", "accelerator", "valid", True, "bfloat16", "amx", True, "conv"),
        ("portable", "cpu", "valid", True, "bfloat16", "amx", True, "conv"),
        ("straight_line", "cpu", "valid", True, "float32", "avx2", True, "conv"),
    ],
)
def test_convolution_form_follows_the_rule(monkeypatch, kernel_set, device, padding, static,
                                           dtype, unit, training, form):
    monkeypatch.setattr(cpu, "vector_unit", lambda: unit)
    monkeypatch.setattr(cpu, "accelerated", lambda: device == "accelerator")
    with kernels.use_kernels(kernel_set):
        assert kernels.convolution_form(dtype, padding, static, training=training) == form
    assert kernels.convolution_form(
        dtype, padding, static, training=training, kernels=kernel_set
    ) == form


def primary_graph_ops(kernel_set, padding="valid", dtype=tf.float32, training=True):
    """The op types a traced PrimaryCapsule call holds under `kernel_set`."""
    layer = PrimaryCapsule(2, 4, kernel_size=3, strides=2, padding=padding)
    layer.build((None, 9, 9, 3))
    function = tf.function(lambda x: layer(x, training=training))
    with kernels.use_kernels(kernel_set):
        graph = function.get_concrete_function(tf.TensorSpec((None, 9, 9, 3), dtype)).graph
    return {op.type for op in graph.get_operations()}


def test_layer_traces_the_form_of_the_rule():
    """On a CPU a valid convolution trains as a gather and a matmul; portable, a Conv2D."""
    assert kernels.device_kind() == "cpu"  # the test machine
    here = primary_graph_ops("this_machine")
    assert "GatherV2" in here and "Conv2D" not in here
    for ops in (primary_graph_ops("portable"), primary_graph_ops("this_machine", "same")):
        assert "Conv2D" in ops and "GatherV2" not in ops


@pytest.mark.parametrize("unit, inference_op", [("avx2", "Conv2D"), ("amx", "GatherV2")])
def test_layer_infers_in_the_form_of_the_rule(monkeypatch, unit, inference_op):
    """The layer's `training` reaches the rule: float32 inference on AVX2 is a Conv2D."""
    monkeypatch.setattr(cpu, "vector_unit", lambda: unit)
    assert "GatherV2" in primary_graph_ops("this_machine", training=True)
    assert inference_op in primary_graph_ops("this_machine", training=False)
    assert inference_op in primary_graph_ops("this_machine", training=None)


@pytest.mark.parametrize("unit, hand_written", [("avx512_bf16", True), ("amx", False)])
def test_bfloat16_input_gradient_form_is_taken_by_the_layer(monkeypatch, unit, hand_written):
    """The rule's answer reaches the trace: Conv2DBackpropInput only for AVX-512 BF16."""
    monkeypatch.setattr(cpu, "vector_unit", lambda: unit)
    layer = PrimaryCapsule(2, 4, kernel_size=3, strides=2, dtype="bfloat16")
    layer.build((None, 9, 9, 3))

    @tf.function
    def gradient(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(layer(x))
        return tape.gradient(loss, x)

    graph = gradient.get_concrete_function(tf.TensorSpec((2, 9, 9, 3), tf.bfloat16)).graph
    types = {op.type for op in graph.get_operations()}
    for function in graph._functions.values():
        types |= {node.op for node in function.definition.node_def}
    assert ("Conv2DBackpropInput" in types) == hand_written


def make_capsule_layer(seed=0, **kwargs):
    rng = np.random.default_rng(seed)
    layer = CapsuleLayer(3, 5, routing_iterations=3, dtype="float64", **kwargs)
    layer.build((None, 6, 4))
    layer.set_weights([rng.normal(scale=0.5, size=(6, 3, 4, 5)), rng.normal(size=(3, 5))])
    return layer


@pytest.mark.parametrize(
    "kernel_set, device, call, pieces",
    [
        ("this_machine", "cpu", dict(training=True, jit_compile=True), "slices"),
        ("this_machine", "cpu", dict(training=False, jit_compile=False), "chunks"),
        ("this_machine", "cpu", dict(training=True, jit_compile=False), "whole"),
        ("this_machine", "cpu", dict(training=False, jit_compile=False, chunk_size=None),
         "whole"),
        ("this_machine", "cpu", dict(training=False, jit_compile=False,
                                     return_couplings=True), "whole"),
        ("this_machine", "accelerator", dict(training=True, jit_compile=True), "whole"),
        ("this_machine", "accelerator", dict(training=False, jit_compile=False), "whole"),
        ("portable", "cpu", dict(training=True, jit_compile=True), "whole"),
        ("portable", "cpu", dict(training=False, jit_compile=False), "whole"),
        ("straight_line", "cpu", dict(training=False, jit_compile=False), "whole"),
    ],
)
def test_routing_plan_follows_the_rule(monkeypatch, kernel_set, device, call, pieces):
    monkeypatch.setattr(cpu, "accelerated", lambda: device == "accelerator")
    arguments = {"return_couplings": False, "iterations": 3, "chunk_size": 16, **call}
    with kernels.use_kernels(kernel_set):
        plan = kernels.routing_plan(**arguments)
    assert plan.pieces == pieces
    expected_form = (
        "loop" if arguments["return_couplings"]
        else "unrolled" if kernel_set == "straight_line"
        else "xla" if arguments["jit_compile"] else "loop"
    )
    assert plan.form == expected_form


def test_routing_slices_are_two_per_core_at_most_16(monkeypatch):
    for cores, parts in ((1, 2), (2, 4), (8, 16), (64, 16)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda _, n=cores: set(range(n)))
        assert kernels.routing_slices() == parts


@pytest.mark.parametrize("batch", [1, 3, 8, 9])
def test_xla_routing_in_slices_of_the_batch_equals_one_call(batch, monkeypatch):
    """Slices of any batch, smaller than the parts or not, unknown when traced."""
    layer = make_capsule_layer()
    inputs = tf.constant(np.random.default_rng(batch).normal(size=(batch, 6, 4)))
    upstream = tf.constant(np.random.default_rng(batch + 1).normal(size=(batch, 3, 5)))
    calls = []
    xla_routing = capsule_layer._xla_routing
    monkeypatch.setattr(
        capsule_layer, "_xla_routing", lambda *args: calls.append(1) or xla_routing(*args)
    )

    def routed(parts):
        monkeypatch.setattr(kernels, "routing_slices", lambda: parts)

        @tf.function(input_signature=[tf.TensorSpec((None, 6, 4), tf.float64)])
        def run(inputs):
            with tf.GradientTape() as tape:
                tape.watch(inputs)
                outputs = layer(inputs, training=True)
            return outputs, tape.gradient(
                outputs, [inputs, layer.kernel], output_gradients=upstream
            )

        return run(inputs)

    outputs, (input_gradient, kernel_gradient) = routed(1)
    assert len(calls) == 1
    assert np.abs(kernel_gradient.numpy()).max() > 1e-3
    for parts in (2, 4):
        got, (got_input_gradient, got_kernel_gradient) = routed(parts)
        np.testing.assert_allclose(got.numpy(), outputs.numpy(), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(
            got_input_gradient.numpy(), input_gradient.numpy(), rtol=1e-12, atol=1e-14
        )
        np.testing.assert_allclose(
            got_kernel_gradient.numpy(), kernel_gradient.numpy(), rtol=1e-10, atol=1e-13
        )
    assert len(calls) == 1 + 2 + 4  # one XLA call a slice


@pytest.mark.parametrize("chunk_size", [1, 7, 16])
def test_inference_in_chunks_matches_the_whole_batch(chunk_size, monkeypatch):
    calls = []
    in_chunks = kernels._in_chunks
    monkeypatch.setattr(kernels, "_in_chunks", lambda *args: calls.append(1) or in_chunks(*args))
    whole = make_capsule_layer(seed=3, inference_chunk_size=None)
    chunked = CapsuleLayer.from_config({**whole.get_config(), "inference_chunk_size": chunk_size})
    chunked.build((None, 6, 4))
    chunked.set_weights(whole.get_weights())
    inputs = np.random.default_rng(3).normal(size=(17, 6, 4))
    graph = tf.function(lambda x: chunked(x, training=False), reduce_retracing=True)
    for size in (1, 6, 7, 16, 17):  # shorter, equal and longer than a chunk
        expected = whole(inputs[:size]).numpy()
        np.testing.assert_allclose(chunked(inputs[:size]).numpy(), expected, rtol=1e-12)
        np.testing.assert_allclose(graph(inputs[:size]).numpy(), expected, rtol=1e-12)
    # Gradients flow through the chunk loop as through the whole batch.
    x = tf.constant(inputs[:9])
    grads = []
    for layer in (whole, chunked):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(layer(x, training=False) ** 2)
        grads.append(tape.gradient(loss, [x, layer.kernel]))
    for a, b in zip(*grads):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-10, atol=1e-12)
    assert len(calls) > 0
    # Not in training calls, nor where XLA compiles the caller (shapes must be static).
    calls.clear()
    chunked(inputs, training=True)
    xla = tf.function(lambda x: chunked(x, training=False), jit_compile=True)
    np.testing.assert_allclose(xla(inputs).numpy(), whole(inputs).numpy(), rtol=1e-10)
    assert not calls
    with pytest.raises(ValueError, match="inference_chunk_size"):
        CapsuleLayer(3, 5, inference_chunk_size=0)


def graph_op_types(function):
    types = {op.type for op in function.graph.get_operations()}
    for inner in function.graph._functions.values():
        types |= {node.op for node in inner.definition.node_def}
    return types


@pytest.mark.parametrize("leaky", [False, True])
def test_straight_line_routing_traces_no_loop_and_gives_the_loops_values(leaky):
    """Under `straight_line_routing` the inference graph has no While op, same outputs."""
    layer = CapsuleLayer(4, 6, routing_iterations=3, leaky_routing=leaky, inference_chunk_size=2)
    inputs = np.random.default_rng(3).normal(size=(5, 9, 8)).astype("float32")
    spec = tf.TensorSpec((None, 9, 8), tf.float32)
    looped = tf.function(lambda x: layer(x)).get_concrete_function(spec)
    with kernels.straight_line_routing():
        straight = tf.function(lambda x: layer(x)).get_concrete_function(spec)
    with kernels.use_kernels("portable"):
        portable = tf.function(lambda x: layer(x)).get_concrete_function(spec)
    assert {"While", "StatelessWhile"} & graph_op_types(looped)  # chunks and routing loop
    assert not {"While", "StatelessWhile"} & graph_op_types(straight)
    np.testing.assert_allclose(straight(inputs), looped(inputs), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(portable(inputs), looped(inputs), rtol=1e-5, atol=1e-6)
    assert kernels.kernels_in_use() == "this_machine"  # the blocks leave no trace
    with pytest.raises(ValueError, match="Received: kernels='fast'"):
        with kernels.use_kernels("fast"):
            pass


@pytest.mark.parametrize("kernel_set", ["portable", "straight_line"])
def test_portable_routing_forms_match_float64_reference_and_the_loops_gradients(kernel_set):
    from tests.test_capsule_layer import make_layer, reference_routing

    layer, inputs, kernel, bias = make_layer(3, leaky=True)
    expected, _ = reference_routing(inputs, kernel, bias, 3, True)
    x = tf.constant(inputs)

    def traced(kernel_set):
        with kernels.use_kernels(kernel_set):
            function = tf.function(lambda x: layer(x, training=False)).get_concrete_function(
                tf.TensorSpec((None, 6, 4), tf.float64))
        with tf.GradientTape() as tape:
            tape.watch(x)
            outputs = function(x)
            loss = tf.reduce_sum(outputs * tf.sin(outputs))
        return outputs, tape.gradient(loss, [x, layer.kernel])

    outputs, gradients = traced(kernel_set)
    np.testing.assert_allclose(outputs.numpy(), expected, rtol=1e-6, atol=1e-8)
    _, loop_gradients = traced("this_machine")
    for got, want in zip(gradients, loop_gradients):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-10, atol=1e-12)


def rule_lines(rule):
    """The Markdown table rows of a rule: its columns, then the form."""
    return [f"| {' | '.join(pattern)} | {form} |" for pattern, form in rule]


@pytest.mark.parametrize("rule", ["CONVOLUTION_RULE", "ROUTING_RULE"])
def test_docs_state_the_rule_as_the_code_has_it(rule):
    """docs/performance.md's tables hold the rows of the rules, in order (then the why)."""
    text = pathlib.Path(REPO_ROOT, "docs", "performance.md").read_text()
    lines = text.splitlines()
    rows = rule_lines(getattr(kernels, rule))
    start = next((n for n, line in enumerate(lines) if line.startswith(rows[0])), None)
    assert start is not None, f"docs/performance.md has no row {rows[0]}"
    for offset, row in enumerate(rows):
        assert lines[start + offset].startswith(row), (lines[start + offset], row)
    assert not lines[start + len(rows)].startswith("|")  # no row the code lacks


def test_no_layer_asks_what_machine_it_runs_on():
    """Layers call `capsnet_tf.kernels`; CPU flags and device lists are asked only there."""
    layers = pathlib.Path(REPO_ROOT, "capsnet_tf", "layers")
    for path in sorted(layers.glob("*.py")):
        tree = ast.parse(path.read_text())
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported |= {f"{node.module}.{alias.name}" for alias in node.names}
            elif isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
        assert "capsnet_tf.cpu" not in imported, path
        source = path.read_text()
        for needle in ("list_logical_devices", "list_physical_devices", "/proc/cpuinfo",
                       "bfloat16_unit", "vector_unit", "accelerated("):
            assert needle not in source, (path, needle)
