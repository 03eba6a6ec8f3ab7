"""The PrimaryCaps layer: a strided convolution read as a grid of capsules."""

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from capsnet_tf import cpu
from capsnet_tf.ops import squash

__all__ = ["PrimaryCapsule"]


def _conv_output_length(length, kernel_size, strides, padding):
    if length is None:
        return None
    if padding == "valid":
        return (length - kernel_size) // strides + 1
    return -(-length // strides)  # "same": ceil(length / strides)


def _patch_indices(height, width, kernel_size, strides):
    """Flat input positions `y * width + x` of every (output position, kernel tap).

    Ordered output column, output row, kernel row, kernel column: the kernel
    taps of one output position line up with the rows of the kernel reshaped
    to `[k * k * channels, filters]`, and the output positions run down the
    columns so that the patches' gradient folds back with one matmul per axis
    (`_col2im`).
    """
    out_h = _conv_output_length(height, kernel_size, strides, "valid")
    out_w = _conv_output_length(width, kernel_size, strides, "valid")
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
    out = _conv_output_length(length, kernel_size, strides, "valid")
    fold = np.zeros((length, out * kernel_size), np.float32)
    for o in range(out):
        fold[strides * o + np.arange(kernel_size), o * kernel_size + np.arange(kernel_size)] = 1
    return fold


def _matmul_conv_applies(inputs, padding):
    """Whether `_valid_conv_as_matmul` stands in for `ops.conv`: CPU runs only.

    Needs "valid" padding and a static height, width and channel count. On
    GPUs and TPUs cuDNN's and XLA's convolutions are the fast path, so the
    layer keeps `ops.conv` there.
    """
    if padding != "valid" or None in tuple(inputs.shape[1:]):
        return False
    return not cpu.accelerated()


def _valid_conv_as_matmul(inputs, kernel, strides, input_gradient=None):
    """`conv2d(inputs, kernel, strides, padding="valid")` as im2col and one matmul.

    The patches `[batch * out_w * out_h, k * k * channels]` are gathered with
    one `tf.gather` over the flattened positions and multiplied by the kernel
    `[k * k * channels, filters]`. oneDNN runs these matrix shapes close to its
    peak matmul rate, well above its strided convolution kernels on CPUs; the
    PrimaryCaps convolution (9x9, stride 2, 256 to 256 channels) holds almost
    all of CapsNet's FLOPs, and with 36 output positions its patches are small
    enough to materialise.

    Gradients: the kernel's is one matmul of the patches (transposed) and the
    output gradient. The input's has two forms, which win on different CPUs:

    - `"col2im"`: a matmul into patch gradients as large as the patches,
      folded back onto the input by `_col2im` (two 0/1 matmuls). Used in
      float32, in bfloat16 on CPUs with AMX, whose bfloat16 matmul is about
      three times its AVX-512 rate, and in bfloat16 on CPUs with no bfloat16
      arithmetic at all (AVX2), where oneDNN's bfloat16 convolution is about
      three times slower than the matmuls.
    - `"backprop_input"`: oneDNN's own backward-data convolution
      (`Conv2DBackpropInput`), written by hand with `tf.custom_gradient`. It
      has no AMX kernel for this shape, so it is the faster form only in
      bfloat16 on CPUs with AVX-512 BF16 and no AMX (AMD EPYC Zen 4).

    `experiments/benchmark.py --sections=train` measures the layer;
    docs/performance.md has both comparisons.

    Args:
        inputs: `[batch, height, width, channels]`, static spatial shape.
        kernel: `[k, k, channels, filters]`.
        strides: the stride (int).
        input_gradient: `"col2im"`, `"backprop_input"` or `None` (the
            faster one for the dtype and this CPU).
    """
    if input_gradient is None:
        input_gradient = (
            "backprop_input"
            if inputs.dtype == tf.bfloat16 and cpu.bfloat16_unit() == "avx512_bf16"
            else "col2im"
        )
    if input_gradient == "backprop_input":
        return _conv_as_matmul_backprop_input(inputs, kernel, strides)
    if input_gradient != "col2im":
        raise ValueError(
            '`input_gradient` must be "col2im", "backprop_input" or None. '
            f"Received: input_gradient={input_gradient!r}"
        )
    patches, out_h, out_w = _patches(inputs, kernel.shape[0], strides)
    return _patch_product(patches, kernel, out_h, out_w)


def _patch_product(patches, kernel, out_h, out_w):
    """`patches @ kernel` (the kernel as `[k * k * channels, filters]`) in NHWC.

    In bfloat16 on CPUs with AMX the product is computed transposed, as
    `kernel^T @ patches^T` with the filters as its rows: oneDNN's AMX matmul
    ran that form of PrimaryCaps' product 1.46x faster alone and the training
    step 1.02-1.04x faster, while in float32 it made the step 0.94x
    (docs/performance.md). Either way one transpose puts the product in
    NHWC.
    """
    filters = kernel.shape[3]
    rows = tf.reshape(kernel, (-1, filters))
    if patches.dtype == tf.bfloat16 and cpu.bfloat16_unit() == "amx":
        product = tf.matmul(rows, patches, transpose_a=True, transpose_b=True)
        # [filters, batch * out_w * out_h] (the patches' column-major order)
        product = tf.reshape(product, (filters, -1, out_w, out_h))
        return tf.transpose(product, (1, 3, 2, 0))
    return _matmul_outputs(tf.matmul(patches, rows), out_h, out_w)


def _patches(inputs, kernel_size, strides):
    """im2col: `[batch * out_w * out_h, k * k * channels]`, out_h, out_w.

    The rows run output column-major (`_patch_indices`); `_matmul_outputs`
    puts the product back in `[batch, out_h, out_w, filters]`. The gradient
    is `_col2im`, in place of autodiff's transpose of the gather (a transpose
    and an unsorted segment sum, a serial scatter on CPUs; docs/performance.md
    compares the two).
    """
    height, width, channels = inputs.shape[1], inputs.shape[2], inputs.shape[3]
    out_h = _conv_output_length(height, kernel_size, strides, "valid")
    out_w = _conv_output_length(width, kernel_size, strides, "valid")
    indices = _patch_indices(height, width, kernel_size, strides)

    @tf.custom_gradient
    def im2col(inputs):
        flat = tf.reshape(inputs, (-1, height * width, channels))
        patches = tf.reshape(
            tf.gather(flat, indices, axis=1), (-1, kernel_size * kernel_size * channels)
        )

        def grad(upstream):
            return _col2im(upstream, height, width, kernel_size, strides)

        return patches, grad

    return im2col(inputs), out_h, out_w


def _col2im(patch_grads, height, width, kernel_size, strides):
    """The transpose of `_patches`: `[batch, height, width, channels]`.

    Separable: the taps are first summed onto input rows, one matmul of the
    `_fold_matrix` of the height broadcast over (batch, output column), then,
    after one transpose, onto input columns. Both matmuls read their operand
    in place, so the only copy is the transpose of the row-folded gradients
    (`out_w * height * k` per channel, 0.37 of the patches for PrimaryCaps).
    """
    k = kernel_size
    channels = patch_grads.shape[-1] // (k * k)
    out_h = _conv_output_length(height, k, strides, "valid")
    out_w = _conv_output_length(width, k, strides, "valid")
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
    """`_valid_conv_as_matmul` with the input gradient of `Conv2DBackpropInput`."""

    @tf.custom_gradient
    def conv(inputs, kernel):
        patches, out_h, out_w = _patches(inputs, kernel.shape[0], strides)
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


@keras.saving.register_keras_serializable(package="capsnet_tf")
class PrimaryCapsule(keras.layers.Layer):
    """Convolutional capsules: one `capsule_dim`-vector per type and position.

    A 2-D convolution with `num_capsule_types * capsule_dim` filters is read as
    `num_capsule_types` maps of `capsule_dim`-dimensional vectors; every map
    position of every type is one capsule, and each capsule is squashed.
    Capsules are ordered type-major (`type, row, column`), as in the official
    release, so that `output.reshape(batch, types, rows, columns, dim)` recovers
    the grid.

    With `official_scaling=True` the pre-activations are
    `conv(x) / num_capsule_types + bias`: the official release sends the
    convolution through a one-iteration routing step whose coupling
    coefficients are all `1 / num_capsule_types`, which is exactly this
    scaling. The default (`False`) is the paper's plain `conv(x) + bias`.

    Args:
        num_capsule_types: number of capsule maps (the paper's 32).
        capsule_dim: dimension of each capsule (the paper's 8).
        kernel_size: convolution kernel size (int).
        strides: convolution stride (int).
        padding: `"valid"` or `"same"`.
        official_scaling: divide the convolution by `num_capsule_types`
            before adding the bias, as the official release's routing does.
        kernel_initializer: initializer of the `[k, k, in, types * dim]`
            kernel.
        bias_initializer: initializer of the `[types * dim]` bias.
        **kwargs: base `keras.layers.Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: feature map `[batch, height, width, channels]`.

    Returns:
        Squashed capsules `[batch, types * out_height * out_width, capsule_dim]`.

    Input shape:
        `(batch, height, width, channels)`.

    Output shape:
        `(batch, num_capsule_types * out_height * out_width, capsule_dim)`.

    Example:

    >>> import numpy as np
    >>> layer = PrimaryCapsule(num_capsule_types=32, capsule_dim=8)
    >>> tuple(layer(np.zeros((2, 20, 20, 256), "float32")).shape)
    (2, 1152, 8)

    Reference:
        Sabour et al., 2017, arXiv:1710.09829, section 4 ("PrimaryCapsules").
    """

    def __init__(
        self,
        num_capsule_types=32,
        capsule_dim=8,
        kernel_size=9,
        strides=2,
        padding="valid",
        official_scaling=False,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        for name, value in (
            ("num_capsule_types", num_capsule_types),
            ("capsule_dim", capsule_dim),
            ("kernel_size", kernel_size),
            ("strides", strides),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(
                    f"`{name}` must be a positive integer. Received: {name}={value!r}"
                )
        padding = str(padding).lower()
        if padding not in ("valid", "same"):
            raise ValueError(
                f'`padding` must be "valid" or "same". Received: padding={padding!r}'
            )
        self.num_capsule_types = num_capsule_types
        self.capsule_dim = capsule_dim
        self.kernel_size = kernel_size
        self.strides = strides
        self.padding = padding
        self.official_scaling = bool(official_scaling)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.input_spec = keras.layers.InputSpec(ndim=4)

    def build(self, input_shape):
        channels = input_shape[-1]
        if channels is None:
            raise ValueError(
                "PrimaryCapsule needs a known number of input channels. "
                f"Received: input_shape={input_shape}"
            )
        filters = self.num_capsule_types * self.capsule_dim
        self.kernel = self.add_weight(
            name="kernel",
            shape=(self.kernel_size, self.kernel_size, channels, filters),
            initializer=self.kernel_initializer,
        )
        self.bias = self.add_weight(
            name="bias", shape=(filters,), initializer=self.bias_initializer
        )
        self.input_spec = keras.layers.InputSpec(ndim=4, axes={-1: channels})

    def call(self, inputs):
        # The kernel as a tensor in the compute dtype (an eager read under
        # the mixed policy gives an autocast variable, not a tensor).
        kernel = tf.convert_to_tensor(self.kernel)
        if _matmul_conv_applies(inputs, self.padding):
            outputs = _valid_conv_as_matmul(inputs, kernel, self.strides)
        else:
            outputs = ops.conv(
                inputs, self.kernel, strides=self.strides, padding=self.padding
            )
        if self.official_scaling:
            outputs = outputs / float(self.num_capsule_types)
        outputs = outputs + self.bias
        # [b, h, w, types * dim] -> [b, types, h, w, dim] -> [b, types*h*w, dim]
        shape = ops.shape(outputs)
        outputs = ops.reshape(
            outputs,
            (shape[0], shape[1], shape[2], self.num_capsule_types, self.capsule_dim),
        )
        outputs = ops.transpose(outputs, (0, 3, 1, 2, 4))
        outputs = ops.reshape(outputs, (shape[0], -1, self.capsule_dim))
        return squash(outputs, axis=-1)

    def compute_output_shape(self, input_shape):
        height = _conv_output_length(
            input_shape[1], self.kernel_size, self.strides, self.padding
        )
        width = _conv_output_length(
            input_shape[2], self.kernel_size, self.strides, self.padding
        )
        if height is None or width is None:
            num_capsules = None
        else:
            num_capsules = self.num_capsule_types * height * width
        return (input_shape[0], num_capsules, self.capsule_dim)

    def get_config(self):
        return {
            **super().get_config(),
            "num_capsule_types": self.num_capsule_types,
            "capsule_dim": self.capsule_dim,
            "kernel_size": self.kernel_size,
            "strides": self.strides,
            "padding": self.padding,
            "official_scaling": self.official_scaling,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
        }
