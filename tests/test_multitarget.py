"""Two-target (MultiMNIST) CapsNet, its losses, and the multi-label accuracy."""

import keras
import numpy as np
import pytest

from capsnet_tf import (
    PRESETS,
    CapsNet,
    MarginLoss,
    MultiLabelAccuracy,
    ReconstructionLoss,
    margin_loss,
    reconstruction_loss,
)
from capsnet_tf.metrics import multi_label_correct
from tests.test_model import small_model

# The paper's MultiMNIST CapsNet on 36x36x1 images (section 6: "11.36M parameters"):
#   conv1        9*9*1*256 + 256             =     20,992  (-> 28x28x256)
#   PrimaryCaps  9*9*256*(32*8) + 256        =  5,308,672  (stride 2: 10x10x32 = 3,200 capsules)
#   DigitCaps    3200*10*8*16 + 10*16 (bias) =  4,096,160
#   decoder      160*512 + 512               =     82,432
#                512*1024 + 1024             =    525,312
#                1024*1296 + 1296            =  1,328,400  (36*36 = 1,296 pixels)
#   total                                    = 11,361,968  (one decoder shared by both digits)
MULTI_MNIST_PARAMETERS = (
    20_992 + 5_308_672 + 3200 * 10 * 8 * 16 + 160 + 82_432 + 525_312 + 1_328_400
)
assert MULTI_MNIST_PARAMETERS == 11_361_968

def two_label_batch(size=4, seed=0):
    """Images and pairs of distinct labels, as MultiMNIST has."""
    rng = np.random.default_rng(seed)
    images = rng.random((size, 12, 12, 1)).astype("float32")
    labels = np.stack([rng.choice(10, 2, replace=False) for _ in range(size)]).astype("int32")
    return images, labels


def reference_correct(labels, scores, mode):
    """NumPy: are the k labels among the k highest scores (ties: lower class id)?"""
    labels = labels.reshape(len(labels), -1)
    k = labels.shape[1]
    top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    found = np.array([[label in row for label in example] for example, row in zip(labels, top)])
    return found.all(axis=1) if mode == "all" else found.any(axis=1)


# --- The model --------------------------------------------------------------


def test_multi_mnist_parameter_count_and_preset():
    model = CapsNet(image_shape=(36, 36, 1), num_targets=2)
    assert model.count_params() == MULTI_MNIST_PARAMETERS
    assert PRESETS["multi_mnist"]["metadata"]["params"] == MULTI_MNIST_PARAMETERS
    preset = CapsNet.from_preset("multi_mnist")
    assert preset.num_targets == 2 and preset.image_shape == (36, 36, 1)
    # The second target adds no weights: same count as a one-target 36x36 model.
    assert CapsNet(image_shape=(36, 36, 1)).count_params() == MULTI_MNIST_PARAMETERS


def test_two_target_shapes_and_weights_independent_of_k():
    one = small_model()
    two = small_model(num_targets=2)
    assert two.input["label"].shape == (None, 2)
    assert one.input["label"].shape == (None,)
    # Same weights, same layers (auto-numbered Dense names aside), same order.
    assert [tuple(w.shape) for w in two.weights] == [tuple(w.shape) for w in one.weights]
    assert [w.path.split("/")[0] for w in two.weights] == [
        w.path.split("/")[0] for w in one.weights
    ]
    weighted = [layer.name for layer in one.layers if layer.weights]
    assert weighted == ["conv1", "primary_capsules", "class_capsules", "decoder"]
    assert [layer.name for layer in two.layers if layer.weights] == weighted
    images, labels = two_label_batch(3)
    outputs = two({"image": images, "label": labels}, training=True)
    assert tuple(outputs["length"].shape) == (3, 10)
    assert tuple(outputs["reconstruction"].shape) == (3, 2, 12, 12, 1)
    assert two.get_layer("mask").compute_output_shape((None, 10, 6), (None, 2)) == (
        None, 2, 10, 6,
    )
    inference = two.inference_model()(images)
    assert tuple(inference["reconstruction"].shape) == (3, 2, 12, 12, 1)
    assert tuple(inference["capsules"].shape) == (3, 10, 6)


def test_decoder_applied_identically_to_each_target():
    one = small_model()
    two = small_model(num_targets=2)
    two.set_weights(one.get_weights())
    images, labels = two_label_batch(4)
    both = two({"image": images, "label": labels}, training=True)
    for t in range(2):
        single = one({"image": images, "label": labels[:, t]}, training=True)
        np.testing.assert_allclose(
            both["reconstruction"][:, t].numpy(),
            single["reconstruction"].numpy(),
            rtol=1e-5,
            atol=1e-6,
        )
        np.testing.assert_allclose(both["length"].numpy(), single["length"].numpy(), rtol=1e-6)
    # The two reconstructions differ: each copy keeps a different capsule.
    assert not np.allclose(both["reconstruction"][:, 0], both["reconstruction"][:, 1])


def test_inference_reconstructs_the_k_longest_capsules_in_order():
    one = small_model()
    two = small_model(num_targets=2)
    two.set_weights(one.get_weights())
    images, labels = two_label_batch(5, seed=3)
    out = two.inference_model()(images)
    lengths = out["length"].numpy()
    order = np.argsort(-lengths, axis=1, kind="stable")[:, :2]
    for t in range(2):
        expected = one({"image": images, "label": order[:, t]}, training=True)["reconstruction"]
        np.testing.assert_allclose(
            out["reconstruction"][:, t].numpy(), expected.numpy(), rtol=1e-5, atol=1e-6
        )
    # Outside training the labels are ignored.
    evaluation = two({"image": images, "label": labels}, training=False)["reconstruction"]
    np.testing.assert_allclose(
        evaluation.numpy(), out["reconstruction"].numpy(), rtol=1e-5, atol=1e-6
    )


def test_one_target_checkpoint_loads_into_two_target_model(tmp_path):
    one = small_model()
    path = str(tmp_path / "one.weights.h5")
    one.save_weights(path)
    two = small_model(num_targets=2)
    two.load_weights(path)
    for a, b in zip(one.get_weights(), two.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_config_round_trip_and_keras_file(tmp_path):
    model = small_model(num_targets=2)
    config = model.get_config()
    assert config["num_targets"] == 2
    assert CapsNet.from_config(config).get_config() == config
    assert small_model().get_config()["num_targets"] == 1
    images, labels = two_label_batch(3)
    path = str(tmp_path / "multi.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path)
    assert type(reloaded) is CapsNet and reloaded.num_targets == 2
    for training in (True, False):
        expected = model({"image": images, "label": labels}, training=training)
        actual = reloaded({"image": images, "label": labels}, training=training)
        for name in expected:
            np.testing.assert_allclose(actual[name].numpy(), expected[name].numpy(), rtol=1e-6)


def test_training_step_with_two_labels_matches_numpy_loss():
    model = small_model(num_targets=2)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss={"length": MarginLoss(), "reconstruction": ReconstructionLoss()},
        loss_weights={"length": 1.0, "reconstruction": 0.0005},
        metrics={"length": [MultiLabelAccuracy(name="accuracy")]},
    )
    images, labels = two_label_batch(6)
    # Two digits' reconstruction targets, [b, 2, H, W, C]: here each the full image.
    targets = {"length": labels, "reconstruction": np.stack([images, images], axis=1)}
    inputs = {"image": images, "label": labels}

    outputs = model(inputs, training=True)
    lengths = outputs["length"].numpy().astype("float64")
    recon = outputs["reconstruction"].numpy().astype("float64")
    two_hot = np.zeros((6, 10))
    two_hot[np.arange(6)[:, None], labels] = 1.0
    margin = two_hot * np.maximum(0.9 - lengths, 0) ** 2 + 0.5 * (1 - two_hot) * np.maximum(
        lengths - 0.1, 0
    ) ** 2
    squared = ((recon - targets["reconstruction"]) ** 2).reshape(6, -1).sum(1)
    expected_loss = margin.sum(1).mean() + 0.0005 * squared.mean()
    logs = model.evaluate(inputs, targets, batch_size=6, return_dict=True, verbose=0)
    assert logs["loss"] == pytest.approx(expected_loss, rel=1e-4)
    expected_accuracy = reference_correct(labels, lengths, "all").mean()
    assert logs["length_accuracy"] == pytest.approx(expected_accuracy)

    before = [w.numpy().copy() for w in model.trainable_weights]
    logs = model.train_on_batch(inputs, targets, return_dict=True)
    assert np.isfinite(logs["loss"])
    for weight, old in zip(model.trainable_weights, before):
        assert not np.allclose(weight.numpy(), old), weight.path


def test_mixed_bfloat16_two_targets_keep_float32_heads():
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = small_model(num_targets=2)
    assert all(w.dtype == "float32" for w in model.weights)
    images, labels = two_label_batch(2)
    outputs = model({"image": images, "label": labels}, training=True)
    assert outputs["reconstruction"].dtype == "float32" and outputs["length"].dtype == "float32"
    assert tuple(outputs["reconstruction"].shape) == (2, 2, 12, 12, 1)
    assert np.all(np.isfinite(outputs["reconstruction"].numpy()))


def test_invalid_num_targets():
    for bad in (0, 10, 1.5, True):
        with pytest.raises(ValueError, match="num_targets"):
            small_model(num_targets=bad)


# --- The losses with two targets ----------------------------------------------


def test_reconstruction_loss_sums_both_digits():
    rng = np.random.default_rng(1)
    images = rng.random((3, 2, 5, 5, 1))
    recon = rng.random((3, 2, 5, 5, 1))
    per_digit = ((recon - images) ** 2).sum(axis=(2, 3, 4))  # [3, 2]
    np.testing.assert_allclose(
        reconstruction_loss(images, recon).numpy(), per_digit.sum(1), rtol=1e-5
    )
    np.testing.assert_allclose(
        float(ReconstructionLoss()(images, recon)), per_digit.sum(1).mean(), rtol=1e-5
    )
    # Hand-computed: errors 0.5 on 4 pixels of the first digit, 1.0 on 1 pixel of the second.
    target = np.zeros((1, 2, 2, 2, 1))
    output = np.zeros((1, 2, 2, 2, 1))
    output[0, 0] = 0.5
    output[0, 1, 0, 0, 0] = 1.0
    assert float(reconstruction_loss(target, output)[0]) == pytest.approx(4 * 0.25 + 1.0)


def test_margin_loss_with_two_labels_is_two_hot():
    rng = np.random.default_rng(2)
    lengths = rng.random((5, 10))
    labels = np.stack([rng.choice(10, 2, replace=False) for _ in range(5)])
    two_hot = np.zeros((5, 10))
    two_hot[np.arange(5)[:, None], labels] = 1.0
    expected = (
        two_hot * np.maximum(0.9 - lengths, 0) ** 2
        + 0.5 * (1 - two_hot) * np.maximum(lengths - 0.1, 0) ** 2
    ).sum(1)
    np.testing.assert_allclose(margin_loss(labels, lengths).numpy(), expected, rtol=1e-5)
    np.testing.assert_allclose(
        margin_loss(labels, lengths, class_reduction="official").numpy(),
        0.5 * expected / 10,
        rtol=1e-5,
    )
    # Hand-computed: classes 0 and 2 present with lengths 0.9 and 0.4; class 1 at 0.6.
    loss = margin_loss(np.array([[0, 2]]), np.array([[0.9, 0.6, 0.4]]))
    assert float(loss[0]) == pytest.approx(0.5**2 + 0.5 * 0.5**2)


# --- MultiLabelAccuracy -------------------------------------------------------


@pytest.mark.parametrize("mode", ["all", "any"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_multi_label_accuracy_matches_numpy(mode, k):
    rng = np.random.default_rng(10 * k + len(mode))
    scores = rng.random((64, 10)).astype("float32")
    labels = np.stack([rng.choice(10, k, replace=False) for _ in range(64)]).astype("int32")
    # Make some examples correct for sure: their labels get the top scores.
    scores[:16][np.arange(16)[:, None], labels[:16]] += 1.0
    expected = reference_correct(labels, scores, mode)
    assert 0 < expected.mean() < 1
    metric = MultiLabelAccuracy(mode=mode)
    metric.update_state(labels[:40], scores[:40])
    metric.update_state(labels[40:], scores[40:])
    assert float(metric.result()) == pytest.approx(expected.mean())
    np.testing.assert_array_equal(multi_label_correct(labels, scores, mode).numpy(), expected)
    metric.reset_state()
    assert float(metric.result()) == 0.0


def test_multi_label_accuracy_hand_made_cases():
    scores = np.array(
        [
            [0.9, 0.8, 0.1, 0.0],  # top-2 {0, 1}
            [0.9, 0.8, 0.1, 0.0],
            [0.1, 0.2, 0.3, 0.4],  # top-2 {3, 2}
            [0.5, 0.5, 0.5, 0.1],  # tie: top-2 {0, 1}
        ],
        "float32",
    )
    labels = np.array([[1, 0], [0, 2], [1, 0], [2, 3]])
    np.testing.assert_array_equal(multi_label_correct(labels, scores, "all").numpy(), [1, 0, 0, 0])
    np.testing.assert_array_equal(multi_label_correct(labels, scores, "any").numpy(), [1, 1, 0, 0])
    metric = MultiLabelAccuracy(mode="any")
    metric.update_state(labels, scores, sample_weight=np.array([1.0, 3.0, 0.0, 4.0]))
    assert float(metric.result()) == pytest.approx((1 + 3) / 8)
    # One label per example: top-1 accuracy, as SparseCategoricalAccuracy.
    top1 = MultiLabelAccuracy()
    top1.update_state(np.array([0, 1, 3, 0]), scores)
    assert float(top1.result()) == pytest.approx(3 / 4)


def test_multi_label_accuracy_config_and_errors():
    metric = MultiLabelAccuracy(mode="any", name="almost")
    config = metric.get_config()
    assert config["mode"] == "any" and config["name"] == "almost"
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(metric))
    assert type(restored) is MultiLabelAccuracy and restored.get_config() == config
    with pytest.raises(ValueError, match="mode"):
        MultiLabelAccuracy(mode="some")
    with pytest.raises(ValueError, match="y_true"):
        multi_label_correct(np.zeros((2, 2, 2), "int32"), np.zeros((2, 10)))
