"""Masking of all capsules but the target ones, for the reconstruction decoder."""

import keras
from keras import ops

from capsnet_tf.ops import safe_norm

__all__ = ["Mask"]


@keras.saving.register_keras_serializable(package="capsnet_tf")
class Mask(keras.layers.Layer):
    """Zeroes every capsule except the selected one(s).

    The reconstruction decoder of CapsNet sees only the capsule of one class:
    during training the capsule of the true label, otherwise the longest
    capsule (the prediction). With several labels per example (two-digit
    MultiMNIST inputs) the layer returns one masked copy per label, each
    keeping one capsule, and at inference the longest ones in order of
    length.

    Args:
        num_targets: how many capsules to keep per example when no labels
            are used (inference). Default 1; ignored in training, where the
            labels decide. With `labels` of shape `[batch, k]` it must be `k`
            or `None`.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        capsules: `[batch, num_capsules, capsule_dim]`.
        labels: optional integer class ids, `[batch]` (one target) or
            `[batch, k]` (k targets). Used only when `training` is true.
        training: python bool or `None`; when true and `labels` is given the
            labels select the capsules, otherwise the longest capsules do.

    Returns:
        With one target: `[batch, num_capsules, capsule_dim]`, zero except the
        selected capsule. With k targets: `[batch, k, num_capsules,
        capsule_dim]`, copy `t` keeping the capsule of target `t`.

    Example:

    >>> import numpy as np
    >>> capsules = np.array([[[1.0, 0.0], [0.0, 2.0]]], "float32")
    >>> np.asarray(Mask()(capsules)).tolist()  # the longest, capsule 1
    [[[0.0, 0.0], [0.0, 2.0]]]
    >>> np.asarray(Mask()(capsules, np.array([0]), training=True)).tolist()
    [[[1.0, 0.0], [0.0, 0.0]]]

    Reference:
        Sabour et al., 2017, arXiv:1710.09829, section 4.1.
    """

    def __init__(self, num_targets=None, **kwargs):
        super().__init__(**kwargs)
        if num_targets is not None and (
            not isinstance(num_targets, int) or isinstance(num_targets, bool) or num_targets < 1
        ):
            raise ValueError(
                "`num_targets` must be a positive integer or None. "
                f"Received: num_targets={num_targets!r}"
            )
        self.num_targets = num_targets

    def _targets(self, labels_shape):
        """Returns k, or None for the single-target (rank-3 output) form."""
        if labels_shape is None or len(labels_shape) == 1:
            if self.num_targets in (None, 1):
                return None
            return self.num_targets
        if len(labels_shape) != 2:
            raise ValueError(
                "Mask expects integer labels of shape [batch] or [batch, k]. "
                f"Received: labels_shape={tuple(labels_shape)}"
            )
        k = labels_shape[1]
        if self.num_targets is not None and k is not None and k != self.num_targets:
            raise ValueError(
                f"Mask(num_targets={self.num_targets}) needs labels for as many targets. "
                f"Received: labels_shape={tuple(labels_shape)} ({k} targets)"
            )
        return k

    def build(self, capsules_shape, labels_shape=None):
        # Two inputs, so Keras passes one shape per call argument, as it does
        # to `MultiHeadAttention.build(query_shape, value_shape, key_shape)`.
        if len(capsules_shape) != 3:
            raise ValueError(
                "Mask expects capsules of shape [batch, num_capsules, capsule_dim]. "
                f"Received: capsules_shape={tuple(capsules_shape)}"
            )
        self._targets(labels_shape)  # raises on labels of the wrong shape

    def call(self, capsules, labels=None, training=None):
        num_capsules = capsules.shape[-2]
        labels_shape = None if labels is None else tuple(labels.shape)
        targets = self._targets(labels_shape)
        if training and labels is not None:
            selected = ops.cast(labels, "int32")
        else:
            lengths = safe_norm(capsules, axis=-1)
            _, selected = ops.top_k(lengths, k=targets or 1, sorted=True)
            if targets is None:
                selected = selected[:, 0]
        mask = ops.one_hot(selected, num_capsules, dtype=capsules.dtype)
        if targets is None:
            return capsules * mask[..., None]
        return capsules[:, None] * mask[..., None]

    def compute_output_shape(self, capsules_shape, labels_shape=None):
        targets = self._targets(labels_shape)
        capsules_shape = tuple(capsules_shape)
        if targets is None:
            return capsules_shape
        return (capsules_shape[0], targets) + capsules_shape[1:]

    def get_config(self):
        return {**super().get_config(), "num_targets": self.num_targets}
