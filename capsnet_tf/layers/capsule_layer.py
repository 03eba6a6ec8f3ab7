"""Fully connected capsules with routing-by-agreement (the paper's DigitCaps)."""

import numbers

import keras
import tensorflow as tf
from keras import ops

from capsnet_tf import kernels
from capsnet_tf.ops import squash

__all__ = ["CapsuleLayer", "dynamic_routing"]


def _coupling(logits, leaky):
    """Softmax of the routing logits `[batch, out, in]` over the output capsules.

    With leaky routing a zero "leak" logit joins the softmax and is dropped,
    so an input capsule can send part of its vote nowhere (the official
    release's `_leaky_routing`). Written out rather than `tf.nn.softmax(axis=1)`,
    whose internal transpose XLA cannot differentiate inside the loop.
    """
    largest = tf.reduce_max(logits, axis=1, keepdims=True)
    if leaky:
        largest = tf.maximum(largest, 0.0)
    exponentials = tf.exp(logits - largest)
    total = tf.reduce_sum(exponentials, axis=1, keepdims=True)
    if leaky:
        total = total + tf.exp(-largest)  # the leak's share
    return exponentials / total


def _routing_dtype(compute_dtype):
    """Routing sums over all input capsules and squashes: float32 at least."""
    if keras.backend.standardize_dtype(compute_dtype) in ("float16", "bfloat16"):
        return "float32"
    return keras.backend.standardize_dtype(compute_dtype)


def dynamic_routing(
    votes, bias, iterations, leaky=False, return_couplings=False, jit_compile=False
):
    """Routing-by-agreement (Procedure 1 of the paper), compiled as a graph.

    For every example separately, the logits `b_ij` start at zero; each
    iteration computes the couplings `c_ij = softmax_j(b_ij)`, the output
    capsules `v_j = squash(sum_i c_ij u_hat_j|i + bias_j)` and adds the
    agreement `<u_hat_j|i, v_j>` to `b_ij`. The loop is a `tf.while_loop` with
    a known trip count, compiled in a `tf.function`: no Python runs per
    iteration at run time, and gradients flow through every iteration. The last
    iteration's logit update, which the official release computes and
    discards, is skipped. Called eagerly, the routing runs through a cached
    `tf.function`; inside a graph (`model.fit`, `tf.function`, XLA) it is
    traced inline into the caller's graph, so XLA sees static shapes.

    Internally the votes are laid out `[batch, output, dim, input]`
    (`CapsuleLayer` builds them so; this function transposes its argument
    once): both routing products, the weighted sum over input capsules and
    the agreement, are then batched matrix-vector products along contiguous
    rows of input capsules, with no transpose per iteration (the argument's
    layout would make the agreement a dot product of `output_dim` numbers
    per input capsule; docs/performance.md compares the two).

    With `jit_compile=True` the iterations are unrolled and compiled by XLA
    as one cluster (fused softmax, squash and sums, so the memory-bound
    iterations read the votes fewer times; compiled once per input shape).
    XLA cannot return the couplings, so `return_couplings=True` always takes
    the `tf.while_loop`. Under `capsnet_tf.kernels.use_kernels("straight_line")`
    the iterations are unrolled without XLA, so the graph has no loop.

    Under another Keras backend than TensorFlow (JAX, PyTorch) the routing
    is the same computation written with `keras.ops` (`capsnet_tf.kernels`
    picks the form `"keras_ops"`): the iterations unrolled for a python int
    `iterations`, else a `keras.ops.fori_loop`, compiled as that backend
    compiles the caller; `jit_compile` is not asked there.

    Args:
        votes: `u_hat`, float tensor `[batch, output_capsules, input_capsules,
            output_dim]`: `votes[b, j, i] = u_hat_j|i`.
        bias: `[output_capsules, output_dim]` added to `s_j` in every
            iteration, or `None`.
        iterations: number of routing iterations (python int >= 1 or scalar
            int tensor).
        leaky: use leaky routing (an extra zero logit that absorbs votes).
        return_couplings: also return the couplings of every iteration.
        jit_compile: compile the routing with XLA (needs a python int
            `iterations`; ignored with `return_couplings`; TensorFlow only).

    Returns:
        `v`, `[batch, output_capsules, output_dim]`; with `return_couplings`,
        `(v, couplings)` where couplings is `[batch, iterations,
        input_capsules, output_capsules]`.
    """
    form = kernels.routing_form(jit_compile, return_couplings, iterations)
    if form == "keras_ops":
        votes = ops.transpose(votes, (0, 1, 3, 2))
    else:
        votes = tf.transpose(tf.convert_to_tensor(votes), (0, 1, 3, 2))
    return _route_votes(votes, bias, iterations, leaky, return_couplings, form)


def _route_votes(votes, bias, iterations, leaky, return_couplings, form):
    """`dynamic_routing` of votes laid out `[batch, output, dim, input]`.

    `form` (`kernels.routing_form`): `"loop"`, `"xla"`, `"unrolled"` or
    `"keras_ops"`.
    """
    if form == "keras_ops":
        return _keras_ops_routing(votes, bias, iterations, leaky, return_couplings)
    if form == "unrolled":
        return _unrolled_routing(votes, bias, iterations, leaky)
    if form == "xla":
        if not isinstance(iterations, int) or isinstance(iterations, bool):
            raise ValueError(
                "`jit_compile=True` unrolls the routing loop and needs a python "
                f"int number of iterations. Received: iterations={iterations!r}"
            )
        if bias is not None:  # e.g. a Keras variable, which tf.function cannot take
            bias = tf.convert_to_tensor(bias)
        return _xla_routing(tf.convert_to_tensor(votes), bias, iterations, leaky)
    if tf.executing_eagerly():
        return _compiled_routing(votes, bias, iterations, leaky, return_couplings)
    return _routing_graph(votes, bias, iterations, leaky, return_couplings)


def _routing_graph(votes, bias, iterations, leaky, return_couplings):
    """The body of `dynamic_routing`, for tracing into a graph."""
    # A variable read straight into the loop made the gradient's accumulation
    # fail at large sizes (AlreadyExistsError on an AddN temporary, TF 2.21);
    # an identity gives the loop a plain tensor, as the layer always does.
    votes = tf.identity(votes)
    iterations = tf.convert_to_tensor(iterations, tf.int32)
    logits = _zero_logits(votes)

    def body(step, logits, *history):
        activation, coupling = _routing_outputs(votes, bias, logits, leaky)
        if return_couplings:
            history = (history[0].write(step, coupling),)
        return (step + 1, logits + _agreement(votes, activation), *history)

    history = ()
    if return_couplings:
        history = (tf.TensorArray(votes.dtype, size=iterations),)
    step, logits, *history = tf.while_loop(
        lambda step, *_: step < iterations - 1,
        body,
        (tf.constant(0), logits, *history),
        # A known trip count lets XLA (jit_compile) differentiate the loop.
        maximum_iterations=iterations - 1,
    )
    activation, coupling = _routing_outputs(votes, bias, logits, leaky)
    if not return_couplings:
        return activation
    couplings = history[0].write(step, coupling).stack()  # [iterations, b, j, i]
    return activation, tf.transpose(couplings, (1, 0, 3, 2))


def _zero_logits(votes):
    """The first iteration's logits `[batch, out, in]` for votes `[batch, out, dim, in]`."""
    shape = tf.shape(votes)
    return tf.zeros(tf.stack([shape[0], shape[1], shape[3]]), dtype=votes.dtype)


def _routing_outputs(votes, bias, logits, leaky):
    """`(v_j, c_ij)` for the current logits: one routing iteration's outputs."""
    coupling = _coupling(logits, leaky)
    # s_j = sum_i c_ij u_hat_j|i: [b, j, e, i] @ [b, j, i, 1] -> [b, j, e]
    # (expand_dims/squeeze, not [..., None]: TFLite lacks new-axis slices)
    preactivation = tf.squeeze(tf.matmul(votes, tf.expand_dims(coupling, -1)), -1)
    if bias is not None:
        preactivation = preactivation + bias
    return squash(preactivation, axis=-1), coupling


def _agreement(votes, activation):
    """`<u_hat_j|i, v_j>`: [b, j, 1, e] @ [b, j, e, i] -> [b, j, i]."""
    return tf.squeeze(tf.matmul(tf.expand_dims(activation, 2), votes), 2)


def _unrolled_routing(votes, bias, iterations, leaky):
    """`dynamic_routing` with the iterations unrolled, for XLA to fuse.

    The same computation as `_routing_graph` (without couplings), written as
    straight-line code because a `tf.while_loop`'s gradient accumulators
    cannot leave an XLA cluster that is nested in a TensorFlow graph.
    """
    logits = _zero_logits(votes)
    for _ in range(iterations - 1):
        activation, _ = _routing_outputs(votes, bias, logits, leaky)
        logits = logits + _agreement(votes, activation)
    return _routing_outputs(votes, bias, logits, leaky)[0]


def _keras_ops_routing(votes, bias, iterations, leaky, return_couplings):
    """`_routing_graph` written with `keras.ops` alone: the form of every other backend.

    The same computation, term for term (`_coupling`, `_routing_outputs`,
    `_agreement`), for JAX and PyTorch, which compile it as they compile the
    caller (`jax.jit` in `model.fit`). A python int number of iterations is
    unrolled, keeping each iteration's couplings when asked; a tensor one
    runs in a `keras.ops.fori_loop`, which cannot return couplings of an
    unknown count (and which JAX differentiates only with a trip count known
    when traced).
    """

    def outputs(logits):
        largest = ops.max(logits, axis=1, keepdims=True)
        if leaky:
            largest = ops.maximum(largest, 0.0)
        exponentials = ops.exp(logits - largest)
        total = ops.sum(exponentials, axis=1, keepdims=True)
        if leaky:
            total = total + ops.exp(-largest)
        coupling = exponentials / total
        # s_j = sum_i c_ij u_hat_j|i: [b, j, e, i] @ [b, j, i, 1] -> [b, j, e]
        preactivation = ops.squeeze(ops.matmul(votes, ops.expand_dims(coupling, -1)), -1)
        if bias is not None:
            preactivation = preactivation + bias
        return squash(preactivation, axis=-1), coupling

    def agreement(activation):
        # <u_hat_j|i, v_j>: [b, j, 1, e] @ [b, j, e, i] -> [b, j, i]
        return ops.squeeze(ops.matmul(ops.expand_dims(activation, 2), votes), 2)

    logits = ops.zeros_like(votes[:, :, 0, :])
    if isinstance(iterations, int) and not isinstance(iterations, bool):
        history = []
        for _ in range(iterations - 1):
            activation, coupling = outputs(logits)
            history.append(coupling)
            logits = logits + agreement(activation)
        activation, coupling = outputs(logits)
        if not return_couplings:
            return activation
        # [b, iterations, j, i] -> [b, iterations, i, j], as `_routing_graph`
        return activation, ops.transpose(ops.stack([*history, coupling], 1), (0, 1, 3, 2))
    if return_couplings:
        raise ValueError(
            "Returning the couplings under this Keras backend needs a python int "
            f"number of iterations. Received: iterations={iterations!r}"
        )
    logits = ops.fori_loop(
        0, iterations - 1, lambda _, logits: logits + agreement(outputs(logits)[0]), logits
    )
    return outputs(logits)[0]


# One trace per (iterations, leaky, return_couplings) and dtype; any batch size.
_compiled_routing = tf.function(_routing_graph, reduce_retracing=True, autograph=False)
# XLA-compiled once per input shape; used for training calls by default,
# where the batch size rarely changes.
_xla_routing = tf.function(_unrolled_routing, jit_compile=True, autograph=False)


@keras.saving.register_keras_serializable(package="capsnet_tf")
class CapsuleLayer(keras.layers.Layer):
    """A fully connected capsule layer with dynamic routing.

    Every input capsule `u_i` predicts every output capsule through its own
    matrix, `u_hat_j|i = u_i @ kernel[i, j]`; routing-by-agreement
    (`dynamic_routing`) then decides how strongly each prediction counts:
    `v_j = squash(sum_i c_ij u_hat_j|i + bias_j)`. The routing logits start at
    zero for every example and are never shared across the batch.

    Args:
        num_capsules: number of output capsules (10 for MNIST's DigitCaps).
        capsule_dim: dimension of each output capsule (16).
        routing_iterations: routing iterations, at least 1 (paper: 3).
        leaky_routing: add a zero "leak" logit to the routing softmax (the
            official release's CIFAR-10 setting).
        use_bias: add a learned bias to `s_j` before the squash in every
            iteration, as the official release does.
        kernel_initializer: initializer of the
            `[input_capsules, num_capsules, input_dim, capsule_dim]` kernel;
            default truncated normal with standard deviation 0.1 (official).
        bias_initializer: initializer of the `[num_capsules, capsule_dim]`
            bias.
        vote_scale: positive factor on every vote, `u_hat_j|i = vote_scale
            * u_i @ kernel[i, j]` (default 1: the paper's layer). `s_j` sums
            the votes of all input capsules, so one optimizer step, which
            moves every kernel entry by about the learning rate, moves `s_j`
            by an amount that grows with their number; with thousands of
            input capsules the first steps push every `s_j` far out on the
            squash's flat tail (all lengths near 1), where the margin loss
            has almost no gradient. A factor below 1 makes that step
            smaller while the kernel keeps its initial scale (as the
            "equalized learning rate" of Karras et al., 2018, does).
            `CapsNet(vote_scaling="capsule_count")` sets it from the counts.
        jit_compile: when the routing is compiled with XLA (see
            `dynamic_routing`): `"training"` (default) in training calls
            only, so inference and exported models keep one graph for every
            batch size; `True` always; `False` never.
        inference_chunk_size: where `capsnet_tf.kernels` routes inference
            calls in chunks (CPUs), at most this many examples a chunk;
            `None` routes the whole batch at once. Results do not depend on
            it.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: capsules `[batch, input_capsules, input_dim]`.
        training: python bool or `None`; training calls use XLA routing
            when `jit_compile="training"`.
        return_couplings: python bool; also return the coupling coefficients
            of every routing iteration.

    Returns:
        Output capsules `[batch, num_capsules, capsule_dim]`, or with
        `return_couplings=True` a tuple of those and the couplings
        `[batch, routing_iterations, input_capsules, num_capsules]`.

    Input shape:
        `(batch, input_capsules, input_dim)`, both last dimensions known.

    Output shape:
        `(batch, num_capsules, capsule_dim)`.

    Example:

    >>> import numpy as np
    >>> layer = CapsuleLayer(num_capsules=10, capsule_dim=16)
    >>> tuple(layer(np.ones((4, 1152, 8), "float32")).shape)
    (4, 10, 16)

    Reference:
        Sabour et al., 2017, arXiv:1710.09829, section 2 (Procedure 1).
    """

    def __init__(
        self,
        num_capsules,
        capsule_dim,
        routing_iterations=3,
        leaky_routing=False,
        use_bias=True,
        kernel_initializer=None,
        bias_initializer="zeros",
        vote_scale=1.0,
        jit_compile="training",
        inference_chunk_size=16,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if (
            isinstance(vote_scale, bool)
            or not isinstance(vote_scale, numbers.Real)
            or not vote_scale > 0
        ):
            raise ValueError(
                f"`vote_scale` must be a positive number. Received: vote_scale={vote_scale!r}"
            )
        if jit_compile not in (True, False, "training"):
            raise ValueError(
                "`jit_compile` must be True, False or 'training'. "
                f"Received: jit_compile={jit_compile!r}"
            )
        for name, value in (
            ("num_capsules", num_capsules),
            ("capsule_dim", capsule_dim),
            ("routing_iterations", routing_iterations),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(
                    f"`{name}` must be a positive integer. Received: {name}={value!r}"
                )
        if kernel_initializer is None:
            kernel_initializer = keras.initializers.TruncatedNormal(stddev=0.1)
        self.num_capsules = num_capsules
        self.capsule_dim = capsule_dim
        self.routing_iterations = routing_iterations
        self.leaky_routing = bool(leaky_routing)
        self.use_bias = bool(use_bias)
        self.vote_scale = float(vote_scale)
        self.jit_compile = jit_compile
        if inference_chunk_size is not None and (
            not isinstance(inference_chunk_size, int)
            or isinstance(inference_chunk_size, bool)
            or inference_chunk_size < 1
        ):
            raise ValueError(
                "`inference_chunk_size` must be a positive integer or None. "
                f"Received: inference_chunk_size={inference_chunk_size!r}"
            )
        self.inference_chunk_size = inference_chunk_size
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.input_spec = keras.layers.InputSpec(ndim=3)

    def build(self, input_shape):
        input_capsules, input_dim = input_shape[-2], input_shape[-1]
        if input_capsules is None or input_dim is None:
            raise ValueError(
                "CapsuleLayer needs the number and dimension of its input "
                f"capsules to be known. Received: input_shape={input_shape}"
            )
        self.kernel = self.add_weight(
            name="kernel",
            shape=(input_capsules, self.num_capsules, input_dim, self.capsule_dim),
            initializer=self.kernel_initializer,
        )
        if self.use_bias:
            self.bias = self.add_weight(
                name="bias",
                shape=(self.num_capsules, self.capsule_dim),
                initializer=self.bias_initializer,
            )
        else:
            self.bias = None
        self.input_spec = keras.layers.InputSpec(
            ndim=3, axes={-2: input_capsules, -1: input_dim}
        )

    def call(self, inputs, training=None, return_couplings=False):
        plan = kernels.routing_plan(
            training=bool(training),
            jit_compile=self.jit_compile is True
            or (self.jit_compile == "training" and bool(training)),
            return_couplings=return_couplings,
            iterations=self.routing_iterations,
            chunk_size=self.inference_chunk_size,
        )
        # Routing is per example: the plan may route the batch in pieces, each
        # computing its own votes (`capsnet_tf.kernels`); the values are the same.
        return kernels.route_batch(
            lambda part: self._route(part, return_couplings, plan.form),
            inputs,
            plan,
            (self.num_capsules, self.capsule_dim),
        )

    def _route(self, inputs, return_couplings, form):
        """Votes and routing for a batch of input capsules (`form`: see `_route_votes`)."""
        if form == "keras_ops":
            return self._route_with_keras_ops(inputs, return_couplings)
        kernel = ops.cast(self.kernel, inputs.dtype)
        if self.vote_scale != 1.0:
            kernel = kernel * ops.cast(self.vote_scale, kernel.dtype)
        input_capsules, _, input_dim, _ = self.kernel.shape
        # votes[b, j, :, i] = u[b, i] @ kernel[i, j]: a batched matmul over i
        # that never tiles the kernel per example, laid out for routing.
        # This is what tf.einsum("bid,ijde->bjei") computes (bit for bit in
        # float32, values and gradients), spelt out as one BatchMatMul
        # [i, b, d] @ [i, d, j * e] between transposes, which TensorFlow runs
        # as one GEMM per input capsule instead of einsum's generic
        # contraction (the benchmark's `scaling` section times the layer).
        votes = tf.matmul(
            tf.transpose(inputs, (1, 0, 2)),
            tf.reshape(
                tf.transpose(kernel, (0, 2, 1, 3)),
                (input_capsules, input_dim, self.num_capsules * self.capsule_dim),
            ),
        )  # [i, b, j * e]
        votes = tf.transpose(
            tf.reshape(votes, (input_capsules, -1, self.num_capsules, self.capsule_dim)),
            (1, 2, 3, 0),
        )  # [b, j, e, i], the layout `_route_votes` takes
        # Routing sums over all input capsules and squashes: float32 at least.
        votes = tf.cast(votes, _routing_dtype(self.compute_dtype))
        bias = None if self.bias is None else tf.cast(self.bias, votes.dtype)
        result = _route_votes(
            votes, bias, self.routing_iterations, self.leaky_routing, return_couplings, form
        )
        if return_couplings:
            activation, couplings = result
            return ops.cast(activation, inputs.dtype), couplings
        return ops.cast(result, inputs.dtype)

    def _route_with_keras_ops(self, inputs, return_couplings):
        """`_route` with `keras.ops` alone (JAX, PyTorch): the same votes and routing."""
        kernel = ops.cast(self.kernel, inputs.dtype)
        if self.vote_scale != 1.0:
            kernel = kernel * ops.cast(self.vote_scale, kernel.dtype)
        votes = ops.einsum("bid,ijde->bjei", inputs, kernel)  # [b, j, e, i]
        votes = ops.cast(votes, _routing_dtype(self.compute_dtype))
        bias = None if self.bias is None else ops.cast(self.bias, votes.dtype)
        result = _keras_ops_routing(
            votes, bias, self.routing_iterations, self.leaky_routing, return_couplings
        )
        if return_couplings:
            activation, couplings = result
            return ops.cast(activation, inputs.dtype), couplings
        return ops.cast(result, inputs.dtype)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.num_capsules, self.capsule_dim)

    def compute_output_spec(self, inputs, training=None, return_couplings=False):
        """Symbolic outputs from the hand-written shapes (no tracing of routing)."""
        output = keras.KerasTensor(
            self.compute_output_shape(inputs.shape), dtype=self.compute_dtype
        )
        if not return_couplings:
            return output
        couplings_shape = (
            inputs.shape[0],
            self.routing_iterations,
            inputs.shape[1],
            self.num_capsules,
        )
        return output, keras.KerasTensor(
            couplings_shape, dtype=_routing_dtype(self.compute_dtype)
        )

    def get_config(self):
        return {
            **super().get_config(),
            "num_capsules": self.num_capsules,
            "capsule_dim": self.capsule_dim,
            "routing_iterations": self.routing_iterations,
            "leaky_routing": self.leaky_routing,
            "use_bias": self.use_bias,
            "vote_scale": self.vote_scale,
            "jit_compile": self.jit_compile,
            "inference_chunk_size": self.inference_chunk_size,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
        }
