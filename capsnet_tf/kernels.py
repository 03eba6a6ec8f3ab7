"""The machine-specific forms of the layers' computations, and the one rule that picks them.

Two computations of CapsNet have several forms, equal in value, each the
fastest on some machine:

- PrimaryCaps' convolution (`conv2d`): `keras.ops.conv`, or on CPUs im2col
  and one matmul, whose product and input gradient each take the form the
  CPU's bfloat16 hardware runs fastest (float32 inference on AVX2-only CPUs
  keeps the convolution);
- routing over a batch (`route_batch`): the whole batch at once, or on CPUs
  slices of it side by side (XLA's CPU code runs the routing on one thread)
  or, in inference, chunks one after another (each chunk's votes stay in
  the caches through all routing iterations).

The layers call `conv2d` and `route_batch` and never ask what they run on:
what depends on the machine, and on the Keras backend, is decided here, by
two tables,
`CONVOLUTION_RULE` and `ROUTING_RULE`, which docs/performance.md repeats
with the measurements behind each row. A table is read top down: the first
row whose every column matches gives the form; `"*"` matches anything.

The forms are chosen when a layer is traced, so a saved trace keeps them.
`use_kernels` sets which forms tracing may use, per thread:

- `"this_machine"` (the default): the fastest forms measured for the device
  and CPU this process runs on;
- `"portable"`: forms that run on every device as a trace made there would:
  the convolution as a convolution, the routing of the whole batch in one
  loop. `capsnet_tf.export` traces these unless asked otherwise;
- `"straight_line"`: portable, with the routing iterations unrolled as well,
  so the graph has no loop (int8 TFLite quantization calibrates every
  tensor of a loop body with one scale shared by all iterations, which the
  routing logits do not survive; `capsnet_tf.deploy.quantize_tflite`).

Most forms are TensorFlow code. Under another Keras backend (JAX, PyTorch:
`keras.backend.backend()`, the first column of both tables) the forms are
written with `keras.ops` alone, which that backend compiles its own way:
the convolution as `keras.ops.conv` on accelerators and as im2col and one
matmul on CPUs (`keras_ops_conv_as_matmul`), the routing of the whole batch
as `"keras_ops"` (`routing_form`). The device is then the one Keras
distributes over (`device_kind`), and the kernel sets, which shape
TensorFlow traces and exports, are not asked.
"""

import collections
import contextlib
import threading

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from capsnet_tf import cpu

__all__ = [
    "ANY",
    "CONVOLUTION_FORMS",
    "CONVOLUTION_RULE",
    "KERNEL_SETS",
    "ROUTING_RULE",
    "RoutingPlan",
    "backend_kind",
    "col2im",
    "conv2d",
    "conv_as_matmul",
    "convolution_form",
    "device_kind",
    "im2col",
    "kernels_in_use",
    "keras_ops_conv_as_matmul",
    "patch_product",
    "route_batch",
    "routing_form",
    "routing_plan",
    "routing_slices",
    "straight_line_routing",
    "use_kernels",
]

KERNEL_SETS = ("this_machine", "portable", "straight_line")
ANY = "*"

# PrimaryCaps' convolution. Columns: the Keras backend (`backend_kind`); the
# kernel set ("straight_line" counts as "portable"); the device
# (`device_kind`); the input ("valid_static": "valid" padding and a height,
# width and channel count known when traced); the compute dtype; the CPU's
# matmul hardware (`cpu.vector_unit()`); the call ("training" or
# "inference").
CONVOLUTION_RULE = (
    (("other", ANY, "accelerator", ANY, ANY, ANY, ANY), "conv"),
    (("other", ANY, "cpu", "valid_static", ANY, ANY, ANY), "im2col_keras_ops"),
    (("other", ANY, ANY, ANY, ANY, ANY, ANY), "conv"),
    (("tensorflow", "portable", ANY, ANY, ANY, ANY, ANY), "conv"),
    (("tensorflow", ANY, "accelerator", ANY, ANY, ANY, ANY), "conv"),
    (("tensorflow", ANY, ANY, "other", ANY, ANY, ANY), "conv"),
    (("tensorflow", ANY, "cpu", "valid_static", "bfloat16", "amx", ANY), "im2col_transposed"),
    (
        ("tensorflow", ANY, "cpu", "valid_static", "bfloat16", "avx512_bf16", ANY),
        "im2col_backprop_input",
    ),
    (("tensorflow", ANY, "cpu", "valid_static", "float32", "avx2", "inference"), "conv"),
    (("tensorflow", ANY, "cpu", "valid_static", ANY, ANY, ANY), "im2col"),
)
CONVOLUTION_FORMS = {
    "conv": "`keras.ops.conv`; autodiff's gradients (cuDNN's, XLA's, oneDNN's convolutions)",
    "im2col": "patches @ kernel; input gradient folded back by two 0/1 matmuls (`col2im`)",
    "im2col_transposed": "as im2col, the product computed as kernel^T @ patches^T",
    "im2col_backprop_input": "as im2col, the input gradient oneDNN's Conv2DBackpropInput",
    "im2col_keras_ops": "patches by `keras.ops.take`, one matmul; autodiff's gradients "
    "(a scatter-add): JAX, PyTorch",
}

# Routing over a batch. Columns: the Keras backend; the kernel set; the
# device; the call ("couplings": the couplings are returned; "inside_xla":
# traced inside an XLA-compiled caller; "xla": the layer compiles its routing
# with XLA; "inference": an inference call with an `inference_chunk_size`;
# "other").
ROUTING_RULE = (
    (("other", ANY, ANY, ANY), "whole"),
    (("tensorflow", ANY, ANY, "couplings"), "whole"),
    (("tensorflow", ANY, ANY, "inside_xla"), "whole"),
    (("tensorflow", "portable", ANY, ANY), "whole"),
    (("tensorflow", ANY, "accelerator", ANY), "whole"),
    (("tensorflow", ANY, "cpu", "xla"), "slices"),
    (("tensorflow", ANY, "cpu", "inference"), "chunks"),
    (("tensorflow", ANY, "cpu", "other"), "whole"),
)

_SETTING = threading.local()


@contextlib.contextmanager
def use_kernels(kernels):
    """Traces inside this block use the kernel set `kernels` (one of `KERNEL_SETS`).

    Per thread; the previous set is restored on leaving. Example:

    >>> with use_kernels("portable"):
    ...     print(kernels_in_use())
    portable
    >>> kernels_in_use()
    'this_machine'
    """
    if kernels not in KERNEL_SETS:
        raise ValueError(f"`kernels` must be one of {KERNEL_SETS}. Received: kernels={kernels!r}")
    previous = kernels_in_use()
    _SETTING.kernels = kernels
    try:
        yield
    finally:
        _SETTING.kernels = previous


def kernels_in_use():
    """The kernel set that tracing uses now (`use_kernels`); `"this_machine"` by default."""
    return getattr(_SETTING, "kernels", "this_machine")


def straight_line_routing():
    """`use_kernels("straight_line")`: routing traced without loops, the batch in one piece."""
    return use_kernels("straight_line")


def backend_kind():
    """`"tensorflow"` under Keras's TensorFlow backend, else `"other"` (JAX, PyTorch).

    Only TensorFlow runs the TensorFlow forms; every other backend gets the
    forms written with `keras.ops` (the `other` rows at the top of each rule).
    """
    return "tensorflow" if keras.backend.backend() == "tensorflow" else "other"


def device_kind():
    """`"accelerator"` where the backend computes on a GPU or TPU, else `"cpu"`.

    TensorFlow: whether it sees a GPU or TPU (`cpu.accelerated()`). JAX:
    the type of the devices Keras distributes over
    (`keras.distribution.list_devices()`, its accelerators where it has
    any). PyTorch, which `keras.distribution` does not serve: whether it has
    CUDA or MPS, where Keras puts its tensors when it does.
    """
    if backend_kind() == "tensorflow":
        return "accelerator" if cpu.accelerated() else "cpu"
    if keras.backend.backend() == "torch":
        import torch

        accelerated = torch.cuda.is_available() or torch.backends.mps.is_available()
        return "accelerator" if accelerated else "cpu"
    devices = keras.distribution.list_devices()
    return "accelerator" if devices and not devices[0].startswith("cpu") else "cpu"


def _first_match(rule, key):
    """The form of the first row of `rule` that `key` matches.

    A column of `key` is a value or a function giving it, called at most
    once and only when a row asks about that column: under JAX the backend
    column decides in the first row, and the device is never asked.
    """
    known = {}

    def column(index):
        if index not in known:
            value = key[index]
            known[index] = value() if callable(value) else value
        return known[index]

    for pattern, form in rule:
        if all(want == ANY or want == column(index) for index, want in enumerate(pattern)):
            return form
    values = tuple(column(index) for index in range(len(key)))
    raise LookupError(f"No row of the rule matches {values}")  # pragma: no cover


def _set_column(kernels):
    return "this_machine" if (kernels or kernels_in_use()) == "this_machine" else "portable"


# === PrimaryCaps' convolution ===


def convolution_form(
    dtype,
    padding="valid",
    static_shape=True,
    *,
    training=True,
    kernels=None,
    device=None,
    backend=None,
):
    """The form `CONVOLUTION_RULE` gives a convolution (a key of `CONVOLUTION_FORMS`).

    Args:
        dtype: the compute dtype.
        padding: `"valid"` or `"same"`.
        static_shape: whether the input's height, width and channels are
            known when traced.
        training: whether the call trains (its gradients are wanted).
        kernels: a kernel set (default: `kernels_in_use()`).
        device: `"cpu"` or `"accelerator"` (default: `device_kind()`).
        backend: `"tensorflow"` or `"other"` (default: `backend_kind()`).
    """
    key = (
        backend or backend_kind(),
        _set_column(kernels),
        device or device_kind,
        "valid_static" if padding == "valid" and static_shape else "other",
        keras.backend.standardize_dtype(dtype),
        cpu.vector_unit,
        "training" if training else "inference",
    )
    return _first_match(CONVOLUTION_RULE, key)


def conv2d(inputs, kernel, strides, padding, training=True):
    """`keras.ops.conv(inputs, kernel, strides, padding)` in the form `convolution_form` picks.

    Args:
        inputs: `[batch, height, width, channels]`.
        kernel: `[k, k, channels, filters]` (a variable or tensor in the
            compute dtype).
        strides: the stride (int).
        padding: `"valid"` or `"same"`.
        training: whether the call trains; an inference call may take a form
            whose gradients are slower (every form's values and gradients
            are the same).
    """
    form = convolution_form(
        inputs.dtype, padding, None not in tuple(inputs.shape[1:]), training=training
    )
    if form == "conv":
        return ops.conv(inputs, kernel, strides=strides, padding=padding)
    if form == "im2col_keras_ops":
        return keras_ops_conv_as_matmul(inputs, kernel, strides)
    # The kernel as a tensor in the compute dtype (an eager read under the
    # mixed policy gives an autocast variable, not a tensor).
    return conv_as_matmul(inputs, tf.convert_to_tensor(kernel), strides, form)


def keras_ops_conv_as_matmul(inputs, kernel, strides):
    """`conv2d(inputs, kernel, strides, "valid")` as im2col and one matmul, in `keras.ops`.

    The form of backends other than TensorFlow on CPUs: XLA's CPU code runs
    PrimaryCaps' strided backward-data convolution about 100 times slower
    than this gather and matmul and their autodiff gradients
    (docs/performance.md, "Issue 46"). The patches are gathered in row-major
    order of the output positions, so the product is NHWC as it comes.

    Args:
        inputs: `[batch, height, width, channels]`, static spatial shape.
        kernel: `[k, k, channels, filters]`.
        strides: the stride (int).
    """
    height, width, channels = inputs.shape[1], inputs.shape[2], inputs.shape[3]
    kernel_size, filters = kernel.shape[0], kernel.shape[3]
    out_h = _valid_length(height, kernel_size, strides)
    out_w = _valid_length(width, kernel_size, strides)
    oy, ox, ky, kx = np.meshgrid(
        np.arange(out_h), np.arange(out_w), np.arange(kernel_size), np.arange(kernel_size),
        indexing="ij",
    )
    indices = ((strides * oy + ky) * width + (strides * ox + kx)).reshape(-1).astype(np.int32)
    flat = ops.reshape(inputs, (-1, height * width, channels))
    patches = ops.reshape(
        ops.take(flat, indices, axis=1), (-1, kernel_size * kernel_size * channels)
    )
    product = ops.matmul(patches, ops.reshape(kernel, (-1, filters)))
    return ops.reshape(product, (-1, out_h, out_w, filters))


def _valid_length(length, kernel_size, strides):
    return (length - kernel_size) // strides + 1


def _patch_indices(height, width, kernel_size, strides):
    """Flat input positions `y * width + x` of every (output position, kernel tap).

    Ordered output column, output row, kernel row, kernel column: the kernel
    taps of one output position line up with the rows of the kernel reshaped
    to `[k * k * channels, filters]`, and the output positions run down the
    columns so that the patches' gradient folds back with one matmul per axis
    (`col2im`).
    """
    out_h = _valid_length(height, kernel_size, strides)
    out_w = _valid_length(width, kernel_size, strides)
    ox, oy, ky, kx = np.meshgrid(
        np.arange(out_w), np.arange(out_h), np.arange(kernel_size), np.arange(kernel_size),
        indexing="ij",
    )
    return ((strides * oy + ky) * width + (strides * ox + kx)).reshape(-1).astype(np.int32)


def _fold_matrix(length, kernel_size, strides):
    """0/1 `[length, out * k]`: entry `(i, o * k + t)` is 1 where `strides * o + t == i`.

    Multiplying patch gradients laid out `(output position, kernel tap)` along
    one axis by it sums every tap back onto the input position it was read
    from: col2im along that axis.
    """
    out = _valid_length(length, kernel_size, strides)
    fold = np.zeros((length, out * kernel_size), np.float32)
    for o in range(out):
        fold[strides * o + np.arange(kernel_size), o * kernel_size + np.arange(kernel_size)] = 1
    return fold


def conv_as_matmul(inputs, kernel, strides, form="im2col"):
    """`conv2d(inputs, kernel, strides, padding="valid")` as im2col and one matmul.

    The patches `[batch * out_w * out_h, k * k * channels]` are gathered with
    one `tf.gather` over the flattened positions and multiplied by the kernel
    `[k * k * channels, filters]`; the kernel's gradient is one matmul of the
    patches (transposed) and the output gradient. `form` is one of the
    im2col forms of `CONVOLUTION_FORMS`: the product as `patches @ kernel`
    or transposed, the input gradient by `col2im` or by oneDNN's backward
    convolution (docs/performance.md says which CPU each suits).

    Args:
        inputs: `[batch, height, width, channels]`, static spatial shape.
        kernel: `[k, k, channels, filters]` tensor.
        strides: the stride (int).
        form: `"im2col"`, `"im2col_transposed"` or `"im2col_backprop_input"`.
    """
    if form == "im2col_backprop_input":
        return _conv_as_matmul_backprop_input(inputs, kernel, strides)
    if form not in ("im2col", "im2col_transposed"):
        raise ValueError(
            '`form` must be "im2col", "im2col_transposed" or "im2col_backprop_input". '
            f"Received: form={form!r}"
        )
    patches, out_h, out_w = im2col(inputs, kernel.shape[0], strides)
    return patch_product(patches, kernel, out_h, out_w, form == "im2col_transposed")


def patch_product(patches, kernel, out_h, out_w, transposed=None):
    """`patches @ kernel` (the kernel as `[k * k * channels, filters]`) in NHWC.

    With `transposed` the product is computed as `kernel^T @ patches^T`, the
    filters as its rows (oneDNN's AMX bfloat16 matmul runs that shape
    faster); either way one transpose puts it in NHWC. `None`: as
    `convolution_form` picks for the patches' dtype.
    """
    if transposed is None:
        transposed = convolution_form(patches.dtype) == "im2col_transposed"
    filters = kernel.shape[3]
    rows = tf.reshape(kernel, (-1, filters))
    if transposed:
        product = tf.matmul(rows, patches, transpose_a=True, transpose_b=True)
        # [filters, batch * out_w * out_h] (the patches' column-major order)
        product = tf.reshape(product, (filters, -1, out_w, out_h))
        return tf.transpose(product, (1, 3, 2, 0))
    return _matmul_outputs(tf.matmul(patches, rows), out_h, out_w)


def im2col(inputs, kernel_size, strides):
    """The patches `[batch * out_w * out_h, k * k * channels]`, out_h, out_w.

    The rows run output column-major (`_patch_indices`); `_matmul_outputs`
    puts a product back in `[batch, out_h, out_w, filters]`. The gradient is
    `col2im`, in place of autodiff's transpose of the gather (a transpose and
    an unsorted segment sum, a serial scatter on CPUs).
    """
    height, width, channels = inputs.shape[1], inputs.shape[2], inputs.shape[3]
    out_h = _valid_length(height, kernel_size, strides)
    out_w = _valid_length(width, kernel_size, strides)
    indices = _patch_indices(height, width, kernel_size, strides)

    @tf.custom_gradient
    def gather_patches(inputs):
        flat = tf.reshape(inputs, (-1, height * width, channels))
        patches = tf.reshape(
            tf.gather(flat, indices, axis=1), (-1, kernel_size * kernel_size * channels)
        )

        def grad(upstream):
            return col2im(upstream, height, width, kernel_size, strides)

        return patches, grad

    return gather_patches(inputs), out_h, out_w


def col2im(patch_grads, height, width, kernel_size, strides):
    """The transpose of `im2col`: `[batch, height, width, channels]`.

    Separable: the taps are first summed onto input rows, one matmul of the
    `_fold_matrix` of the height broadcast over (batch, output column), then,
    after one transpose, onto input columns. Both matmuls read their operand
    in place, so the only copy is the transpose of the row-folded gradients
    (`out_w * height * k` per channel, 0.37 of the patches for PrimaryCaps).
    """
    k = kernel_size
    channels = patch_grads.shape[-1] // (k * k)
    out_h = _valid_length(height, k, strides)
    out_w = _valid_length(width, k, strides)
    rows = tf.constant(_fold_matrix(height, k, strides), patch_grads.dtype)
    cols = tf.constant(_fold_matrix(width, k, strides), patch_grads.dtype)
    # [b * out_w, (out_h, ky), (kx, c)] -> [b * out_w, y, (kx, c)]
    grads = tf.matmul(rows, tf.reshape(patch_grads, (-1, out_h * k, k * channels)))
    # -> [b, y, out_w, kx, c] -> [b * y, (out_w, kx), c] -> [b * y, x, c]
    grads = tf.transpose(tf.reshape(grads, (-1, out_w, height, k, channels)), (0, 2, 1, 3, 4))
    grads = tf.matmul(cols, tf.reshape(grads, (-1, out_w * k, channels)))
    return tf.reshape(grads, (-1, height, width, channels))


def _matmul_outputs(rows, out_h, out_w):
    """`[batch * out_w * out_h, filters]` (the patches' row order) to NHWC."""
    rows = tf.reshape(rows, (-1, out_w, out_h, rows.shape[-1]))
    return tf.transpose(rows, (0, 2, 1, 3))


def _conv_as_matmul_backprop_input(inputs, kernel, strides):
    """`conv_as_matmul` with the input gradient of `Conv2DBackpropInput`."""

    @tf.custom_gradient
    def conv(inputs, kernel):
        patches, out_h, out_w = im2col(inputs, kernel.shape[0], strides)
        filters = kernel.shape[3]
        outputs = tf.matmul(patches, tf.reshape(kernel, (-1, filters)))

        def grad(upstream):
            # The upstream rows in the patches' (column-major) order.
            rows = tf.reshape(tf.transpose(upstream, (0, 2, 1, 3)), (-1, filters))
            kernel_grad = tf.matmul(patches, rows, transpose_a=True)
            input_grad = tf.raw_ops.Conv2DBackpropInput(
                input_sizes=tf.shape(inputs),
                filter=kernel,
                out_backprop=upstream,
                strides=[1, strides, strides, 1],
                padding="VALID",
            )
            return input_grad, tf.reshape(kernel_grad, tf.shape(kernel))

        return _matmul_outputs(outputs, out_h, out_w), grad

    return conv(inputs, kernel)


# === Routing over a batch ===

RoutingPlan = collections.namedtuple("RoutingPlan", "form pieces slices chunk_size")
RoutingPlan.__doc__ = """How a capsule layer routes a batch (`routing_plan`).

`form`: how the iterations run (`routing_form`); `pieces`: `"whole"`,
`"slices"` (`slices` of the batch side by side) or `"chunks"` (`chunk_size`
examples at a time, one after another), from `ROUTING_RULE`.
"""

_MOST_ROUTING_SLICES = 16


def routing_form(jit_compile, return_couplings, iterations, *, backend=None):
    """How the routing iterations run: `"loop"`, `"xla"`, `"unrolled"` or `"keras_ops"`.

    `"keras_ops"`: written with `keras.ops` alone, the form of every backend
    but TensorFlow (`backend_kind`; `backend` overrides it), which compiles
    it its own way (`jit_compile` is then not asked); the iterations unrolled
    for a python int number of them, else a `keras.ops.fori_loop`. On
    TensorFlow: `"loop"`: a `tf.while_loop` (the only TensorFlow form that
    returns couplings); `"xla"`: unrolled and compiled by XLA
    (`jit_compile`); `"unrolled"`: straight-line code, under
    `use_kernels("straight_line")` with a python int number of iterations.
    """
    if (backend or backend_kind()) != "tensorflow":
        return "keras_ops"
    if return_couplings:
        return "loop"
    if kernels_in_use() == "straight_line" and isinstance(iterations, int):
        return "unrolled"
    return "xla" if jit_compile else "loop"


def routing_slices():
    """Into how many slices a CPU routes a batch with XLA: 2 per usable core, at most 16.

    More slices than cores keeps every inter-op thread busy to the end; the
    cap keeps slices of a batch of 100-128 at 6 examples or more on large
    machines, where every slice adds its own dozens of small ops
    (docs/performance.md).
    """
    return min(2 * cpu.usable_cores(), _MOST_ROUTING_SLICES)


def routing_plan(*, training, jit_compile, return_couplings, iterations, chunk_size):
    """The `RoutingPlan` of a capsule layer's call, by `routing_form` and `ROUTING_RULE`.

    Args:
        training: whether this is a training call.
        jit_compile: whether the layer compiles its routing with XLA.
        return_couplings: whether the call returns the couplings.
        iterations: routing iterations.
        chunk_size: the layer's `inference_chunk_size` (None: no chunks).
    """
    backend = backend_kind()
    form = routing_form(jit_compile, return_couplings, iterations, backend=backend)

    def call():
        if return_couplings:
            return "couplings"
        if _in_xla_context():
            return "inside_xla"
        if form == "xla":
            return "xla"
        if not training and chunk_size is not None:
            return "inference"
        return "other"

    pieces = _first_match(ROUTING_RULE, (backend, _set_column(None), device_kind, call))
    slices = routing_slices() if pieces == "slices" else 1
    if slices == 1 and pieces == "slices":
        pieces = "whole"
    return RoutingPlan(form, pieces, slices, chunk_size)


def route_batch(function, inputs, plan, output_tail):
    """`function(inputs)` over the batch in the pieces of `plan` (a `RoutingPlan`).

    `function` maps a batch of input capsules to `[batch, *output_tail]`
    (or, for a whole batch, anything); routing is per example, so the
    result does not depend on the pieces.
    """
    if plan.pieces == "slices":
        return _in_slices(function, inputs, plan.slices)
    if plan.pieces == "chunks":
        return _in_chunks(function, inputs, plan.chunk_size, output_tail)
    return function(inputs)


def _in_slices(function, inputs, parts):
    """`function` of `parts` slices of the batch, run independently and concatenated.

    XLA's CPU code runs the routing's fused loops on one thread, so one call
    for the whole batch leaves the other cores idle through the routing,
    forward and backward. Separate calls on slices of the batch (votes,
    routing and their gradients) run side by side on TensorFlow's inter-op
    threads, each compiled once per slice size. The batch may be unknown
    when traced (`model.fit`) or smaller than `parts` (empty slices route
    nothing).
    """
    batch = tf.shape(inputs)[0]
    sizes = batch // parts + tf.cast(tf.range(parts) < batch % parts, tf.int32)
    slices = tf.split(inputs, sizes, num=parts, axis=0)
    return tf.concat([function(part) for part in slices], 0)


def _in_chunks(function, inputs, chunk_size, output_tail):
    """`function(inputs)` computed at most `chunk_size` examples at a time.

    The batch is cut into `ceil(batch / chunk_size)` equal chunks (zero rows
    pad the last one; their results are dropped), run one after another in a
    `tf.while_loop`: one graph for every batch size, and each chunk's votes
    stay in the CPU's caches through all routing iterations instead of
    streaming the whole batch's votes from memory at every iteration. Each
    chunk's result is padded into place and added, so the loop holds no
    tensor lists (TFLite converts it with built-in operators).
    """
    batch = tf.shape(inputs)[0]
    count = tf.maximum((batch + chunk_size - 1) // chunk_size, 1)
    size = (batch + count - 1) // count
    total = count * size
    rank = inputs.shape.rank
    padded = tf.pad(inputs, [[0, total - batch]] + [[0, 0]] * (rank - 1))

    def body(index, results):
        start = index * size
        chunk = tf.slice(padded, [start] + [0] * (rank - 1), [size] + [-1] * (rank - 1))
        placed = tf.pad(
            function(chunk), [[start, total - start - size]] + [[0, 0]] * len(output_tail)
        )
        placed.set_shape(results.shape)  # known when the batch size is
        return index + 1, results + placed

    results = tf.zeros(tf.concat([[total], output_tail], 0), inputs.dtype)
    _, results = tf.while_loop(
        lambda index, _: index < count,
        body,
        (tf.constant(0), results),
        parallel_iterations=1,
    )
    return results[:batch]


def _in_xla_context():
    """Whether the caller is being traced for XLA (`tf.function(jit_compile=True)`).

    Uses TensorFlow's own test (the one its control flow uses); if that
    private helper ever disappears, assume XLA, which only keeps the batch
    whole.
    """
    try:
        from tensorflow.python.framework import ops as framework_ops
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # pragma: no cover - depends on TensorFlow's internals
        return True
    if tf.executing_eagerly():
        return False
    return control_flow_util.GraphOrParentsInXlaContext(framework_ops.get_default_graph())
