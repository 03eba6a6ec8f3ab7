"""One baseline check for every layer, after keras/src/testing/test_case.py."""

import keras
import numpy as np


def run_layer_test(
    layer_cls,
    init_kwargs,
    input_data,
    expected_output_shape,
    expected_trainable_weight_shapes,
    tmp_path,
    call_kwargs=None,
):
    """Config round trip, build, symbolic and eager shapes, `.keras` reload.

    Args:
        layer_cls: the layer class.
        init_kwargs: constructor arguments.
        input_data: NumPy input (a tuple for several call arguments).
        expected_output_shape: the eager output shape.
        expected_trainable_weight_shapes: dict name -> shape of trainable
            weights, exactly.
        tmp_path: a directory for the saved model.
        call_kwargs: extra keyword arguments of `call`.

    Returns:
        The eagerly called layer and its output.
    """
    call_kwargs = call_kwargs or {}
    inputs = input_data if isinstance(input_data, tuple) else (input_data,)

    # 1. Config round trip, and serialization without custom_objects.
    layer = layer_cls(**init_kwargs)
    config = layer.get_config()
    assert layer_cls.from_config(config).get_config() == config
    serialized = keras.saving.serialize_keras_object(layer)
    restored = keras.saving.deserialize_keras_object(serialized)
    assert type(restored) is layer_cls
    assert restored.get_config() == config

    # 2-3. Eager call: shape, dtype, exact trainable weights.
    output = layer(*inputs, **call_kwargs)
    assert tuple(output.shape) == tuple(expected_output_shape)
    assert keras.backend.standardize_dtype(output.dtype) == layer.compute_dtype
    shapes = {w.path.split("/")[-1]: tuple(w.shape) for w in layer.trainable_weights}
    assert shapes == {k: tuple(v) for k, v in expected_trainable_weight_shapes.items()}

    # Symbolic call agrees with compute_output_shape and the eager shape.
    symbolic_inputs = [
        keras.KerasTensor((None,) + tuple(np.shape(x))[1:], dtype=str(np.asarray(x).dtype))
        for x in inputs
    ]
    symbolic = layer_cls(**init_kwargs)(*symbolic_inputs, **call_kwargs)
    assert tuple(symbolic.shape) == (None,) + tuple(expected_output_shape)[1:]
    computed = layer.compute_output_shape(*[tuple(x.shape) for x in symbolic_inputs])
    assert tuple(computed) == tuple(symbolic.shape)

    # 7. Save and reload inside a model: same class, same outputs.
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
