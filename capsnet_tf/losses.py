"""CapsNet's losses: the margin loss on capsule lengths and the reconstruction loss.

Normalisation of the margin loss. The paper (equation 4) sums the per-class
terms `L_k` over the classes, per example. The official release computes
`0.5 * L_k` and averages over classes as well as over the batch, i.e. `1/20` of
the paper's value for ten classes; its reconstruction term (0.0005 x the
per-example sum of squared errors) is therefore about twenty times stronger
relative to the margin term than in the paper. Both are offered:
`class_reduction="sum"` (default, the paper's equation, the loss reported in
the paper) and `class_reduction="official"` (0.5 x mean over classes, to
reproduce the official numerics).
"""

import keras
from keras import ops

__all__ = [
    "MarginLoss",
    "ReconstructionLoss",
    "margin_loss",
    "reconstruction_loss",
    "RECONSTRUCTION_WEIGHT",
]

# The paper's weight of the reconstruction loss (section 4.1).
RECONSTRUCTION_WEIGHT = 0.0005

_CLASS_REDUCTIONS = ("sum", "official")


def _validate_margins(positive_margin, negative_margin, negative_weight, class_reduction):
    if not 0.0 <= negative_margin < positive_margin <= 1.0:
        raise ValueError(
            "Margins must satisfy 0 <= negative_margin < positive_margin <= 1. "
            f"Received: positive_margin={positive_margin}, "
            f"negative_margin={negative_margin}"
        )
    if negative_weight < 0:
        raise ValueError(
            f"`negative_weight` must be >= 0. Received: negative_weight={negative_weight}"
        )
    if class_reduction not in _CLASS_REDUCTIONS:
        raise ValueError(
            f"`class_reduction` must be one of {_CLASS_REDUCTIONS}. "
            f"Received: class_reduction={class_reduction!r}"
        )


def _targets_as_one_hot(y_true, num_classes):
    """Integer labels `[batch]` / `[batch, k]`, or a multi-hot `[batch, C]`."""
    y_true = ops.convert_to_tensor(y_true)
    if len(y_true.shape) == 2 and y_true.shape[-1] == num_classes and (
        "float" in keras.backend.standardize_dtype(y_true.dtype)
    ):
        return y_true
    labels = ops.cast(y_true, "int32")
    one_hot = ops.one_hot(labels, num_classes, dtype="float32")
    if len(labels.shape) == 2:  # several labels per example: multi-hot
        one_hot = ops.minimum(ops.sum(one_hot, axis=1), 1.0)
    return one_hot


def margin_loss(
    y_true,
    lengths,
    positive_margin=0.9,
    negative_margin=0.1,
    negative_weight=0.5,
    class_reduction="sum",
):
    """Per-example margin loss of Sabour et al. (2017), equation (4).

    `L_k = T_k max(0, m+ - |v_k|)^2 + lambda (1 - T_k) max(0, |v_k| - m-)^2`,
    reduced over the classes `k` by `class_reduction` (see the module
    docstring).

    Args:
        y_true: integer labels `[batch]`, several integer labels per example
            `[batch, k]` (every listed class present), or a float multi-hot
            `[batch, num_classes]`.
        lengths: capsule lengths `[batch, num_classes]`.
        positive_margin: `m+` (0.9).
        negative_margin: `m-` (0.1).
        negative_weight: `lambda`, the down-weighting of absent classes (0.5).
        class_reduction: `"sum"` (paper) or `"official"` (0.5 x mean).

    Returns:
        float32 loss per example, `[batch]`.
    """
    _validate_margins(positive_margin, negative_margin, negative_weight, class_reduction)
    lengths = ops.cast(lengths, "float32")
    targets = _targets_as_one_hot(y_true, lengths.shape[-1])
    present = targets * ops.square(ops.relu(positive_margin - lengths))
    absent = (1.0 - targets) * ops.square(ops.relu(lengths - negative_margin))
    per_class = present + negative_weight * absent
    if class_reduction == "official":
        return 0.5 * ops.mean(per_class, axis=-1)
    return ops.sum(per_class, axis=-1)


def reconstruction_loss(images, reconstructions):
    """Sum of squared pixel errors per example (not yet weighted by 0.0005).

    Args:
        images: target images `[batch, ...]`.
        reconstructions: decoder outputs of the same shape.

    Returns:
        float32 `[batch]`.
    """
    images = ops.cast(images, "float32")
    reconstructions = ops.cast(reconstructions, "float32")
    squared = ops.square(reconstructions - images)
    return ops.sum(ops.reshape(squared, (ops.shape(squared)[0], -1)), axis=-1)


@keras.saving.register_keras_serializable(package="capsnet_tf")
class MarginLoss(keras.losses.Loss):
    """Keras loss wrapper of `margin_loss`, averaged over the batch.

    Args:
        positive_margin: `m+` (0.9).
        negative_margin: `m-` (0.1).
        negative_weight: `lambda` (0.5).
        class_reduction: `"sum"` (paper, default) or `"official"`.
        **kwargs: `keras.losses.Loss` arguments (`name`, `reduction`).

    Call arguments:
        y_true: integer labels `[batch]` or `[batch, k]`.
        y_pred: capsule lengths `[batch, num_classes]`.

    Returns:
        Scalar loss (with the default reduction).

    Example:

    >>> import numpy as np
    >>> loss = MarginLoss()
    >>> round(float(loss(np.array([0]), np.array([[0.9, 0.1]]))), 6)
    0.0

    Reference:
        Sabour et al., 2017, arXiv:1710.09829, equation (4).
    """

    def __init__(
        self,
        positive_margin=0.9,
        negative_margin=0.1,
        negative_weight=0.5,
        class_reduction="sum",
        name="margin_loss",
        **kwargs,
    ):
        _validate_margins(positive_margin, negative_margin, negative_weight, class_reduction)
        super().__init__(name=name, **kwargs)
        self.positive_margin = positive_margin
        self.negative_margin = negative_margin
        self.negative_weight = negative_weight
        self.class_reduction = class_reduction

    def call(self, y_true, y_pred):
        return margin_loss(
            y_true,
            y_pred,
            positive_margin=self.positive_margin,
            negative_margin=self.negative_margin,
            negative_weight=self.negative_weight,
            class_reduction=self.class_reduction,
        )

    def get_config(self):
        return {
            **super().get_config(),
            "positive_margin": self.positive_margin,
            "negative_margin": self.negative_margin,
            "negative_weight": self.negative_weight,
            "class_reduction": self.class_reduction,
        }


@keras.saving.register_keras_serializable(package="capsnet_tf")
class ReconstructionLoss(keras.losses.Loss):
    """Keras loss wrapper of `reconstruction_loss`, averaged over the batch.

    The paper's 0.0005 weight is applied through `compile(loss_weights=...)`
    (see `RECONSTRUCTION_WEIGHT`), so the logged value is the plain sum of
    squared errors per image.

    Call arguments:
        y_true: images `[batch, height, width, channels]`.
        y_pred: reconstructions of the same shape.

    Returns:
        Scalar loss (with the default reduction).

    Example:

    >>> import numpy as np
    >>> loss = ReconstructionLoss()
    >>> float(loss(np.zeros((1, 2, 2, 1)), np.full((1, 2, 2, 1), 0.5)))
    1.0

    Reference:
        Sabour et al., 2017, arXiv:1710.09829, section 4.1.
    """

    def __init__(self, name="reconstruction_loss", **kwargs):
        super().__init__(name=name, **kwargs)

    def call(self, y_true, y_pred):
        return reconstruction_loss(y_true, y_pred)
