"""The paper's comparison CNNs (Sabour et al., 2017, sections 5 and 5.2) as functional Keras models.

- `"baseline"`: Table 1's MNIST baseline, three 5x5 convolutions without
  pooling and two hidden dense layers (35.4M parameters on 28x28 images).
- `"pooled_cnn"`: section 5.2's "traditional convolutional model with a
  similar number of parameters" for the affNIST comparison, as the official
  release's `models/conv_model.py` builds it: two 5x5 VALID convolutions of
  512 and 256 maps, each followed by 2x2 max pooling, one hidden layer of 1024
  units and dropout (16.1M parameters on 40x40 images, CapsNet 13.5M).

`CNN_MODELS` maps each `--model` name to its `BaselineCNN` arguments.
"""

import keras

from capsnet_tf.models.arguments import check_image_shape, check_integer

__all__ = ["CNN_MODELS", "BaselineCNN", "build_cnn", "is_cnn"]

# `--model` name -> `BaselineCNN` arguments (beside the image shape and classes).
CNN_MODELS = {
    "baseline": {},
    "pooled_cnn": {
        "conv_filters": (512, 256),
        "padding": "valid",
        "pool_size": 2,
        "dense_units": (1024,),
        "dropout_rate": 0.5,
    },
}


def is_cnn(model_kind):
    """Whether `--model=model_kind` is one of the CNNs (scored by logits)."""
    return model_kind in CNN_MODELS


def build_cnn(model_kind, image_shape, num_classes):
    """The CNN named `model_kind` (a key of `CNN_MODELS`) for these images."""
    if model_kind not in CNN_MODELS:
        raise ValueError(
            f"`model_kind` must be one of {sorted(CNN_MODELS)}. Received: "
            f"model_kind={model_kind!r}"
        )
    return BaselineCNN(
        image_shape=image_shape, num_classes=num_classes, name=model_kind,
        **CNN_MODELS[model_kind],
    )


def _positive_ints(values, name):
    values = tuple(values)
    if not values or any(
        not isinstance(value, int) or isinstance(value, bool) or value < 1 for value in values
    ):
        raise ValueError(
            f"`{name}` must be a non-empty sequence of positive integers. "
            f"Received: {name}={values!r}"
        )
    return values


@keras.saving.register_keras_serializable(package="capsnet_tf")
class BaselineCNN(keras.Model):
    """The paper's baseline: three 5x5 ReLU convolutions and three dense layers.

    Convolutions of `conv_filters` (256, 256, 128) channels, `kernel_size` 5,
    stride 1, `padding` (SAME) and ReLU, each followed by `pool_size` x
    `pool_size` max pooling when `pool_size` is given (the default: no
    pooling, the Table 1 baseline); the feature map is
    flattened into fully connected ReLU layers of `dense_units` (328, 192);
    dropout (`dropout_rate`, training only) precedes the last, linear layer of
    `num_classes` logits. For 28x28x1 images and 10 classes it has 35,445,522
    parameters, the paper's "35.4M" (CapsNet: 8.2M). Train it with
    `keras.losses.SparseCategoricalCrossentropy(from_logits=True)` on the
    `"logits"` output; `inference_model()` gives the softmax probabilities
    that `capsnet_tf.ensemble` averages.

    Args:
        image_shape: `(height, width, channels)` of the input images.
        num_classes: number of classes.
        conv_filters: channels of the convolutions, one per layer.
        kernel_size: size of the square convolution kernels.
        padding: `"same"` or `"valid"`, of every convolution.
        pool_size: max pooling window and stride after each convolution;
            None: no pooling.
        dense_units: hidden fully connected layer sizes.
        dropout_rate: dropout before the output layer, in `[0, 1)`.
        **kwargs: `keras.Model` arguments such as `name`.

    Call arguments:
        inputs: dict with `"image"`, `[batch, H, W, C]` float.
        training: python bool; enables dropout.

    Returns:
        `{"logits": [batch, num_classes]}`, float32 also under a mixed
        precision policy.

    Example:

    >>> import numpy as np
    >>> model = BaselineCNN(image_shape=(8, 8, 1), conv_filters=(4,), dense_units=(6,))
    >>> model({"image": np.zeros((2, 8, 8, 1), "float32")})["logits"].shape
    TensorShape([2, 10])
    >>> BaselineCNN().count_params()
    35445522
    >>> BaselineCNN(image_shape=(40, 40, 1), **CNN_MODELS["pooled_cnn"]).count_params()
    16146698

    Reference:
        Sabour et al., 2017, arXiv:1710.09829, section 5 (the baseline).
    """

    def __init__(
        self,
        image_shape=(28, 28, 1),
        num_classes=10,
        conv_filters=(256, 256, 128),
        kernel_size=5,
        dense_units=(328, 192),
        dropout_rate=0.5,
        padding="same",
        pool_size=None,
        **kwargs,
    ):
        image_shape = check_image_shape(image_shape)
        check_integer("num_classes", num_classes, minimum=2)
        conv_filters = _positive_ints(conv_filters, "conv_filters")
        dense_units = _positive_ints(dense_units, "dense_units")
        check_integer("kernel_size", kernel_size)
        if padding not in ("same", "valid"):
            raise ValueError(f"`padding` must be 'same' or 'valid'. Received: padding={padding!r}")
        if pool_size is not None:
            check_integer("pool_size", pool_size)
        if not 0.0 <= dropout_rate < 1.0:
            raise ValueError(
                f"`dropout_rate` must be in [0, 1). Received: dropout_rate={dropout_rate}"
            )
        low_precision = keras.config.dtype_policy().compute_dtype in ("float16", "bfloat16")
        precise_dtype = "float32" if low_precision else None

        # === Layers ===
        self.conv_layers = [
            keras.layers.Conv2D(
                filters, kernel_size, padding=padding, activation="relu", name=f"conv{index}"
            )
            for index, filters in enumerate(conv_filters, start=1)
        ]
        self.pool_layers = [
            keras.layers.MaxPooling2D(pool_size, name=f"pool{index}")
            for index in range(1, len(conv_filters) + 1)
        ] if pool_size else []
        self.flatten = keras.layers.Flatten(name="flatten")
        self.dense_layers = [
            keras.layers.Dense(units, activation="relu", name=f"fc{index}")
            for index, units in enumerate(dense_units, start=1)
        ]
        self.dropout = keras.layers.Dropout(dropout_rate, name="dropout")
        self.logits = keras.layers.Dense(num_classes, dtype=precise_dtype, name="logits")

        # === Functional Model ===
        image = keras.Input(shape=image_shape, name="image")
        super().__init__(
            inputs={"image": image}, outputs={"logits": self._logits(image)}, **kwargs
        )

        # === Config ===
        self.image_shape = image_shape
        self.num_classes = num_classes
        self.conv_filters = conv_filters
        self.kernel_size = kernel_size
        self.dense_units = dense_units
        self.dropout_rate = dropout_rate
        self.padding = padding
        self.pool_size = pool_size

    def _logits(self, image):
        features = image
        for index, conv in enumerate(self.conv_layers):
            features = conv(features)
            if self.pool_layers:
                features = self.pool_layers[index](features)
        features = self.flatten(features)
        for dense in self.dense_layers:
            features = dense(features)
        return self.logits(self.dropout(features))

    def inference_model(self, name=None):
        """A model sharing this model's weights that maps images to probabilities.

        Args:
            name: name of the returned model (default `"<name>_inference"`).

        Returns:
            A functional `keras.Model` mapping `[batch, H, W, C]` images to
            `{"probabilities": [batch, classes], "logits": [batch, classes]}`
            (float32), dropout off.
        """
        image = keras.Input(shape=self.image_shape, name="image")
        logits = self._logits(image)
        probabilities = keras.layers.Softmax(dtype="float32", name="probabilities")(logits)
        return keras.Model(
            image,
            {"probabilities": probabilities, "logits": logits},
            name=name or f"{self.name}_inference",
        )

    def get_config(self):
        return {
            "name": self.name,
            "trainable": self.trainable,
            "image_shape": self.image_shape,
            "num_classes": self.num_classes,
            "conv_filters": self.conv_filters,
            "kernel_size": self.kernel_size,
            "dense_units": self.dense_units,
            "dropout_rate": self.dropout_rate,
            "padding": self.padding,
            "pool_size": self.pool_size,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)
