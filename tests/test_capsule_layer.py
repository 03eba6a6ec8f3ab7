"""CapsuleLayer and dynamic routing against an independent NumPy float64 reference."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from capsnet_tf import CapsuleLayer, dynamic_routing, kernels
from capsnet_tf.layers import capsule_layer
from tests.layer_test_case import run_layer_test


def reference_routing(inputs, kernel, bias, iterations, leaky):
    """Procedure 1 of the paper, one example at a time, with explicit loops.

    Returns the output capsules and the couplings of every iteration.
    """
    batch, num_in, _ = inputs.shape
    _, num_out, _, out_dim = kernel.shape
    outputs = np.zeros((batch, num_out, out_dim))
    couplings = np.zeros((batch, iterations, num_in, num_out))
    for b in range(batch):
        votes = np.zeros((num_in, num_out, out_dim))
        for i in range(num_in):
            for j in range(num_out):
                votes[i, j] = inputs[b, i] @ kernel[i, j]
        logits = np.zeros((num_in, num_out))
        for r in range(iterations):
            if leaky:
                padded = np.concatenate([np.zeros((num_in, 1)), logits], axis=1)
                exp = np.exp(padded - padded.max(axis=1, keepdims=True))
                c = (exp / exp.sum(axis=1, keepdims=True))[:, 1:]
            else:
                exp = np.exp(logits - logits.max(axis=1, keepdims=True))
                c = exp / exp.sum(axis=1, keepdims=True)
            couplings[b, r] = c
            s = np.einsum("ij,ijd->jd", c, votes) + bias
            norm = np.linalg.norm(s, axis=-1, keepdims=True)
            v = norm**2 / (1 + norm**2) * s / norm
            for i in range(num_in):
                for j in range(num_out):
                    logits[i, j] += votes[i, j] @ v[j]
        outputs[b] = v
    return outputs, couplings


def make_layer(iterations=3, leaky=False, dtype="float64", seed=0, num_in=6, in_dim=4):
    rng = np.random.default_rng(seed)
    layer = CapsuleLayer(3, 5, routing_iterations=iterations, leaky_routing=leaky, dtype=dtype)
    layer.build((None, num_in, in_dim))
    kernel = rng.normal(scale=0.5, size=(num_in, 3, in_dim, 5))
    bias = rng.normal(scale=0.1, size=(3, 5))
    layer.set_weights([kernel, bias])
    inputs = rng.normal(size=(4, num_in, in_dim))
    return layer, inputs, kernel, bias


def test_baseline_checks(tmp_path):
    run_layer_test(
        CapsuleLayer,
        {"num_capsules": 10, "capsule_dim": 16, "routing_iterations": 2},
        np.random.default_rng(0).normal(size=(3, 20, 8)).astype("float32"),
        expected_output_shape=(3, 10, 16),
        expected_trainable_weight_shapes={"kernel": (20, 10, 8, 16), "bias": (10, 16)},
        tmp_path=tmp_path,
    )


def test_no_bias_has_only_the_kernel():
    layer = CapsuleLayer(10, 16, use_bias=False)
    layer.build((None, 20, 8))
    assert [w.path.split("/")[-1] for w in layer.trainable_weights] == ["kernel"]


@pytest.mark.parametrize("leaky", [False, True])
@pytest.mark.parametrize("iterations", [1, 2, 3])
def test_routing_matches_float64_reference(iterations, leaky):
    layer, inputs, kernel, bias = make_layer(iterations, leaky)
    expected, expected_couplings = reference_routing(inputs, kernel, bias, iterations, leaky)
    outputs, couplings = layer(inputs, return_couplings=True)
    np.testing.assert_allclose(outputs.numpy(), expected, rtol=1e-6, atol=1e-8)  # epsilon in |s|
    # atol: the epsilon inside |s|.
    np.testing.assert_allclose(couplings.numpy(), expected_couplings, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(layer(inputs).numpy(), expected, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("leaky", [False, True])
@pytest.mark.parametrize("iterations", [1, 3])
def test_xla_routing_of_training_calls_matches_float64_reference(iterations, leaky, monkeypatch):
    layer, inputs, kernel, bias = make_layer(iterations, leaky)
    expected, _ = reference_routing(inputs, kernel, bias, iterations, leaky)
    calls = []
    xla_routing = capsule_layer._xla_routing
    monkeypatch.setattr(
        capsule_layer, "_xla_routing", lambda *args: calls.append(1) or xla_routing(*args)
    )
    monkeypatch.setattr(kernels, "routing_slices", lambda: 1)  # one call a batch
    np.testing.assert_allclose(
        layer(inputs, training=True).numpy(), expected, rtol=1e-6, atol=1e-8
    )
    assert len(calls) == 1  # training calls took the XLA path ...
    layer(inputs, training=False)
    layer(inputs, training=True, return_couplings=True)
    assert len(calls) == 1  # ... inference and couplings the while loop
    never = CapsuleLayer(3, 5, routing_iterations=iterations, leaky_routing=leaky,
                         jit_compile=False, dtype="float64")
    never.build((None, 6, 4))
    never.set_weights([kernel, bias])
    never(inputs, training=True)
    assert len(calls) == 1
    always = CapsuleLayer.from_config({**never.get_config(), "jit_compile": True})
    always.build((None, 6, 4))
    always.set_weights([kernel, bias])
    np.testing.assert_allclose(always(inputs).numpy(), expected, rtol=1e-6, atol=1e-8)
    assert len(calls) == 2


def test_xla_routing_gradients_match_numerical():
    layer, inputs, _, _ = make_layer(3, num_in=3, in_dim=2)
    theoretical, numerical = tf.test.compute_gradient(
        lambda x: layer(x, training=True), [tf.constant(inputs[:2])]
    )
    np.testing.assert_allclose(theoretical[0], numerical[0], rtol=1e-4, atol=1e-6)
    assert np.abs(theoretical[0]).max() > 1e-2


def test_routing_gradient_of_a_variable_at_full_size():
    # votes of the MNIST model at batch 100, passed as a variable: repeated
    # gradients used to fail with AlreadyExistsError in the loop's AddN.
    votes = tf.Variable(tf.random.normal((100, 10, 1152, 16), stddev=0.05, seed=1))

    @tf.function
    def gradient():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(dynamic_routing(votes, None, 3) ** 2)
        return tape.gradient(loss, votes)

    for _ in range(6):
        assert np.isfinite(gradient().numpy()).all()


def test_xla_routing_needs_python_iterations():
    votes = tf.zeros((2, 3, 4, 5))
    with pytest.raises(ValueError, match="python int"):
        dynamic_routing(votes, None, tf.constant(3), jit_compile=True)
    with pytest.raises(ValueError, match="jit_compile"):
        CapsuleLayer(3, 5, jit_compile="always")


def test_float32_layer_is_close_to_reference():
    layer64, inputs, kernel, bias = make_layer(3, False)
    layer = CapsuleLayer(3, 5, dtype="float32")
    layer.build((None, 6, 4))
    layer.set_weights([kernel.astype("float32"), bias.astype("float32")])
    expected, _ = reference_routing(inputs, kernel, bias, 3, False)
    np.testing.assert_allclose(layer(inputs.astype("float32")).numpy(), expected, atol=1e-5)


def test_first_iteration_couplings_are_uniform():
    for leaky, value in ((False, 1 / 3), (True, 1 / 4)):
        layer, inputs, _, _ = make_layer(3, leaky)
        _, couplings = layer(inputs, return_couplings=True)
        np.testing.assert_allclose(couplings.numpy()[:, 0], value, rtol=1e-12)
        # Later iterations moved away from uniform.
        assert np.abs(couplings.numpy()[:, 2] - value).max() > 1e-3


def test_routing_is_deterministic_and_iterations_matter():
    layer3, inputs, kernel, bias = make_layer(3)
    layer1, *_ = make_layer(1)
    first, second = layer3(inputs).numpy(), layer3(inputs).numpy()
    np.testing.assert_array_equal(first, second)
    assert np.abs(first - layer1(inputs).numpy()).max() > 1e-3


def test_routing_is_per_example():
    layer, inputs, _, _ = make_layer(3)
    batched = layer(inputs).numpy()
    for b in range(inputs.shape[0]):
        np.testing.assert_allclose(layer(inputs[b : b + 1]).numpy()[0], batched[b], rtol=1e-12)


def test_gradients_match_numerical_through_all_iterations():
    layer, inputs, _, _ = make_layer(3, num_in=3, in_dim=2)
    kernel = layer.kernel

    def through_inputs(x):
        return layer(x)

    def through_kernel(w):  # the layer's computation with the kernel as input
        votes = tf.einsum("bid,ijde->bjie", inputs[:2], w)
        return dynamic_routing(votes, layer.bias, 3)

    theoretical, numerical = tf.test.compute_gradient(through_inputs, [tf.constant(inputs[:2])])
    np.testing.assert_allclose(theoretical[0], numerical[0], rtol=1e-4, atol=1e-6)
    start = tf.constant(kernel.numpy())
    theoretical, numerical = tf.test.compute_gradient(through_kernel, [start])
    # Central differences with TensorFlow's default step: agreement to ~1e-7.
    np.testing.assert_allclose(theoretical[0], numerical[0], rtol=1e-4, atol=1e-6)
    assert np.abs(theoretical[0]).max() > 1e-2  # the check is not vacuous


def test_any_batch_size_and_compiled_modes():
    layer, inputs, _, _ = make_layer(3, dtype="float32")
    inputs = inputs.astype("float32")
    eager = layer(inputs).numpy()
    for jit_compile in (False, True):
        compiled = tf.function(lambda x: layer(x), jit_compile=jit_compile)
        for size in (4, 3, 1):  # a final partial batch too
            np.testing.assert_allclose(compiled(inputs[:size]).numpy(), eager[:size], atol=1e-5)


def test_mixed_bfloat16_keeps_float32_variables_and_finite_outputs():
    keras.config.set_dtype_policy("mixed_bfloat16")
    layer = CapsuleLayer(10, 16)
    outputs, couplings = layer(np.random.rand(2, 32, 8).astype("float32"), return_couplings=True)
    assert layer.kernel.dtype == "float32"
    assert outputs.dtype == tf.bfloat16 and couplings.dtype == tf.float32
    assert np.all(np.isfinite(tf.cast(outputs, tf.float32).numpy()))


@pytest.mark.parametrize("training", [False, True])
def test_vote_scale_multiplies_every_vote(training):
    """`vote_scale` is Procedure 1 on `vote_scale * u_hat`: the reference on a scaled kernel."""
    layer, inputs, kernel, bias = make_layer(3)
    scaled = CapsuleLayer(3, 5, routing_iterations=3, vote_scale=0.25, dtype="float64")
    scaled.build((None, 6, 4))
    scaled.set_weights([kernel, bias])
    expected, _ = reference_routing(inputs, 0.25 * kernel, bias, 3, False)
    np.testing.assert_allclose(
        scaled(inputs, training=training).numpy(), expected, rtol=1e-6, atol=1e-8
    )
    # ... which is not the unscaled layer's output: the factor acts.
    assert np.abs(layer(inputs).numpy() - expected).max() > 1e-2
    restored = CapsuleLayer.from_config(scaled.get_config())
    assert restored.vote_scale == 0.25


@pytest.mark.parametrize("vote_scale", [0, -1.0, True, "0.5"])
def test_vote_scale_must_be_positive(vote_scale):
    with pytest.raises(ValueError, match="`vote_scale` must be a positive number. Received"):
        CapsuleLayer(10, 16, vote_scale=vote_scale)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_capsules": 0, "capsule_dim": 16},
        {"num_capsules": 10, "capsule_dim": -1},
        {"num_capsules": 10, "capsule_dim": 16, "routing_iterations": 0},
        {"num_capsules": 10.5, "capsule_dim": 16},
    ],
)
def test_invalid_arguments_are_refused_by_name(kwargs):
    with pytest.raises(ValueError, match="must be a positive integer"):
        CapsuleLayer(**kwargs)


def test_wrong_input_rank_is_refused():
    layer = CapsuleLayer(10, 16)
    with pytest.raises(ValueError):
        layer(np.zeros((2, 6, 6, 8), "float32"))
