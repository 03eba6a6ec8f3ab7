"""FusedAdam: the same update as Keras's Adam and a float64 NumPy Adam."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from capsnet_tf.optimizers import FusedAdam

SHAPES = [(3, 4), (7,), (2, 3, 5)]


def _numpy_adam(values, gradients, learning_rates, beta_1, beta_2, epsilon):
    """Kingma & Ba's Algorithm 1 with Keras's epsilon placement, in float64."""
    values = [v.astype(np.float64) for v in values]
    m = [np.zeros_like(v) for v in values]
    s = [np.zeros_like(v) for v in values]
    for t, (step_gradients, lr) in enumerate(zip(gradients, learning_rates), start=1):
        for k, g in enumerate(step_gradients):
            m[k] = beta_1 * m[k] + (1 - beta_1) * g
            s[k] = beta_2 * s[k] + (1 - beta_2) * g * g
            m_hat = m[k] / (1 - beta_1**t)
            s_hat = s[k] / (1 - beta_2**t)
            # Keras (and TensorFlow's kernel) add epsilon to sqrt(v), not sqrt(v_hat).
            values[k] = values[k] - lr * m_hat / (np.sqrt(s_hat) + epsilon / np.sqrt(1 - beta_2**t))
    return values


def _run(optimizer_class, values, gradients, **kwargs):
    variables = [keras.Variable(v) for v in values]
    optimizer = optimizer_class(**kwargs)
    optimizer.build(variables)
    apply = tf.function(lambda grads: optimizer.apply(grads, variables))
    for step_gradients in gradients:
        apply([tf.constant(g, tf.float32) for g in step_gradients])
    return [v.numpy() for v in variables]


def _problem(steps=6, seed=0):
    rng = np.random.default_rng(seed)
    values = [rng.normal(size=shape).astype(np.float32) for shape in SHAPES]
    gradients = [
        [rng.normal(size=shape).astype(np.float32) for shape in SHAPES] for _ in range(steps)
    ]
    return values, gradients


def test_matches_a_float64_numpy_adam_under_a_decaying_schedule():
    values, gradients = _problem()
    schedule = keras.optimizers.schedules.ExponentialDecay(0.01, decay_steps=2, decay_rate=0.5)
    learning_rates = [float(schedule(step)) for step in range(len(gradients))]
    expected = _numpy_adam(values, gradients, learning_rates, 0.9, 0.999, 1e-3)
    fused = _run(FusedAdam, values, gradients, learning_rate=schedule, epsilon=1e-3)
    keras_adam = _run(
        keras.optimizers.Adam, values, gradients, learning_rate=schedule, epsilon=1e-3
    )
    for got, reference, theirs in zip(fused, expected, keras_adam):
        np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got, theirs, rtol=1e-6, atol=1e-7)
    # The updates are not trivially small: the values moved.
    assert max(np.abs(g - v).max() for g, v in zip(fused, values)) > 0.01


def test_amsgrad_keeps_keras_update():
    values, gradients = _problem(seed=1)
    fused = _run(FusedAdam, values, gradients, learning_rate=0.01, amsgrad=True)
    keras_adam = _run(keras.optimizers.Adam, values, gradients, learning_rate=0.01, amsgrad=True)
    for got, theirs in zip(fused, keras_adam):
        np.testing.assert_array_equal(got, theirs)


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16", "mixed_float16"])
def test_trains_a_model_as_keras_adam_does(policy):
    """Under every precision policy (float16 adds Keras's loss scaling)."""
    rng = np.random.default_rng(2)
    x = rng.normal(size=(16, 5)).astype(np.float32)
    y = rng.normal(size=(16, 3)).astype(np.float32)
    weights = {}
    keras.config.set_dtype_policy(policy)
    for optimizer_class in (keras.optimizers.Adam, FusedAdam):
        keras.utils.set_random_seed(3)
        model = keras.Sequential(
            [keras.Input((5,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)]
        )
        model.compile(optimizer=optimizer_class(learning_rate=0.01), loss="mse")
        if policy == "mixed_float16":
            assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
        for _ in range(4):
            model.train_on_batch(x, y)
        weights[optimizer_class] = model.get_weights()
    for got, theirs in zip(weights[FusedAdam], weights[keras.optimizers.Adam]):
        np.testing.assert_allclose(got, theirs, rtol=1e-5, atol=1e-6)


def test_serializes_by_its_registered_name():
    optimizer = FusedAdam(learning_rate=0.003, epsilon=1e-8, beta_2=0.99)
    config = keras.saving.serialize_keras_object(optimizer)
    assert config["registered_name"] == "capsnet_tf>FusedAdam"
    restored = keras.saving.deserialize_keras_object(config)
    assert type(restored) is FusedAdam
    assert restored.get_config() == optimizer.get_config()


def test_resumes_from_a_checkpoint_written_with_keras_adam(tmp_path):
    """Work directories from before FusedAdam: the moments and step carry over."""
    from capsnet_tf.checkpoints import load_weights, save_weights_atomically

    rng = np.random.default_rng(4)
    x = rng.normal(size=(8, 5)).astype(np.float32)
    y = rng.normal(size=(8, 2)).astype(np.float32)

    def model_with(optimizer_class):
        keras.utils.set_random_seed(5)
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(2)])
        model.compile(optimizer=optimizer_class(learning_rate=0.01), loss="mse")
        return model

    old = model_with(keras.optimizers.Adam)
    for _ in range(3):
        old.train_on_batch(x, y)
    path = str(tmp_path / "state.weights.h5")
    save_weights_atomically(old, path, include_optimizer=True)
    new = model_with(FusedAdam)
    load_weights(new, path, include_optimizer=True)
    assert int(new.optimizer.iterations) == 3
    for model in (old, new):
        model.train_on_batch(x, y)
    for got, theirs in zip(new.get_weights(), old.get_weights()):
        np.testing.assert_allclose(got, theirs, rtol=1e-6, atol=1e-7)
