"""The paper's baseline CNN: parameter count, NumPy forward pass, training, saving."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from capsnet_tf import BaselineCNN

# The paper's baseline for 28x28x1 MNIST (section 5: "35.4M parameters"):
#   conv1 5*5*1*256 + 256     =      6,656
#   conv2 5*5*256*256 + 256   =  1,638,656
#   conv3 5*5*256*128 + 128   =    819,328   (SAME, stride 1: still 28x28x128)
#   fc1   28*28*128*328 + 328 = 32,915,784   (100,352 inputs)
#   fc2   328*192 + 192       =     63,168
#   out   192*10 + 10         =      1,930
#   total                     = 35,445,522
PAPER_BASELINE_PARAMETERS = 6_656 + 1_638_656 + 819_328 + 32_915_784 + 63_168 + 1_930
assert PAPER_BASELINE_PARAMETERS == 35_445_522

SMALL = dict(
    image_shape=(6, 6, 1),
    num_classes=3,
    conv_filters=(2, 3),
    kernel_size=3,
    dense_units=(4,),
)


def small_model(**kwargs):
    return BaselineCNN(**{**SMALL, **kwargs})


def images(size=4, shape=(6, 6, 1), seed=0):
    return np.random.default_rng(seed).random((size,) + shape).astype("float32")


def numpy_conv_same(x, kernel, bias):
    """float64 cross-correlation, stride 1, SAME padding (odd kernels), ReLU."""
    size = kernel.shape[0]
    pad = size // 2
    padded = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    out = np.zeros(x.shape[:3] + (kernel.shape[-1],))
    for i in range(x.shape[1]):
        for j in range(x.shape[2]):
            patch = padded[:, i : i + size, j : j + size, :]
            out[:, i, j] = np.einsum("bhwc,hwco->bo", patch, kernel)
    return np.maximum(out + bias, 0.0)


def numpy_forward(model, x):
    x = x.astype("float64")
    for index in range(len(model.conv_filters)):
        layer = model.get_layer(f"conv{index + 1}")
        x = numpy_conv_same(x, layer.kernel.numpy(), layer.bias.numpy())
    x = x.reshape(x.shape[0], -1)
    for index in range(len(model.dense_units)):
        layer = model.get_layer(f"fc{index + 1}")
        x = np.maximum(x @ layer.kernel.numpy() + layer.bias.numpy(), 0.0)
    layer = model.get_layer("logits")
    return x @ layer.kernel.numpy() + layer.bias.numpy()


def test_paper_parameter_count_and_layer_shapes():
    model = BaselineCNN()
    assert model.count_params() == PAPER_BASELINE_PARAMETERS
    shapes = {w.path: tuple(w.shape) for w in model.trainable_weights}
    assert shapes == {
        "conv1/kernel": (5, 5, 1, 256),
        "conv1/bias": (256,),
        "conv2/kernel": (5, 5, 256, 256),
        "conv2/bias": (256,),
        "conv3/kernel": (5, 5, 256, 128),
        "conv3/bias": (128,),
        "fc1/kernel": (100_352, 328),
        "fc1/bias": (328,),
        "fc2/kernel": (328, 192),
        "fc2/bias": (192,),
        "logits/kernel": (192, 10),
        "logits/bias": (10,),
    }
    for name in ("conv1", "conv2", "conv3"):
        conv = model.get_layer(name)
        assert conv.padding == "same" and conv.strides == (1, 1)
        assert conv.output.shape[1:3] == (28, 28)  # no pooling, no shrinking
    assert not any("pool" in type(layer).__name__.lower() for layer in model.layers)
    assert model.get_layer("dropout").rate == 0.5


def test_forward_pass_matches_numpy_reference():
    model = small_model()
    x = images(3)
    logits = model({"image": x}, training=False)["logits"].numpy()
    assert logits.shape == (3, 3)
    np.testing.assert_allclose(logits, numpy_forward(model, x), rtol=1e-5, atol=1e-6)


def test_inference_model_shares_weights_and_gives_softmax():
    model = small_model()
    x = images(5)
    inference = model.inference_model()
    assert {id(w) for w in inference.weights} == {id(w) for w in model.weights}
    out = inference(x)
    reference = numpy_forward(model, x)
    expected = np.exp(reference - reference.max(1, keepdims=True))
    expected /= expected.sum(1, keepdims=True)
    np.testing.assert_allclose(out["probabilities"].numpy(), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["logits"].numpy(), reference, rtol=1e-5, atol=1e-6)


def test_dropout_only_in_training():
    model = small_model(dense_units=(64,))
    x = images(4)
    evaluation = model({"image": x}, training=False)["logits"].numpy()
    np.testing.assert_array_equal(model({"image": x})["logits"].numpy(), evaluation)
    assert not np.allclose(model({"image": x}, training=True)["logits"].numpy(), evaluation)
    no_dropout = small_model(dropout_rate=0.0)
    np.testing.assert_allclose(
        no_dropout({"image": x}, training=True)["logits"].numpy(),
        no_dropout({"image": x}, training=False)["logits"].numpy(),
        rtol=1e-6,
    )


def test_one_training_step_changes_every_weight():
    model = small_model()
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss={"logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True)},
        metrics={"logits": [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]},
    )
    before = [w.numpy().copy() for w in model.trainable_weights]
    labels = np.array([0, 1, 2, 1, 0, 2], "int32")
    logs = model.train_on_batch({"image": images(6)}, {"logits": labels}, return_dict=True)
    assert np.isfinite(logs["loss"])
    for weight, old in zip(model.trainable_weights, before):
        assert not np.allclose(weight.numpy(), old), weight.path


def test_config_round_trip_serialization_and_keras_file(tmp_path):
    model = small_model(dropout_rate=0.25, name="baseline")
    config = model.get_config()
    assert config["conv_filters"] == (2, 3) and config["dropout_rate"] == 0.25
    assert BaselineCNN.from_config(config).get_config() == config
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(model))
    assert type(restored) is BaselineCNN and restored.get_config() == config

    x = images(3)
    path = str(tmp_path / "baseline.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path)  # no custom_objects: registered
    assert type(reloaded) is BaselineCNN
    np.testing.assert_allclose(
        reloaded({"image": x}, training=False)["logits"].numpy(),
        model({"image": x}, training=False)["logits"].numpy(),
        rtol=1e-6,
    )
    np.testing.assert_allclose(
        reloaded.inference_model()(x)["probabilities"].numpy(),
        model.inference_model()(x)["probabilities"].numpy(),
        rtol=1e-6,
    )


def test_mixed_bfloat16_keeps_float32_variables_and_logits():
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = small_model()
    assert all(w.dtype == "float32" for w in model.weights)
    x = images(2)
    assert model({"image": x})["logits"].dtype == tf.float32
    probabilities = model.inference_model()(x)["probabilities"]
    assert probabilities.dtype == tf.float32
    assert np.all(np.isfinite(probabilities.numpy()))


def test_invalid_arguments():
    with pytest.raises(ValueError, match="image_shape"):
        BaselineCNN(image_shape=(28, 28))
    with pytest.raises(ValueError, match="num_classes"):
        BaselineCNN(num_classes=1)
    with pytest.raises(ValueError, match="conv_filters"):
        BaselineCNN(conv_filters=(256, 0))
    with pytest.raises(ValueError, match="dense_units"):
        BaselineCNN(dense_units=())
    with pytest.raises(ValueError, match="kernel_size"):
        BaselineCNN(kernel_size=0)
    with pytest.raises(ValueError, match="dropout_rate"):
        BaselineCNN(dropout_rate=1.0)


@pytest.mark.parametrize("model", ["baseline", "pooled_cnn"])
def test_cnn_trains_through_the_unshifted_final_epochs(tfds_data_dir, tmp_path, model):
    # mnist_fast.flags' recipe (its last epochs unshifted) with --model=baseline: the
    # unshifted epochs must carry the CNN's `logits` target, as the shifted ones do.
    from capsnet_tf.config import ExperimentConfig
    from capsnet_tf.training import train_and_evaluate

    config = ExperimentConfig(
        model=model, epochs=2, unshifted_final_epochs=1, shift=2, steps_per_epoch=2,
        batch_size=8, train_examples=16, eval_examples=16, verbose=0,
    )
    results = train_and_evaluate(config, str(tmp_path / model))
    assert results["epochs_run_this_call"] == 2
    assert 0.0 <= results["test_accuracy"] <= 1.0
