"""The JAX side of tests/test_jax_backend.py, run in its own process with KERAS_BACKEND=jax.

Keras picks its backend once, when it is first imported, so these checks
cannot run in the TensorFlow process of the test suite:
`tests/test_jax_backend.py` runs

    KERAS_BACKEND=jax python tests/jax_backend_checks.py CHECK INPUT.npz OUTPUT.npz

and compares what this script writes with its own NumPy and TensorFlow
values. The checks compute; the assertions are the caller's. CHECK is one
of `CHECKS` (`train` and `load` also run with KERAS_BACKEND=torch where
PyTorch is installed):

- `reference`: float64 (`jax_enable_x64`) routing, couplings and
  gradients of `CapsuleLayer`, `dynamic_routing` with a tensor number of
  iterations, `PrimaryCapsule`, `squash`, `Length`, `Mask` and the losses,
  on the inputs of INPUT.npz;
- `train`: the CapsNet of experiments/mnist.flags, built from
  `capsnet_tf` as the training script builds it, three `model.fit` steps
  (jit-compiled by JAX) and a prediction;
- `load`: the `.keras` file named in INPUT.npz, saved under TensorFlow,
  loaded here and called on INPUT.npz's images.
"""

import dataclasses
import os
import sys

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _layer_values(layer, inputs, **call_arguments):
    """The layer's outputs and the gradients of `sum(out * sin(out))` for inputs and weights."""
    import jax
    import jax.numpy as jnp

    weights = [variable.value for variable in layer.trainable_variables]

    def loss(inputs, weights):
        outputs, _ = layer.stateless_call(
            weights, [v.value for v in layer.non_trainable_variables], inputs, **call_arguments
        )
        if isinstance(outputs, tuple):
            outputs = outputs[0]
        return jnp.sum(outputs * jnp.sin(outputs))

    input_gradient, weight_gradients = jax.grad(loss, argnums=(0, 1))(jnp.asarray(inputs), weights)
    return np.asarray(input_gradient), [np.asarray(g) for g in weight_gradients]


def check_reference(given):
    import jax

    jax.config.update("jax_enable_x64", True)
    import keras

    from capsnet_tf import (
        CapsuleLayer,
        Length,
        Mask,
        PrimaryCapsule,
        dynamic_routing,
        margin_loss,
        reconstruction_loss,
        squash,
    )

    results = {}
    routings = sorted(key[: -len("_iterations")] for key in given if key.endswith("_iterations"))
    for name in routings:
        iterations, leaky = int(given[f"{name}_iterations"]), bool(given[f"{name}_leaky"])
        kernel, bias = given[f"{name}_kernel"], given[f"{name}_bias"]
        inputs = given[f"{name}_inputs"]
        layer = CapsuleLayer(
            kernel.shape[1], kernel.shape[3], routing_iterations=iterations, leaky_routing=leaky,
            dtype="float64",
        )
        layer.build((None,) + inputs.shape[1:])
        layer.set_weights([kernel, bias])
        outputs, couplings = layer(inputs, return_couplings=True)
        results[f"{name}_outputs"] = np.asarray(outputs)
        results[f"{name}_couplings"] = np.asarray(couplings)
        results[f"{name}_training_outputs"] = np.asarray(layer(inputs, training=True))
        input_gradient, (kernel_gradient, _) = _layer_values(layer, inputs)
        results[f"{name}_input_gradient"] = input_gradient
        results[f"{name}_kernel_gradient"] = kernel_gradient
        votes = np.einsum("bid,ijde->bjie", inputs, kernel)
        results[f"{name}_fori_loop"] = np.asarray(
            dynamic_routing(votes, bias, keras.ops.convert_to_tensor(iterations), leaky)
        )

    for padding in ("valid", "same"):
        kernel, bias = given["primary_kernel"], given["primary_bias"]
        layer = PrimaryCapsule(
            2, 3, kernel_size=kernel.shape[0], strides=2, padding=padding, dtype="float64"
        )
        layer.build(given["primary_inputs"].shape)
        layer.set_weights([kernel, bias])
        results[f"primary_{padding}"] = np.asarray(layer(given["primary_inputs"]))
        input_gradient, (kernel_gradient, _) = _layer_values(layer, given["primary_inputs"])
        results[f"primary_{padding}_input_gradient"] = input_gradient
        results[f"primary_{padding}_kernel_gradient"] = kernel_gradient

    capsules = given["capsules"]
    results["squash"] = np.asarray(squash(capsules))
    results["length"] = np.asarray(Length(dtype="float64")(capsules))
    results["mask_longest"] = np.asarray(Mask(dtype="float64")(capsules))
    results["mask_labels"] = np.asarray(
        Mask(dtype="float64")(capsules, given["labels"], training=True)
    )
    lengths = given["lengths"]
    results["margin_loss"] = np.asarray(margin_loss(given["labels"], lengths))
    results["margin_loss_official"] = np.asarray(
        margin_loss(given["labels"], lengths, class_reduction="official")
    )
    results["reconstruction_loss"] = np.asarray(
        reconstruction_loss(given["images"], given["reconstructions"])
    )
    return results


def mnist_flags_options():
    """The `CapsNet` arguments of experiments/mnist.flags (`capsnet_options` of its config)."""
    from capsnet_tf.config import CAPSNET_FIELDS, ExperimentConfig, capsnet_options

    defaults = {field.name: field.default for field in dataclasses.fields(ExperimentConfig)}
    values = {}
    with open(os.path.join(REPO_ROOT, "experiments", "mnist.flags")) as flagfile:
        for line in flagfile:
            line = line.strip()
            if not line.startswith("--"):
                continue
            name, has_value, value = line[2:].partition("=")
            if not has_value and name.startswith("no") and name[2:] in CAPSNET_FIELDS:
                values[name[2:]] = False
            elif not has_value and name in CAPSNET_FIELDS:
                values[name] = True
            elif name in CAPSNET_FIELDS:
                default = defaults[name]
                values[name] = value if default is None else type(default)(value)
    return capsnet_options(ExperimentConfig(**values))


def check_train(given):
    import keras

    from capsnet_tf import CapsNet, MarginLoss, ReconstructionLoss

    keras.utils.set_random_seed(0)
    options = mnist_flags_options()
    # As capsnet_tf.training.build_model builds it for MNIST.
    model = CapsNet(image_shape=(28, 28, 1), num_classes=10, name="capsnet", **options)
    model.compile(
        # capsnet_tf.training compiles FusedAdam, a TensorFlow kernel; Keras's Adam
        # computes the same update on every backend.
        optimizer=keras.optimizers.Adam(1e-3, epsilon=1e-8),
        loss={"length": MarginLoss(), "reconstruction": ReconstructionLoss()},
        loss_weights={"length": 1.0, "reconstruction": 0.0005},
        metrics={"length": [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]},
    )
    images, labels = given["images"], given["labels"]
    before = [np.array(weight) for weight in model.get_weights()]
    history = model.fit(
        {"image": images, "label": labels},
        {"length": labels, "reconstruction": images},
        batch_size=len(images) // 3,
        epochs=1,
        verbose=0,
    )
    changed = [
        not np.array_equal(old, np.asarray(new)) for old, new in zip(before, model.get_weights())
    ]
    predictions = model.inference_model().predict(images, verbose=0)
    return {
        "backend": np.array(keras.backend.backend()),
        "jit_compile": np.array(bool(model.jit_compile)),
        "steps": np.array(int(model.optimizer.iterations.numpy())),
        "params": np.array(model.count_params()),
        "options": np.array(repr(sorted(options.items()))),
        "loss": np.asarray(history.history["loss"]),
        "weights_changed": np.array(changed),
        "lengths": predictions["length"],
        "reconstructions": predictions["reconstruction"],
    }


def check_load(given):
    import keras

    import capsnet_tf  # noqa: F401 (registers the layers, losses and model)

    model = keras.saving.load_model(str(given["path"]))
    outputs = model({"image": given["images"], "label": given["labels"]}, training=False)
    inference = model.inference_model()(given["images"])
    numpy = keras.ops.convert_to_numpy
    return {
        "backend": np.array(keras.backend.backend()),
        "lengths": numpy(outputs["length"]),
        "reconstructions": numpy(outputs["reconstruction"]),
        "capsules": numpy(inference["capsules"]),
    }


CHECKS = {"reference": check_reference, "train": check_train, "load": check_load}


def main(argv):
    check, source, target = argv[1:]
    backends = ("jax",) if check == "reference" else ("jax", "torch")
    if os.environ.get("KERAS_BACKEND") not in backends:
        raise SystemExit(f"Run {check} with KERAS_BACKEND set to one of {backends}.")
    sys.path.insert(0, REPO_ROOT)
    with np.load(source, allow_pickle=False) as data:
        given = {key: data[key] for key in data.files}
    np.savez(target, **CHECKS[check](given))


if __name__ == "__main__":
    main(sys.argv)
