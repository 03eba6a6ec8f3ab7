"""Deployment beyond TensorFlow: quantized TFLite files for LiteRT, and ONNX.

Everything here starts from a trained CapsNet or its SavedModel
(`capsnet_tf.export.export_saved_model`) and needs the `export` extra
(`pip install -e ".[export]"`: `ai-edge-litert`, `tf2onnx`, `onnxruntime`);
without it each function raises `MissingDependencyError` naming the extra.

- `litert_interpreter(path)`: LiteRT's interpreter (`ai_edge_litert`), the
  successor of the deprecated `tf.lite.Interpreter`, for every `.tflite` file.
- `quantize_tflite(model, mode, images)`: `model_<mode>.tflite`
  with the classification signature `serving_float` only:
  - `dynamic`: int8 weights, float activations (weights quantized once,
    activations on the fly);
  - `float16`: float16 weights, computed in float32;
  - `int8`: full-integer weights and activations, calibrated on a
    representative sample of training images, with integer (uint8) input and
    output: the input's scale is 1/255, so a pixel's uint8 value is passed as
    it is. The model is converted with its routing unrolled
    (`kernels="straight_line"`): inside `WHILE` loops the tensors of all
    routing iterations share one int8 scale, which the routing logits (zero
    at first, large at the end) do not survive (docs/serving.md).
- `convert_to_onnx(saved_model_dir, path)`: `model.onnx` through tf2onnx,
  the routing loop as an ONNX `Loop` (as the SavedModel's `While`: the
  iteration count stays a property of the model, not of the converter).
- `classify(runtime, images)`: the classes and probabilities of any of them
  on uint8 images, to compare formats on a whole test set.
"""

import os

import numpy as np

from capsnet_tf.extras import require

__all__ = [
    "ONNX_FILE",
    "QUANTIZATIONS",
    "check_export_extra",
    "classify",
    "convert_to_onnx",
    "litert_interpreter",
    "onnx_session",
    "quantize_tflite",
    "quantized_tflite_name",
]

QUANTIZATIONS = ("dynamic", "float16", "int8")
ONNX_FILE = "model.onnx"
_SIGNATURE = "serving_float"


def check_export_extra(onnx=True, tflite=True):
    """Raises `MissingDependencyError` naming the `export` extra if a package is missing."""
    if tflite:
        require("ai_edge_litert.interpreter", "export", "Running TFLite models with LiteRT")
    if onnx:
        require("tf2onnx", "export", "Converting to ONNX")
        require("onnxruntime", "export", "Running ONNX models")


def quantized_tflite_name(mode):
    """`model_<mode>.tflite`, the file name of a quantized model."""
    return f"model_{mode}.tflite"


def litert_interpreter(model_path=None, model_content=None, num_threads=None):
    """A LiteRT `Interpreter` of a `.tflite` file (or its bytes), tensors allocated."""
    litert = require("ai_edge_litert.interpreter", "export", "Running TFLite models with LiteRT")
    interpreter = litert.Interpreter(
        model_path=None if model_path is None else os.fspath(model_path),
        model_content=model_content,
        num_threads=num_threads,
    )
    interpreter.allocate_tensors()
    return interpreter


def _converter(saved_model_dir):
    import tensorflow as tf

    return tf.lite.TFLiteConverter.from_saved_model(
        os.fspath(saved_model_dir), signature_keys=[_SIGNATURE]
    )


def _representative(images, batch_size=1):
    """The calibration inputs: float32 images in [0, 1], one small batch at a time."""
    images = np.asarray(images)
    if images.ndim == 3:
        images = images[..., None]
    scaled = images.astype(np.float32) / (255.0 if images.dtype == np.uint8 else 1.0)

    def generate():
        for start in range(0, len(scaled), batch_size):
            yield {"images": scaled[start:start + batch_size]}

    return generate


def quantize_tflite(source, mode, images=None, output_path=None):
    """Converts the classification signature of a CapsNet to a quantized TFLite model.

    Args:
        source: the Keras `CapsNet` (or its `inference_model()`), which is
            exported with portable forms and straight-line routing for the
            conversion (`kernels="straight_line"`, see `capsnet_tf.kernels`),
            or a directory written by `export_saved_model`. Give the model for
            `int8`: an ordinary export keeps the routing in `WHILE` loops,
            whose tensors share one int8 scale across the iterations, and the
            quantized model then loses most of its accuracy.
        mode: one of `QUANTIZATIONS`.
        images: for `int8`, the calibration sample (uint8 `[n, H, W(, C)]`,
            e.g. a few hundred training images; never test images).
        output_path: where to write the file (None: do not write).

    Returns:
        The flatbuffer as bytes.

    Raises:
        ValueError: unknown `mode`, or `int8` without `images`.
    """
    if not isinstance(source, (str, os.PathLike)):
        import tempfile

        from capsnet_tf.export import export_saved_model

        with tempfile.TemporaryDirectory() as directory:
            saved = export_saved_model(
                source, directory, verify=False, kernels="straight_line"
            )
            return quantize_tflite(saved, mode, images, output_path)
    import tensorflow as tf

    if mode not in QUANTIZATIONS:
        raise ValueError(f"`mode` must be one of {QUANTIZATIONS}. Received: mode={mode!r}")
    converter = _converter(source)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if mode == "float16":
        converter.target_spec.supported_types = [tf.float16]
    elif mode == "int8":
        if images is None or len(images) == 0:
            raise ValueError("int8 quantization needs calibration `images`. Received: none.")
        converter.representative_dataset = _representative(images)
        converter.inference_input_type = tf.uint8
        converter.inference_output_type = tf.uint8
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    flatbuffer = converter.convert()
    if output_path is not None:
        with open(output_path, "wb") as file:
            file.write(flatbuffer)
    return flatbuffer


def convert_to_onnx(saved_model_dir, output_path, opset=17):
    """Converts the classification signature of an export to ONNX with tf2onnx.

    Args:
        saved_model_dir: a directory written by `export_saved_model`.
        output_path: the `.onnx` file to write.
        opset: the ONNX opset.

    Returns:
        The `onnx.ModelProto`.
    """
    require("onnx", "export", "Converting to ONNX")
    tf2onnx = require("tf2onnx", "export", "Converting to ONNX")
    import tensorflow as tf

    loaded = tf.saved_model.load(os.fspath(saved_model_dir))
    signature = loaded.signatures[_SIGNATURE]
    spec = signature.structured_input_signature[1]["images"]
    spec = tf.TensorSpec(spec.shape, spec.dtype, name="images")

    @tf.function(input_signature=[spec])
    def classify_images(images):  # tf2onnx converts tf.functions, not loaded signatures
        return signature(images=images)

    model, _ = tf2onnx.convert.from_function(
        classify_images, input_signature=[spec], opset=opset, output_path=os.fspath(output_path)
    )
    return model


def onnx_session(path, threads=None):
    """An ONNX Runtime `InferenceSession` of `path` on the CPU."""
    onnxruntime = require("onnxruntime", "export", "Running ONNX models")
    options = onnxruntime.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    return onnxruntime.InferenceSession(
        os.fspath(path), options, providers=["CPUExecutionProvider"]
    )


def classify(runtime, images, batch_size=100):
    """`(class_ids, probabilities)` of uint8 images `[n, H, W, C]` by any format.

    Args:
        runtime: a loaded SavedModel (`tf.saved_model.load`), a LiteRT
            interpreter (float or quantized `.tflite`) or an ONNX Runtime
            session, each of an export of `capsnet_tf.export`.
        images: uint8 images.
        batch_size: images per call (the TFLite and ONNX models take any
            batch size).

    Returns:
        int `[n]` class ids and float32 `[n, num_classes]` probabilities
        (dequantized for an int8 model).
    """
    images = np.asarray(images)
    ids, probabilities = [], []
    for start in range(0, len(images), batch_size):
        batch = images[start:start + batch_size]
        class_ids, scores = _run(runtime, batch)
        ids.append(np.asarray(class_ids).astype(np.int64))
        probabilities.append(np.asarray(scores, dtype=np.float32))
    return np.concatenate(ids), np.concatenate(probabilities)


def _run(runtime, batch):
    if hasattr(runtime, "signatures"):  # a SavedModel
        outputs = runtime.signatures["serving_default"](images=batch)
        return outputs["class_ids"].numpy(), outputs["probabilities"].numpy()
    if hasattr(runtime, "get_signature_runner"):  # LiteRT
        names = runtime.get_signature_list()
        key = "serving_default" if "serving_default" in names else _SIGNATURE
        runner = runtime.get_signature_runner(key)
        details = runner.get_input_details()["images"]
        if details["dtype"] == np.uint8 and key == _SIGNATURE:
            scale, zero = details["quantization"]
            if (scale, zero) != (0.0, 0):
                inputs = np.round(batch / (255.0 * scale) + zero).astype(np.uint8)
            else:
                inputs = batch
        elif details["dtype"] == np.float32 and key == _SIGNATURE:
            inputs = batch.astype(np.float32) / 255.0
        else:
            inputs = batch
        outputs = runner(images=inputs)
        probabilities = outputs["probabilities"]
        scale, zero = runner.get_output_details()["probabilities"]["quantization"]
        if probabilities.dtype != np.float32 and scale:
            probabilities = (probabilities.astype(np.float32) - zero) * scale
        return outputs["class_ids"], probabilities
    # ONNX Runtime: the serving_float signature, float32 images in [0, 1]
    names = [output.name for output in runtime.get_outputs()]
    values = runtime.run(None, {runtime.get_inputs()[0].name: batch.astype(np.float32) / 255.0})
    outputs = dict(zip(names, values, strict=True))
    return outputs[_find(names, "class_ids")], outputs[_find(names, "probabilities")]


def _find(names, wanted):
    return next(name for name in names if name.split(":")[0].endswith(wanted))
