"""The one harness every layer goes through: Keras's own checks, then the project's.

`run_layer_test` first runs Keras's layer harness
(`keras.src.testing.TestCase.run_layer_test`), which checks what Keras checks
on its core layers: the config round trip, `build` from shapes (one shape per
call argument for two-input layers), symbolic and eager calls against
`compute_output_shape`, the trainable weight count, a compiled training step
and the mixed-precision output dtype. Then the checks Keras's harness leaves
out: serialization without `custom_objects`, the exact name and shape of
every trainable weight, the eager output's dtype, a symbolic call with an
unknown batch size against `compute_output_shape`, and a `.keras` save and
reload inside a model giving the same outputs. Each layer's values are
checked against independent references in its own test file.
"""

import inspect

import keras
import numpy as np
from keras.src import testing


def _call_argument_names(layer_cls, count):
    """The names of the first `count` arguments of `layer_cls.call`."""
    parameters = list(inspect.signature(layer_cls.call).parameters)[1:]  # after self
    return parameters[:count]


def run_keras_harness(layer_cls, init_kwargs, inputs, expected_output_shape,
                      expected_num_trainable_weights, call_kwargs, run_training_check):
    """Keras's `run_layer_test`, from the inputs' shapes and dtypes."""
    shapes = [tuple(np.shape(x)) for x in inputs]
    dtypes = [str(np.asarray(x).dtype) for x in inputs]
    if len(inputs) == 1:
        input_shape, input_dtype = shapes[0], dtypes[0]
    else:
        # Several call arguments: Keras's harness builds with `build(**shapes)`
        # and calls with `layer(**tensors)`, the keys less "_shape".
        names = [f"{name}_shape" for name in _call_argument_names(layer_cls, len(inputs))]
        input_shape, input_dtype = dict(zip(names, shapes)), dict(zip(names, dtypes))
    harness = testing.TestCase("run_layer_test")
    harness.run_layer_test(
        layer_cls,
        init_kwargs=init_kwargs,
        input_shape=input_shape,
        input_dtype=input_dtype,
        call_kwargs=call_kwargs,
        expected_output_shape=tuple(expected_output_shape),
        expected_num_trainable_weights=expected_num_trainable_weights,
        expected_num_non_trainable_weights=0,
        supports_masking=False,
        run_training_check=run_training_check,
    )


def run_layer_test(
    layer_cls,
    init_kwargs,
    input_data,
    expected_output_shape,
    expected_trainable_weight_shapes,
    tmp_path,
    call_kwargs=None,
    run_training_check=True,
):
    """Keras's harness, then serialization, exact weights and a `.keras` reload.

    Args:
        layer_cls: the layer class.
        init_kwargs: constructor arguments.
        input_data: NumPy input (a tuple for several call arguments).
        expected_output_shape: the eager output shape.
        expected_trainable_weight_shapes: dict name -> shape of trainable
            weights, exactly.
        tmp_path: a directory for the saved model.
        call_kwargs: extra keyword arguments of `call`.
        run_training_check: whether Keras's harness trains a step; its
            training model passes several inputs as one dict argument, so
            two-input layers without weights turn it off.

    Returns:
        The eagerly called layer and its output.
    """
    call_kwargs = call_kwargs or {}
    inputs = input_data if isinstance(input_data, tuple) else (input_data,)

    run_keras_harness(
        layer_cls,
        init_kwargs,
        inputs,
        expected_output_shape,
        len(expected_trainable_weight_shapes),
        call_kwargs,
        run_training_check,
    )

    # Serialization without custom_objects: the layers are registered.
    layer = layer_cls(**init_kwargs)
    config = layer.get_config()
    assert layer_cls.from_config(config).get_config() == config
    serialized = keras.saving.serialize_keras_object(layer)
    restored = keras.saving.deserialize_keras_object(serialized)
    assert type(restored) is layer_cls
    assert restored.get_config() == config

    # Eager call on the given data: shape, dtype, exact trainable weights.
    output = layer(*inputs, **call_kwargs)
    assert tuple(output.shape) == tuple(expected_output_shape)
    assert keras.backend.standardize_dtype(output.dtype) == layer.compute_dtype
    shapes = {w.path.split("/")[-1]: tuple(w.shape) for w in layer.trainable_weights}
    assert shapes == {k: tuple(v) for k, v in expected_trainable_weight_shapes.items()}

    # Symbolic call with an unknown batch size agrees with compute_output_shape
    # (Keras's harness calls with the batch size known).
    symbolic_inputs = [
        keras.KerasTensor((None,) + tuple(np.shape(x))[1:], dtype=str(np.asarray(x).dtype))
        for x in inputs
    ]
    symbolic = layer_cls(**init_kwargs)(*symbolic_inputs, **call_kwargs)
    assert tuple(symbolic.shape) == (None,) + tuple(expected_output_shape)[1:]
    computed = layer.compute_output_shape(*[tuple(x.shape) for x in symbolic_inputs])
    assert tuple(computed) == tuple(symbolic.shape)

    # Save and reload inside a model: same class, same outputs.
    model_inputs = [keras.Input(shape=tuple(np.shape(x))[1:], dtype=str(np.asarray(x).dtype))
                    for x in inputs]
    model = keras.Model(model_inputs, layer_cls(**init_kwargs)(*model_inputs, **call_kwargs))
    path = str(tmp_path / f"{layer_cls.__name__}.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path)
    assert type(reloaded.layers[-1]) is layer_cls
    np.testing.assert_allclose(
        np.asarray(reloaded.predict(list(inputs), verbose=0)),
        np.asarray(model.predict(list(inputs), verbose=0)),
        rtol=1e-6,
        atol=1e-6,
    )
    return layer, output
