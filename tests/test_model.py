"""The CapsNet model: parameter count, outputs, training step, saving, precision."""

import inspect
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from capsnet_tf import PRESETS, CapsNet
from capsnet_tf.config import ExperimentConfig
from capsnet_tf.training import compile_model
from tests.conftest import REPO_ROOT

# The paper's MNIST CapsNet: conv1 20,992 + PrimaryCaps 5,308,672 + DigitCaps
# 1,474,560 + decoder 1,411,344 = 8,215,568, plus the 10x16 capsule bias.
PAPER_PARAMETERS = 8_215_568 + 160


def small_model(**kwargs):
    defaults = dict(
        image_shape=(12, 12, 1),
        conv_filters=8,
        conv_kernel_size=3,
        primary_capsule_types=2,
        primary_capsule_dim=4,
        primary_kernel_size=3,
        capsule_dim=6,
        decoder_units=(16, 32),
    )
    return CapsNet(**{**defaults, **kwargs})


def batch(size=4, shape=(12, 12, 1), seed=0):
    rng = np.random.default_rng(seed)
    images = rng.random((size,) + shape).astype("float32")
    labels = rng.integers(0, 10, size).astype("int32")
    return {"image": images, "label": labels}, {"length": labels, "reconstruction": images}


def test_paper_parameter_count_and_presets():
    model = CapsNet()
    assert model.count_params() == PAPER_PARAMETERS
    assert model.get_layer("primary_capsules").compute_output_shape((None, 20, 20, 256)) == (
        None,
        1152,
        8,
    )
    for preset in PRESETS.values():
        assert CapsNet(**preset["config"]).count_params() == preset["metadata"]["params"]
    assert CapsNet(reconstruction=False).count_params() == PAPER_PARAMETERS - 1_411_344


def test_outputs_and_named_heads():
    model = small_model()
    outputs = model(batch(3)[0], training=True)
    assert set(outputs) == {"length", "reconstruction"}
    assert tuple(outputs["length"].shape) == (3, 10)
    assert tuple(outputs["reconstruction"].shape) == (3, 12, 12, 1)
    recon = outputs["reconstruction"].numpy()
    assert recon.min() >= 0 and recon.max() <= 1


def test_decoder_sees_only_the_target_capsule():
    model = small_model()
    inputs, _ = batch(2)
    capsules = model.inference_model()(inputs["image"])["capsules"].numpy()
    decoder = model.get_layer("decoder")
    # Changing any non-target capsule leaves the training reconstruction unchanged.
    reference = model(inputs, training=True)["reconstruction"].numpy()
    mask = model.get_layer("mask")
    labels = inputs["label"]
    masked = mask(capsules, labels, training=True).numpy()
    np.testing.assert_allclose(decoder(masked).numpy(), reference, rtol=1e-5, atol=1e-6)
    perturbed = capsules + 1.0
    perturbed[np.arange(2), labels] = capsules[np.arange(2), labels]
    np.testing.assert_allclose(
        decoder(mask(perturbed, labels, training=True)).numpy(), reference, rtol=1e-5, atol=1e-6
    )


def test_inference_model_shares_weights_and_uses_longest_capsule():
    model = small_model()
    inputs, _ = batch(3)
    inference = model.inference_model()
    assert {id(w) for w in inference.weights} <= {id(w) for w in model.weights}
    out = inference(inputs["image"])
    evaluation = model(inputs, training=False)
    np.testing.assert_allclose(out["length"].numpy(), evaluation["length"].numpy(), rtol=1e-6)
    np.testing.assert_allclose(
        out["reconstruction"].numpy(), evaluation["reconstruction"].numpy(), rtol=1e-5, atol=1e-6
    )
    # Labels are ignored outside training: the longest capsule is reconstructed.
    other = dict(inputs, label=(inputs["label"] + 1) % 10)
    np.testing.assert_allclose(
        model(other, training=False)["reconstruction"].numpy(),
        evaluation["reconstruction"].numpy(),
        rtol=1e-6,
    )


@pytest.mark.parametrize("jit_compile", [False, True])
def test_one_training_step_changes_every_weight(jit_compile):
    model = small_model()
    compile_model(model, ExperimentConfig(jit_compile=jit_compile))
    before = [w.numpy().copy() for w in model.trainable_weights]
    inputs, targets = batch(8)
    logs = model.train_on_batch(inputs, targets, return_dict=True)
    assert np.isfinite(logs["loss"])
    for weight, old in zip(model.trainable_weights, before):
        assert not np.allclose(weight.numpy(), old), weight.path


def test_loss_is_margin_plus_weighted_reconstruction():
    model = compile_model(small_model(), ExperimentConfig())
    inputs, targets = batch(4)
    logs = model.evaluate(inputs, targets, return_dict=True, verbose=0, batch_size=4)
    expected = logs["length_loss"] + 0.0005 * logs["reconstruction_loss"]
    assert logs["loss"] == pytest.approx(expected, rel=1e-4)


def test_config_names_every_constructor_argument_and_its_value():
    # get_config is built from one list of names; a new argument missing from
    # that list would be dropped from saved models without this check.
    model = small_model(routing_iterations=2, leaky_routing=True)
    config = model.get_config()
    signature = [
        name for name in inspect.signature(CapsNet.__init__).parameters
        if name not in ("self", "kwargs")
    ]
    assert sorted(config) == sorted(signature + ["name", "trainable"])
    assert config["routing_iterations"] == 2 and config["leaky_routing"] is True


@pytest.mark.parametrize(
    "arguments, named",
    [
        ({"num_classes": True}, "num_classes"),
        ({"num_classes": 1}, "num_classes"),
        ({"num_targets": 10}, "num_targets"),
        ({"num_targets": 0}, "num_targets"),
        ({"stem_layers": -1}, "stem_layers"),
        ({"stem_filters": 0}, "stem_filters"),
    ],
)
def test_bad_integer_arguments_are_refused_by_name(arguments, named):
    with pytest.raises(ValueError, match=f"`{named}` must .* Received: {named}="):
        CapsNet(**arguments)


def test_config_round_trip_and_keras_file(tmp_path):
    model = small_model(routing_iterations=2, leaky_routing=True)
    config = model.get_config()
    assert CapsNet.from_config(config).get_config() == config
    inputs, _ = batch(3)
    path = str(tmp_path / "capsnet.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path)
    assert type(reloaded) is CapsNet
    for training in (True, False):
        expected = model(inputs, training=training)
        actual = reloaded(inputs, training=training)
        for name in expected:
            np.testing.assert_allclose(actual[name].numpy(), expected[name].numpy(), rtol=1e-6)


@pytest.mark.large
def test_keras_file_loads_in_a_fresh_process_without_custom_objects(tmp_path):
    model = compile_model(small_model(), ExperimentConfig())
    inputs, _ = batch(2)
    np.save(tmp_path / "image.npy", inputs["image"])
    np.save(tmp_path / "expected.npy", model.inference_model()(inputs["image"])["length"].numpy())
    model.save(tmp_path / "capsnet.keras")
    script = textwrap.dedent(
        f"""
        import numpy as np, keras
        import capsnet_tf  # registers the classes; no custom_objects needed
        model = keras.saving.load_model({str(tmp_path / 'capsnet.keras')!r})
        image = np.load({str(tmp_path / 'image.npy')!r})
        lengths = model.inference_model()(image)["length"].numpy()
        np.testing.assert_allclose(lengths, np.load({str(tmp_path / 'expected.npy')!r}), rtol=1e-6)
        print("OK", type(model).__name__, type(model.optimizer).__name__)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "OK CapsNet FusedAdam" in result.stdout


def test_mixed_bfloat16_pass_keeps_float32_variables_and_precise_heads():
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = compile_model(small_model(), ExperimentConfig())
    assert all(w.dtype == "float32" for w in model.weights)
    inputs, targets = batch(4)
    outputs = model(inputs, training=True)
    assert outputs["length"].dtype == tf.float32
    assert outputs["reconstruction"].dtype == tf.float32
    logs = model.train_on_batch(inputs, targets, return_dict=True)
    assert np.isfinite(logs["loss"])


def test_same_seed_same_initial_weights():
    keras.utils.set_random_seed(7)
    first = small_model().get_weights()
    keras.utils.set_random_seed(7)
    second = small_model().get_weights()
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)


def test_invalid_model_arguments():
    with pytest.raises(ValueError, match="initializer"):
        CapsNet(initializer="he")
    with pytest.raises(ValueError, match="image_shape"):
        CapsNet(image_shape=(28, 28))
    with pytest.raises(ValueError, match="preset"):
        CapsNet.from_preset("imagenet")


def test_vote_scaling_by_capsule_count():
    """min(1, classes / 10 * sqrt(1152 / primary capsules)), hand-computed per shape."""
    def scale(**kwargs):
        return CapsNet(**kwargs).get_layer("class_capsules").vote_scale

    assert scale() == 1.0
    assert scale(vote_scaling="capsule_count") == 1.0  # MNIST: 1,152 capsules, 10 classes
    # 48x48: conv1 40x40, PrimaryCaps (40 - 9) // 2 + 1 = 16: 16 * 16 * 32 = 8,192 capsules.
    assert scale(image_shape=(48, 48, 3), num_classes=3, vote_scaling="capsule_count") == (
        pytest.approx(0.3 * 0.375)
    )
    assert scale(num_classes=20, vote_scaling="capsule_count") == 1.0  # never above 1
    model = CapsNet(image_shape=(48, 48, 3), num_classes=3, vote_scaling="capsule_count")
    restored = CapsNet.from_config(model.get_config())
    assert restored.get_layer("class_capsules").vote_scale == pytest.approx(0.3 * 0.375)
    with pytest.raises(ValueError, match="`vote_scaling` must be one of .* Received"):
        CapsNet(vote_scaling="mean")


@pytest.mark.large
def test_one_adam_step_saturates_many_capsules_unless_the_votes_are_scaled():
    """Why `vote_scaling` exists: 8,192 primary capsules, 3 classes, dense colour images.

    One Adam step moves `s_j` by a sum over all primary capsules: with the
    paper's votes every class capsule's length jumps to about 1 (where the
    margin loss has no gradient left); scaled by capsule count it does not.
    """
    rng = np.random.default_rng(0)
    images = np.empty((8, 48, 48, 3), "float32")
    labels = np.arange(8, dtype="int32") % 3
    for k in range(8):  # a random background colour everywhere, a brighter square
        images[k] = rng.uniform(0, 0.43, 3)
        y, x = rng.integers(5, 25, 2)
        images[k, y:y + 18, x:x + 18] = rng.uniform(0.55, 1.0, 3)
    lengths = {}
    for scaling in ("none", "capsule_count"):
        keras.utils.set_random_seed(0)
        model = CapsNet(image_shape=(48, 48, 3), num_classes=3, vote_scaling=scaling,
                        reconstruction=False)
        compile_model(model, ExperimentConfig(reconstruction=False), steps_per_epoch=10)
        before = model.predict({"image": images}, verbose=0)["length"].mean()
        model.train_on_batch({"image": images}, {"length": labels})
        lengths[scaling] = (before, model.predict({"image": images}, verbose=0)["length"].mean())
    # From about 0.04 to above 0.99 with the paper's votes (where the squash's slope
    # d|v|/d|s| = 2|s| / (1 + |s|^2)^2 is below 0.002); scaled, they keep room to learn.
    assert lengths["none"][0] < 0.5 and lengths["none"][1] > 0.99, lengths
    assert lengths["capsule_count"][1] < 0.95, lengths


def test_official_initialisers():
    model = CapsNet(initializer="official", official_primary_scaling=True)
    conv = model.get_layer("conv1")
    np.testing.assert_allclose(conv.bias.numpy(), 0.1)
    # Truncated normal: |w| <= 2 stddev, standard deviation ~0.88 stddev.
    kernel = conv.kernel.numpy()
    assert np.abs(kernel).max() <= 0.1 + 1e-6 and 0.04 < kernel.std() < 0.047
    primary = model.get_layer("primary_capsules").kernel.numpy()
    assert np.abs(primary).max() <= 0.2 + 1e-6 and 0.08 < primary.std() < 0.095
    np.testing.assert_allclose(model.get_layer("class_capsules").bias.numpy(), 0.1)
    for dense in model.get_layer("decoder").layers[1:4]:
        np.testing.assert_allclose(dense.bias.numpy(), 0.1)
    keras_default = CapsNet()
    np.testing.assert_array_equal(keras_default.get_layer("conv1").bias.numpy(), 0.0)
