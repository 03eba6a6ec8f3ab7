"""The PrimaryCaps layer: a strided convolution read as a grid of capsules."""

import keras
from keras import ops

from capsnet_tf import kernels
from capsnet_tf.ops import squash

__all__ = ["PrimaryCapsule"]


def _conv_output_length(length, kernel_size, strides, padding):
    if length is None:
        return None
    if padding == "valid":
        return (length - kernel_size) // strides + 1
    return -(-length // strides)  # "same": ceil(length / strides)


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
        training: python bool or `None` (inference); the convolution may take
            another form, of the same values, in inference
            (`capsnet_tf.kernels.CONVOLUTION_RULE`).

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

    def call(self, inputs, training=None):
        # `ops.conv`, or a faster form of it on this machine (`capsnet_tf.kernels`).
        outputs = kernels.conv2d(
            inputs, self.kernel, self.strides, self.padding, training=bool(training)
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
