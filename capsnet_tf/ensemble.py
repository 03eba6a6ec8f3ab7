"""Evaluation of an ensemble of independently trained models (the official `--num_trials`).

The official release evaluates several trained copies of a model together: it
combines their class scores example by example and counts the ensemble's
prediction as well as each member's. Here a member is a `CapsNet` (scores:
capsule lengths, the `"length"` output), a `BaselineCNN` (scores: softmax
probabilities) or the `inference_model()` of either; members are always run
in inference mode (`training=False`: no dropout, the capsules chosen by
length). Members must agree on the number of classes; they may differ in
architecture.
"""

import keras
import numpy as np

from capsnet_tf.metrics import multi_label_correct

__all__ = ["ensemble_scores", "evaluate_ensemble"]

_REDUCTIONS = ("mean", "sum")


def _validate(models, reduction):
    if reduction not in _REDUCTIONS:
        raise ValueError(
            f"`reduction` must be one of {_REDUCTIONS}. Received: reduction={reduction!r}"
        )
    models = list(models) if isinstance(models, (list, tuple)) else [models]
    if not models:
        raise ValueError("`models` must hold at least one model. Received: models=[]")
    return models


def _select_scores(outputs):
    """Class scores from a member's outputs: lengths, probabilities, softmax(logits)."""
    if isinstance(outputs, dict):
        if "length" in outputs:
            return outputs["length"]
        if "probabilities" in outputs:
            return outputs["probabilities"]
        if "logits" in outputs:
            return keras.ops.softmax(outputs["logits"], axis=-1)
        raise ValueError(
            "An ensemble member must output 'length' (CapsNet), 'probabilities' or "
            f"'logits' (BaselineCNN). Received outputs: {sorted(outputs)}"
        )
    return outputs


def _member_scorer(model):
    """A function `images -> float32 NumPy [batch, classes]` for one member."""
    if hasattr(model, "inference_model") and callable(model.inference_model):
        model = model.inference_model()
    try:  # functional models only
        symbolic_outputs = model.output if getattr(model, "inputs", None) else None
    except (AttributeError, ValueError):
        symbolic_outputs = None
    if isinstance(model, keras.Model) and symbolic_outputs is not None:
        if len(model.inputs) != 1:
            raise ValueError(
                "An ensemble member must take the image alone (pass a CapsNet, a "
                f"BaselineCNN or their inference_model()). Received: {model.name!r} "
                f"with {len(model.inputs)} inputs"
            )
        # Only the scores: the pruned graph skips e.g. the reconstruction decoder.
        scorer = keras.Model(model.inputs[0], _select_scores(symbolic_outputs))
        return lambda images: np.asarray(scorer.predict_on_batch(images), "float32")
    return lambda images: np.asarray(_select_scores(model(images, training=False)), "float32")


def _combine(scores, reduction):
    classes = {member.shape[-1] for member in scores}
    if len(classes) != 1:
        raise ValueError(f"Ensemble members disagree on the number of classes: {sorted(classes)}")
    total = np.sum(np.stack(scores), axis=0)
    return total / len(scores) if reduction == "mean" else total


def _images(inputs):
    return inputs["image"] if isinstance(inputs, dict) else inputs


def ensemble_scores(models, images, reduction="mean"):
    """The members' class scores, combined example by example.

    Args:
        models: a list of `CapsNet` / `BaselineCNN` models (or their
            `inference_model()`), or one model.
        images: `[batch, H, W, C]` images, or a dict with `"image"`.
        reduction: `"mean"` (average of the members' scores) or `"sum"`.
            Both rank the classes identically.

    Returns:
        float32 NumPy array `[batch, num_classes]`.

    Example:

    >>> import numpy as np
    >>> from capsnet_tf.models.baseline import BaselineCNN
    >>> members = [BaselineCNN(image_shape=(8, 8, 1), conv_filters=(2,),
    ...                        dense_units=(4,)) for _ in range(2)]
    >>> scores = ensemble_scores(members, np.zeros((3, 8, 8, 1), "float32"))
    >>> scores.shape, bool(np.allclose(scores.sum(axis=1), 1.0))
    ((3, 10), True)
    """
    models = _validate(models, reduction)
    images = _images(images)
    return _combine([_member_scorer(model)(images) for model in models], reduction)


def evaluate_ensemble(models, dataset, reduction="mean", num_targets=1):
    """Accuracy of an ensemble and of each member over a data set.

    Each member sees every batch once; the ensemble's scores are the members'
    combined by `reduction` (see `ensemble_scores`). An example is correct
    when its label is the top-scoring class, or with `num_targets=k > 1` when
    its `k` labels are the `k` top-scoring classes (`"all"`, the reported
    MultiMNIST accuracy) or at least one of them is (`"any"`); see
    `capsnet_tf.metrics.MultiLabelAccuracy`.

    Args:
        models: a list of `CapsNet` / `BaselineCNN` models (or their
            `inference_model()`), weights loaded.
        dataset: an iterable (e.g. `tf.data.Dataset`) of `(inputs, targets)`
            batches as made by `capsnet_tf.data`: `inputs` a dict with
            `"image"` (or the images), `targets` a dict with the `"length"`
            labels (or the labels), `[batch]` or `[batch, k]` integers.
            Further elements (sample weights) are ignored.
        reduction: `"mean"` or `"sum"`.
        num_targets: labels per example, `k`.

    Returns:
        Dict with `"ensemble_accuracy"` (float), `"member_accuracies"` (list
        of floats, in the order of `models`) and `"num_examples"` (int); with
        `num_targets > 1` also `"ensemble_accuracy_any"` and
        `"member_accuracies_any"`, and the accuracies above are the `"all"`
        ones.

    Raises:
        ValueError: bad arguments, labels of a shape that does not match
            `num_targets`, or an empty data set.

    Reference:
        Sabour et al., 2017, arXiv:1710.09829; the official release's
        `--num_trials` evaluation (Sarasra/models, research/capsules).
    """
    models = _validate(models, reduction)
    if not isinstance(num_targets, int) or isinstance(num_targets, bool) or num_targets < 1:
        raise ValueError(
            f"`num_targets` must be a positive integer. Received: num_targets={num_targets!r}"
        )
    scorers = [_member_scorer(model) for model in models]
    modes = ("all", "any") if num_targets > 1 else ("all",)
    member_correct = {mode: [0] * len(models) for mode in modes}
    ensemble_correct = dict.fromkeys(modes, 0)
    num_examples = 0
    for element in dataset:
        inputs, targets = element[0], element[1]
        labels = targets["length"] if isinstance(targets, dict) else targets
        labels = np.asarray(labels).astype("int32")
        if num_targets == 1 and labels.ndim == 2 and labels.shape[1] == 1:
            labels = labels[:, 0]
        expected = "[batch]" if num_targets == 1 else f"[batch, {num_targets}]"
        if (labels.ndim != (1 if num_targets == 1 else 2)) or (
            num_targets > 1 and labels.shape[1] != num_targets
        ):
            raise ValueError(
                f"With num_targets={num_targets} the labels must have shape {expected}. "
                f"Received labels of shape {labels.shape}"
            )
        images = _images(inputs)
        scores = [scorer(images) for scorer in scorers]
        combined = _combine(scores, reduction)
        for mode in modes:
            for index, member in enumerate(scores):
                member_correct[mode][index] += int(
                    np.sum(multi_label_correct(labels, member, mode))
                )
            ensemble_correct[mode] += int(np.sum(multi_label_correct(labels, combined, mode)))
        num_examples += labels.shape[0]
    if num_examples == 0:
        raise ValueError("The data set holds no examples.")
    result = {
        "ensemble_accuracy": ensemble_correct["all"] / num_examples,
        "member_accuracies": [correct / num_examples for correct in member_correct["all"]],
        "num_examples": num_examples,
    }
    if num_targets > 1:
        result["ensemble_accuracy_any"] = ensemble_correct["any"] / num_examples
        result["member_accuracies_any"] = [
            correct / num_examples for correct in member_correct["any"]
        ]
    return result
