"""The CapsNet of Sabour et al. (2017) as a functional Keras model."""

import math
import types

import keras
from keras import ops

from capsnet_tf.layers.capsule_layer import CapsuleLayer
from capsnet_tf.layers.length import Length
from capsnet_tf.layers.mask import Mask
from capsnet_tf.layers.primary_capsule import PrimaryCapsule
from capsnet_tf.models.arguments import check_image_shape, check_integer
from capsnet_tf.models.grid import MNIST_PRIMARY_CAPSULES, capsule_counts

__all__ = ["CapsNet", "PRESETS"]

_INITIALIZERS = ("official", "keras")
# `CapsNet`'s constructor arguments (beside Keras's own), as `get_config` returns them.
_ARGUMENTS = (
    "image_shape",
    "num_classes",
    "stem_layers",
    "stem_filters",
    "conv_filters",
    "conv_kernel_size",
    "primary_capsule_types",
    "primary_capsule_dim",
    "primary_kernel_size",
    "primary_strides",
    "padding",
    "capsule_dim",
    "routing_iterations",
    "leaky_routing",
    "decoder_units",
    "reconstruction",
    "official_primary_scaling",
    "vote_scaling",
    "initializer",
    "num_targets",
    "routing_jit_compile",
)
_VOTE_SCALINGS = ("none", "capsule_count")

# Named configurations, keras-hub style: constructor arguments plus metadata.
PRESETS = {
    "mnist": {
        "metadata": {
            "description": "The paper's MNIST CapsNet (28x28x1, 10 classes).",
            "params": 8_215_728,
        },
        "config": {"image_shape": (28, 28, 1), "num_classes": 10},
    },
    "mnist_official": {
        "metadata": {
            "description": "MNIST CapsNet with the official release's initialisers "
            "and PrimaryCaps scaling.",
            "params": 8_215_728,
        },
        "config": {
            "image_shape": (28, 28, 1),
            "num_classes": 10,
            "initializer": "official",
            "official_primary_scaling": True,
        },
    },
    "multi_mnist": {
        "metadata": {
            "description": "The paper's MultiMNIST CapsNet (36x36x1, two overlapping "
            "digits, each reconstructed by the shared decoder).",
            "params": 11_361_968,
        },
        "config": {"image_shape": (36, 36, 1), "num_classes": 10, "num_targets": 2},
    },
}


def _capsules(parts, image):
    """The class capsules of `image` through `parts`' stem, conv1, PrimaryCaps and DigitCaps."""
    features = image
    for layer in parts.stem:
        features = layer(features)
    return parts.class_capsules(parts.primary_capsules(parts.conv(features)))


def _decode(parts, masked, num_targets):
    """`parts.decoder` on each target's masked copy: `[b, k, ...]` -> `[b, k, H, W, C]`.

    The `k` copies are folded into the batch, `[b * k, classes, dim]`, so
    one decoder (the same layers and weights as for one target) sees them.
    """
    if num_targets == 1:
        return parts.decoder(masked)
    folded = ops.reshape(masked, (-1,) + tuple(masked.shape[2:]))
    images = parts.decoder(folded)
    return ops.reshape(images, (-1, num_targets) + tuple(images.shape[1:]))


def _initializers(kind, stddev):
    """(kernel, bias) initializers for one layer."""
    if kind == "official":
        return (
            keras.initializers.TruncatedNormal(stddev=stddev),
            keras.initializers.Constant(0.1),
        )
    return "glorot_uniform", "zeros"


def _check_arguments(
    image_shape, num_classes, num_targets, stem_layers, stem_filters, vote_scaling, initializer
):
    """Refuses, Keras-style, the arguments `CapsNet` cannot build; returns `image_shape` as ints.

    Checked before any layer exists, so a bad argument names itself instead
    of surfacing as a shape error deep inside a layer's build.
    """
    if vote_scaling not in _VOTE_SCALINGS:
        raise ValueError(
            f"`vote_scaling` must be one of {_VOTE_SCALINGS}. "
            f"Received: vote_scaling={vote_scaling!r}"
        )
    if initializer not in _INITIALIZERS:
        raise ValueError(
            f"`initializer` must be one of {_INITIALIZERS}. "
            f"Received: initializer={initializer!r}"
        )
    image_shape = check_image_shape(image_shape)
    check_integer("num_classes", num_classes, minimum=2)
    check_integer("num_targets", num_targets)
    if num_targets >= num_classes:
        raise ValueError(
            "`num_targets` must be smaller than `num_classes`. "
            f"Received: num_targets={num_targets!r}, num_classes={num_classes}"
        )
    check_integer("stem_layers", stem_layers, minimum=0)
    check_integer("stem_filters", stem_filters)
    return image_shape


def _vote_scale(config):
    """`CapsuleLayer`'s `vote_scale` for `config["vote_scaling"]` (see `CapsNet`'s Args)."""
    if config["vote_scaling"] != "capsule_count":
        return 1.0
    primary_capsules = capsule_counts(
        config["image_shape"], config["stem_layers"], config["conv_kernel_size"],
        config["primary_capsule_types"], config["primary_kernel_size"],
        config["primary_strides"], config["padding"],
    )[3]
    return min(
        1.0, config["num_classes"] / 10 * math.sqrt(MNIST_PRIMARY_CAPSULES / primary_capsules)
    )


def _make_decoder(image_shape, decoder_units, initializer, precise_dtype):
    """The decoder: ReLU layers of `decoder_units`, then a sigmoid layer shaped as the image."""
    decoder_layers = [keras.layers.Flatten()]
    for units in decoder_units:
        kernel, bias = _initializers(initializer, 0.1)
        decoder_layers.append(
            keras.layers.Dense(units, "relu", kernel_initializer=kernel, bias_initializer=bias)
        )
    kernel, bias = _initializers(initializer, 0.1)
    decoder_layers += [
        keras.layers.Dense(
            math.prod(image_shape),
            "sigmoid",
            kernel_initializer=kernel,
            bias_initializer=bias,
            dtype=precise_dtype,
        ),
        keras.layers.Reshape(image_shape, dtype=precise_dtype),
    ]
    return keras.Sequential(decoder_layers, name="decoder")


def _make_layers(**config):
    """CapsNet's layers for `config` (`CapsNet`'s arguments), in a namespace, in call order."""
    low_precision = keras.config.dtype_policy().compute_dtype in ("float16", "bfloat16")
    precise_dtype = "float32" if low_precision else None
    initializer = config["initializer"]
    parts = types.SimpleNamespace()
    conv_kernel, conv_bias = _initializers(initializer, 0.05)
    parts.stem = [
        keras.layers.Conv2D(
            config["stem_filters"],
            3,
            strides=2,
            padding="same",
            activation="relu",
            kernel_initializer=conv_kernel,
            bias_initializer=conv_bias,
            name=f"stem{index + 1}",
        )
        for index in range(config["stem_layers"])
    ]
    parts.conv = keras.layers.Conv2D(
        config["conv_filters"],
        config["conv_kernel_size"],
        padding=config["padding"],
        activation="relu",
        kernel_initializer=conv_kernel,
        bias_initializer=conv_bias,
        name="conv1",
    )
    primary_kernel, primary_bias = _initializers(initializer, 0.1)
    parts.primary_capsules = PrimaryCapsule(
        num_capsule_types=config["primary_capsule_types"],
        capsule_dim=config["primary_capsule_dim"],
        kernel_size=config["primary_kernel_size"],
        strides=config["primary_strides"],
        padding=config["padding"],
        official_scaling=config["official_primary_scaling"],
        kernel_initializer=primary_kernel,
        bias_initializer=primary_bias,
        name="primary_capsules",
    )
    capsule_kernel, capsule_bias = _initializers(initializer, 0.1)
    if initializer == "keras":
        capsule_kernel = None  # CapsuleLayer's own default
    parts.class_capsules = CapsuleLayer(
        num_capsules=config["num_classes"],
        capsule_dim=config["capsule_dim"],
        routing_iterations=config["routing_iterations"],
        leaky_routing=config["leaky_routing"],
        kernel_initializer=capsule_kernel,
        bias_initializer=capsule_bias,
        vote_scale=_vote_scale(config),
        jit_compile=config["routing_jit_compile"],
        # Under a mixed policy the votes and the routing stay float32: the
        # routing is memory-bound (its FLOPs are a few % of the model's),
        # its casts cost more than bfloat16 saves, and the softmax over
        # logits summed across iterations keeps float32's precision.
        dtype=precise_dtype,
        name="class_capsules",
    )
    parts.length = Length(dtype=precise_dtype, name="length")
    if config["reconstruction"]:
        num_targets = config["num_targets"]
        parts.mask = Mask(num_targets=None if num_targets == 1 else num_targets, name="mask")
        parts.decoder = _make_decoder(
            config["image_shape"], config["decoder_units"], initializer, precise_dtype
        )
    return parts


@keras.saving.register_keras_serializable(package="capsnet_tf")
class CapsNet(keras.Model):
    """CapsNet: [stem ->] Conv -> PrimaryCapsule -> CapsuleLayer -> lengths + decoder.

    The training model takes `{"image": [batch, H, W, C] float in [0, 1],
    "label": [batch] int}` and returns `{"length": [batch, num_classes],
    "reconstruction": [batch, H, W, C]}`. The decoder (fully connected
    `decoder_units` with ReLU, then a sigmoid layer of `H * W * C` units) sees
    the digit capsules with all but one masked out: the true class's in
    training, the longest otherwise. `inference_model()` returns a model that
    shares these weights and takes the image alone.

    With `num_targets=k > 1` (MultiMNIST) the `label` input holds `k` class
    ids per example, `[batch, k]`; the same decoder, with the same weights,
    reconstructs each target's masked copy, giving `"reconstruction": [batch,
    k, H, W, C]` (at inference the `k` longest capsules, longest first). The
    weights, their names and the parameter count do not depend on `k`.

    Larger images: the votes and the routing grow with the number of primary
    capsules, `primary_capsule_types` times the PrimaryCaps grid, which grows
    with the image's area (128x128 with the paper's layers: 56x56x32). An
    optional stem of `stem_layers` 3x3 ReLU convolutions of stride 2 (`same`
    padding, `stem_filters` each) before `conv1` halves the grid's height and
    width per layer, and so divides the primary capsules, the class-capsule
    weights and the routing tensors by about 4 per layer, for
    `9 * C * F + F` (+ `9 * F * F + F` per further layer) stem parameters and
    `conv1` reading F channels instead of C. `primary_strides` trades in the same
    way without new layers. The decoder always reconstructs the full image.

    Args:
        image_shape: `(height, width, channels)` of the input images.
        num_classes: number of classes (= output capsules).
        stem_layers: 3x3 stride-2 ReLU convolutions before `conv1` (0: none,
            the paper's model).
        stem_filters: filters of each stem convolution (32).
        conv_filters: filters of the first ReLU convolution (256).
        conv_kernel_size: its kernel size (9).
        primary_capsule_types: capsule maps in PrimaryCaps (32).
        primary_capsule_dim: dimension of primary capsules (8).
        primary_kernel_size: PrimaryCaps kernel size (9).
        primary_strides: PrimaryCaps stride (2).
        padding: `"valid"` (paper) or `"same"` for both convolutions.
        capsule_dim: dimension of the class capsules (16).
        routing_iterations: routing iterations (3).
        leaky_routing: leaky routing in the class capsules.
        decoder_units: hidden layer sizes of the decoder ((512, 1024)).
        reconstruction: build the decoder and the `reconstruction` output
            (and the `label` input); `False` gives a classifier only.
        official_primary_scaling: PrimaryCaps pre-activations divided by the
            number of capsule types, as in the official release.
        vote_scaling: `"none"` (default: the paper's votes) or
            `"capsule_count"`: the class capsules' votes scaled by
            `min(1, num_classes / 10 * sqrt(1152 / primary capsules))`
            (`CapsuleLayer`'s `vote_scale`), 1 for MNIST's 1,152 primary
            capsules and 10 classes. `s_j` sums the votes of all primary
            capsules with couplings near `1 / classes`, and one Adam step
            moves every kernel entry by about the learning rate, early on in
            the same direction for all of them, so the first steps move
            `s_j` by an amount that grows with primary capsules / classes.
            Unscaled, 48x48 RGB images (8,192 primary capsules, 3 classes)
            take every class capsule to a length near 1 in the first step,
            where the margin loss has almost no gradient, and the run stays
            at chance. The square root (the size of a sum of independent
            votes) learned faster than the step's linear growth in the
            comparison of `docs/experiments.md`.
        initializer: `"keras"` (default: Glorot uniform / zeros; the capsule
            kernel truncated normal 0.1) or `"official"` (the official
            release's truncated normal 0.1, first convolution 0.05, biases 0.1).
        num_targets: objects per image to reconstruct: 1, or 2 for the
            two-digit MultiMNIST model.
        routing_jit_compile: when the class capsules' routing is compiled
            with XLA: `"training"` (default; training calls only), `True` or
            `False` (see `CapsuleLayer`).
        **kwargs: `keras.Model` arguments such as `name`.

    Call arguments:
        inputs: dict with `"image"` and, when `reconstruction`, `"label"`.
        training: python bool; selects the label (True) or the longest
            capsule (False) for the reconstruction.

    Returns:
        Dict with `"length"` and, when `reconstruction`, `"reconstruction"`.

    Example:

    >>> import numpy as np
    >>> model = CapsNet()
    >>> outputs = model({"image": np.zeros((2, 28, 28, 1), "float32"),
    ...                  "label": np.array([3, 7])})
    >>> outputs["length"].shape, outputs["reconstruction"].shape
    (TensorShape([2, 10]), TensorShape([2, 28, 28, 1]))

    Reference:
        Sabour et al., 2017, arXiv:1710.09829, section 4 and figures 1-2.
    """

    def __init__(
        self,
        image_shape=(28, 28, 1),
        num_classes=10,
        stem_layers=0,
        stem_filters=32,
        conv_filters=256,
        conv_kernel_size=9,
        primary_capsule_types=32,
        primary_capsule_dim=8,
        primary_kernel_size=9,
        primary_strides=2,
        padding="valid",
        capsule_dim=16,
        routing_iterations=3,
        leaky_routing=False,
        decoder_units=(512, 1024),
        reconstruction=True,
        official_primary_scaling=False,
        vote_scaling="none",
        initializer="keras",
        num_targets=1,
        routing_jit_compile="training",
        **kwargs,
    ):
        image_shape = _check_arguments(
            image_shape, num_classes, num_targets, stem_layers, stem_filters,
            vote_scaling, initializer,
        )
        decoder_units = tuple(int(units) for units in decoder_units)

        # === Layers ===
        # Held here until `keras.Model.__init__` has run, then set as attributes
        # of the same names (below): under Keras's PyTorch backend a layer is a
        # torch.nn.Module, which takes no submodule before its __init__.
        # Every constructor argument by name, as checked: for the layers, then the config.
        arguments = {name: value for name, value in locals().items() if name in _ARGUMENTS}
        parts = _make_layers(**arguments)

        # === Functional Model ===
        image = keras.Input(shape=image_shape, name="image")
        inputs = {"image": image}
        capsules = _capsules(parts, image)
        outputs = {"length": parts.length(capsules)}
        if reconstruction:
            label_shape = () if num_targets == 1 else (num_targets,)
            label = keras.Input(shape=label_shape, dtype="int32", name="label")
            inputs["label"] = label
            outputs["reconstruction"] = _decode(parts, parts.mask(capsules, label), num_targets)
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)
        for name, layer in vars(parts).items():  # stem, conv, ..., in the order built
            setattr(self, name, layer)

        # === Config ===
        for name, value in arguments.items():
            setattr(self, name, value)

    def _capsules(self, image):
        return _capsules(self, image)

    def _decode(self, masked, num_targets):
        return _decode(self, masked, num_targets)

    def inference_model(self, name=None):
        """A model sharing this model's weights that takes the image alone.

        Args:
            name: name of the returned model (default `"<name>_inference"`).

        Returns:
            A functional `keras.Model` mapping `[batch, H, W, C]` images to
            `{"length": [batch, classes], "capsules": [batch, classes, dim]}`
            and, when the model reconstructs, `"reconstruction"` from the
            longest capsule (`[batch, k, H, W, C]` from the `k` longest, in
            order of length, when `num_targets=k > 1`).
        """
        image = keras.Input(shape=self.image_shape, name="image")
        capsules = self._capsules(image)
        outputs = {"length": self.length(capsules), "capsules": capsules}
        if self.reconstruction:
            outputs["reconstruction"] = self._decode(self.mask(capsules), self.num_targets)
        return keras.Model(image, outputs, name=name or f"{self.name}_inference")

    @classmethod
    def from_preset(cls, preset, **overrides):
        """Builds a model from a named entry of `PRESETS`, with overrides."""
        if preset not in PRESETS:
            raise ValueError(
                f"Unknown preset {preset!r}; available: {sorted(PRESETS)}"
            )
        return cls(**{**PRESETS[preset]["config"], **overrides})

    def get_config(self):
        return {
            "name": self.name,
            "trainable": self.trainable,
            **{name: getattr(self, name) for name in _ARGUMENTS},
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)
