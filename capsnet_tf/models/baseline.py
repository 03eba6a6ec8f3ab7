"""The paper's baseline CNN (Sabour et al., 2017, section 5) as a functional Keras model."""

import keras

__all__ = ["BaselineCNN"]


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
    stride 1, SAME padding and ReLU, without pooling; the feature map is
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
        **kwargs,
    ):
        image_shape = tuple(int(size) for size in image_shape)
        if len(image_shape) != 3 or min(image_shape) < 1:
            raise ValueError(
                "`image_shape` must be (height, width, channels) of positive "
                f"sizes. Received: image_shape={image_shape}"
            )
        if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 2:
            raise ValueError(
                f"`num_classes` must be an integer >= 2. Received: num_classes={num_classes!r}"
            )
        conv_filters = _positive_ints(conv_filters, "conv_filters")
        dense_units = _positive_ints(dense_units, "dense_units")
        if not isinstance(kernel_size, int) or isinstance(kernel_size, bool) or kernel_size < 1:
            raise ValueError(
                f"`kernel_size` must be a positive integer. Received: kernel_size={kernel_size!r}"
            )
        if not 0.0 <= dropout_rate < 1.0:
            raise ValueError(
                f"`dropout_rate` must be in [0, 1). Received: dropout_rate={dropout_rate}"
            )
        low_precision = keras.config.dtype_policy().compute_dtype in ("float16", "bfloat16")
        precise_dtype = "float32" if low_precision else None

        # === Layers ===
        self.conv_layers = [
            keras.layers.Conv2D(
                filters, kernel_size, padding="same", activation="relu", name=f"conv{index}"
            )
            for index, filters in enumerate(conv_filters, start=1)
        ]
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

    def _logits(self, image):
        features = image
        for conv in self.conv_layers:
            features = conv(features)
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
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)
