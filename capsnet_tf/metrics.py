"""Accuracy when each example has several labels (MultiMNIST's two digits)."""

import keras
from keras import ops

__all__ = ["MultiLabelAccuracy", "multi_label_correct"]

_MODES = ("all", "any")


def multi_label_correct(y_true, y_pred, mode="all"):
    """Per example, whether the `k` labels are among the `k` highest scores.

    Args:
        y_true: integer labels, `[batch, k]` (or `[batch]`, `k = 1`).
        y_pred: class scores `[batch, num_classes]` (capsule lengths,
            probabilities or logits).
        mode: `"all"`: every label is among the `k` top-scoring classes (the
            official release's "correct"); `"any"`: at least one is (its
            "almost correct"). Equal for `k = 1`: top-1 accuracy.

    Returns:
        float32 `[batch]` of 1.0 (correct) and 0.0.
    """
    if mode not in _MODES:
        raise ValueError(f"`mode` must be one of {_MODES}. Received: mode={mode!r}")
    labels = ops.cast(ops.convert_to_tensor(y_true), "int32")
    if len(labels.shape) == 1:
        labels = labels[:, None]
    if len(labels.shape) != 2 or labels.shape[-1] is None:
        raise ValueError(
            "`y_true` must be integer labels of static shape [batch] or [batch, k]. "
            f"Received shape {tuple(labels.shape)}"
        )
    scores = ops.convert_to_tensor(y_pred)
    k = labels.shape[-1]
    _, top = ops.top_k(scores, k=k)  # [batch, k]; ties: the lower class id
    found = ops.any(ops.equal(labels[:, :, None], ops.cast(top, "int32")[:, None, :]), axis=-1)
    correct = ops.all(found, axis=-1) if mode == "all" else ops.any(found, axis=-1)
    return ops.cast(correct, "float32")


@keras.saving.register_keras_serializable(package="capsnet_tf")
class MultiLabelAccuracy(keras.metrics.Metric):
    """Fraction of examples whose `k` labels are the `k` highest-scoring classes.

    For `k` labels per example (`y_true` of static shape `[batch, k]`) the
    prediction is the set of the `k` classes with the highest scores. With
    `mode="all"` an example counts when all its labels are in that set (the
    official release's "correct", the MultiMNIST accuracy the paper reports),
    with `mode="any"` when at least one is ("almost correct"). With `[batch]`
    labels it is top-1 accuracy. Ties among scores go to the lower class id.

    Args:
        mode: `"all"` (default) or `"any"`.
        name: metric name.
        dtype: dtype of the result.

    Call arguments (`update_state`):
        y_true: integer labels `[batch, k]` or `[batch]`.
        y_pred: class scores `[batch, num_classes]`.
        sample_weight: optional per-example weights `[batch]`.

    Returns:
        `result()`: the weighted fraction of correct examples, a scalar.

    Example:

    >>> import numpy as np
    >>> metric = MultiLabelAccuracy()
    >>> metric.update_state(np.array([[0, 2], [1, 2]]),
    ...                     np.array([[0.9, 0.1, 0.8], [0.9, 0.1, 0.8]]))
    >>> float(metric.result())
    0.5

    Reference:
        Sabour et al., 2017, arXiv:1710.09829, section 6 (MultiMNIST).
    """

    def __init__(self, mode="all", name="multi_label_accuracy", dtype=None):
        super().__init__(name=name, dtype=dtype)
        if mode not in _MODES:
            raise ValueError(f"`mode` must be one of {_MODES}. Received: mode={mode!r}")
        self.mode = mode
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        correct = multi_label_correct(y_true, y_pred, self.mode)
        if sample_weight is None:
            weights = ops.ones_like(correct)
        else:
            weights = ops.reshape(ops.cast(sample_weight, "float32"), (-1,))
            weights = ops.broadcast_to(weights, ops.shape(correct))
        self.total.assign_add(ops.cast(ops.sum(correct * weights), self.total.dtype))
        self.count.assign_add(ops.cast(ops.sum(weights), self.count.dtype))

    def result(self):
        return ops.cast(ops.divide_no_nan(self.total, self.count), self.dtype)

    def reset_state(self):
        self.total.assign(0.0)
        self.count.assign(0.0)

    def get_config(self):
        return {**super().get_config(), "mode": self.mode}
