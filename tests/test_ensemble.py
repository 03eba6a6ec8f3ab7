"""Ensemble evaluation (the official --num_trials): scores, accuracies against NumPy."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from capsnet_tf import BaselineCNN, CapsNet, ensemble_scores, evaluate_ensemble

SHAPE = (10, 10, 1)


def tiny_capsnet(**kwargs):
    defaults = dict(
        image_shape=SHAPE,
        conv_filters=16,
        conv_kernel_size=3,
        primary_capsule_types=4,
        primary_capsule_dim=4,
        primary_kernel_size=3,
        capsule_dim=6,
        decoder_units=(8, 16),
    )
    return CapsNet(**{**defaults, **kwargs})


def tiny_baseline(**kwargs):
    return BaselineCNN(
        **{**dict(image_shape=SHAPE, conv_filters=(4,), kernel_size=3, dense_units=(8,)), **kwargs}
    )


def data(size=12, num_targets=1, seed=0):
    rng = np.random.default_rng(seed)
    images = rng.random((size,) + SHAPE).astype("float32")
    if num_targets == 1:
        labels = rng.integers(0, 10, size).astype("int64")
    else:
        labels = np.stack([rng.choice(10, num_targets, replace=False) for _ in range(size)])
    return images, labels


def as_dataset(images, labels, batch_size=5):
    """The `capsnet_tf.data` element format: ({"image", "label"}, {"length", "reconstruction"})."""
    return tf.data.Dataset.from_tensor_slices(
        ({"image": images, "label": labels}, {"length": labels, "reconstruction": images})
    ).batch(batch_size)


def member_scores_numpy(model, images):
    """Each member's scores straight from its own model, independently of capsnet_tf.ensemble."""
    if isinstance(model, CapsNet):
        return model.inference_model()(images, training=False)["length"].numpy()
    logits = model({"image": images}, training=False)["logits"].numpy().astype("float64")
    probabilities = np.exp(logits - logits.max(1, keepdims=True))
    return probabilities / probabilities.sum(1, keepdims=True)


def correct_numpy(labels, scores, mode="all"):
    labels = labels.reshape(len(labels), -1)
    top = np.argsort(-scores, axis=1, kind="stable")[:, : labels.shape[1]]
    found = np.array([[label in row for label in example] for example, row in zip(labels, top)])
    return found.all(1) if mode == "all" else found.any(1)


def constant_member(logit_bias):
    """A BaselineCNN whose probabilities are softmax(logit_bias) whatever the image."""
    model = tiny_baseline(num_classes=len(logit_bias), dropout_rate=0.0)
    weights = [np.zeros_like(w) for w in model.get_weights()]
    weights[-1] = np.asarray(logit_bias, "float32")
    model.set_weights(weights)
    return model


def test_ensemble_scores_mean_and_sum_against_numpy():
    members = []
    for seed in (1, 2, 3):
        keras.utils.set_random_seed(seed)
        members.append(tiny_capsnet())
    members.append(tiny_baseline())
    images, _ = data(6)
    expected = np.stack([member_scores_numpy(m, images) for m in members])
    assert not np.allclose(expected[0], expected[1])  # independent initialisations
    mean = ensemble_scores(members, images)
    np.testing.assert_allclose(mean, expected.mean(0), rtol=1e-5, atol=1e-6)
    total = ensemble_scores(members, {"image": images}, reduction="sum")
    np.testing.assert_allclose(total, expected.sum(0), rtol=1e-5, atol=1e-6)
    # Inference models are accepted as members too.
    inference = [m.inference_model() for m in members]
    np.testing.assert_allclose(ensemble_scores(inference, images), mean, rtol=1e-6)
    # One model alone: its own scores.
    np.testing.assert_allclose(ensemble_scores(members[0], images), expected[0], rtol=1e-5)


@pytest.mark.large
def test_evaluate_ensemble_matches_numpy_accuracies():
    members = []
    for seed in (4, 5, 6):
        keras.utils.set_random_seed(seed)
        members.append(tiny_capsnet())
    members.append(tiny_baseline())
    images, labels = data(23, seed=1)  # 5 batches, the last one of 3
    scores = [member_scores_numpy(m, images) for m in members]
    for reduction in ("mean", "sum"):
        result = evaluate_ensemble(members, as_dataset(images, labels), reduction=reduction)
        assert result["num_examples"] == 23
        expected_members = [correct_numpy(labels, s).mean() for s in scores]
        assert result["member_accuracies"] == pytest.approx(expected_members)
        ensemble = np.mean(scores, axis=0) if reduction == "mean" else np.sum(scores, axis=0)
        assert result["ensemble_accuracy"] == pytest.approx(correct_numpy(labels, ensemble).mean())
        assert "ensemble_accuracy_any" not in result
    # The "labels" may also be the targets directly, as plain (images, labels) pairs.
    plain = tf.data.Dataset.from_tensor_slices((images, labels)).batch(8)
    assert evaluate_ensemble(members, plain) == result


def test_ensemble_right_where_every_member_is_wrong():
    # softmax([2, 1.9, 0])   = [0.4902, 0.4435, 0.0663] -> class 0;
    # softmax([0, 1.9, 2.1]) = [0.0631, 0.4218, 0.5151] -> class 2;
    # their mean               [0.2766, 0.4326, 0.2907] -> class 1.
    first = constant_member([2.0, 1.9, 0.0])
    second = constant_member([0.0, 1.9, 2.1])
    images, _ = data(7)
    labels = np.array([1, 1, 1, 1, 1, 0, 2])
    np.testing.assert_allclose(
        ensemble_scores([first, second], images)[0], [0.2766, 0.4326, 0.2907], atol=1e-4
    )
    result = evaluate_ensemble([first, second], as_dataset(images, labels, batch_size=3))
    assert result["member_accuracies"] == pytest.approx([1 / 7, 1 / 7])
    assert result["ensemble_accuracy"] == pytest.approx(5 / 7)
    assert result["num_examples"] == 7


def test_two_target_ensemble_all_and_any():
    members = []
    for seed in (7, 8):
        keras.utils.set_random_seed(seed)
        members.append(tiny_capsnet(num_targets=2))
    images, labels = data(16, num_targets=2, seed=2)
    scores = [member_scores_numpy(m, images) for m in members]
    ensemble = np.mean(scores, axis=0)
    result = evaluate_ensemble(members, as_dataset(images, labels), num_targets=2)
    assert result["num_examples"] == 16
    assert result["ensemble_accuracy"] == pytest.approx(correct_numpy(labels, ensemble).mean())
    assert result["ensemble_accuracy_any"] == pytest.approx(
        correct_numpy(labels, ensemble, "any").mean()
    )
    assert result["member_accuracies"] == pytest.approx(
        [correct_numpy(labels, s).mean() for s in scores]
    )
    assert result["member_accuracies_any"] == pytest.approx(
        [correct_numpy(labels, s, "any").mean() for s in scores]
    )

    # Hand-made, constant members:
    #   softmax([2, 1.95, 1.9, -5]) = [0.350, 0.333, 0.317, 0.000]: top-2 {0, 1};
    #   softmax([-5, 1.9, 1.95, 2]) = [0.000, 0.317, 0.333, 0.350]: top-2 {2, 3};
    #   mean                          [0.175, 0.325, 0.325, 0.175]: top-2 {1, 2}.
    # Per pair, all / any:     [1, 2]   [0, 1]   [2, 3]   [0, 3]
    #   first  {0, 1}           no/yes  yes/yes   no/no    no/yes
    #   second {2, 3}           no/yes   no/no   yes/yes   no/yes
    #   ensemble {1, 2}        yes/yes   no/yes   no/yes   no/no
    first = constant_member([2.0, 1.95, 1.9, -5.0])
    second = constant_member([-5.0, 1.9, 1.95, 2.0])
    pairs = np.array([[1, 2], [0, 1], [2, 3], [0, 3]])
    dataset = as_dataset(images[:4], pairs, batch_size=2)
    result = evaluate_ensemble([first, second], dataset, num_targets=2)
    assert result["member_accuracies"] == pytest.approx([1 / 4, 1 / 4])
    assert result["member_accuracies_any"] == pytest.approx([3 / 4, 3 / 4])
    assert result["ensemble_accuracy"] == pytest.approx(1 / 4)
    assert result["ensemble_accuracy_any"] == pytest.approx(3 / 4)
    # Example 0 alone: the ensemble is right, both members wrong.
    alone = evaluate_ensemble([first, second], as_dataset(images[:1], pairs[:1]), num_targets=2)
    assert alone["member_accuracies"] == [0.0, 0.0] and alone["ensemble_accuracy"] == 1.0


def test_invalid_arguments():
    member = tiny_baseline()
    images, labels = data(4)
    with pytest.raises(ValueError, match="reduction"):
        ensemble_scores([member], images, reduction="max")
    with pytest.raises(ValueError, match="at least one"):
        ensemble_scores([], images)
    with pytest.raises(ValueError, match="labels"):
        evaluate_ensemble([member], as_dataset(images, labels), num_targets=2)
    with pytest.raises(ValueError, match="no examples"):
        evaluate_ensemble([member], as_dataset(images, labels).take(0))
    with pytest.raises(ValueError, match="number of classes"):
        ensemble_scores([member, tiny_baseline(num_classes=5)], images)
