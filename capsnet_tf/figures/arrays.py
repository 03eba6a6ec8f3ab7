"""The arrays behind the figures, for notebooks as well: predictions, perturbations,
routing couplings, confusion matrices, logs, learning rates and mosaics.

The model may be a training `CapsNet` or a loaded SavedModel export; both
are read through the same small adapter. The test images come from
`capsnet_tf.data.samples` and the mosaics from `capsnet_tf.mosaics`; they
are imported here too, where notebooks found them before.
"""

import csv
import math
import os

import numpy as np
import tensorflow as tf

from capsnet_tf.data.samples import load_test_images
from capsnet_tf.figures.style import PERTURBATION_VALUES
from capsnet_tf.mosaics import reconstruction_mosaic, two_colour
from capsnet_tf.schedules import make_schedule

__all__ = [
    "confusion_matrix",
    "learning_rates",
    "load_test_images",
    "perturbation_grid",
    "predict",
    "read_training_log",
    "reconstruction_mosaic",
    "routing_couplings",
    "two_colour",
]


def _masked(capsules, class_ids):
    """Capsules `[b, classes, dim]` with all but `class_ids` `[b]` zeroed."""
    capsules = np.asarray(capsules, "float32")
    mask = np.eye(capsules.shape[1], dtype="float32")[np.asarray(class_ids)]
    return capsules * mask[..., None]



class _KerasCapsNet:
    """The `predict` / `decode` view of a Keras `CapsNet`."""

    def __init__(self, model):
        self.model = model
        inference = model.inference_model()
        # A graph per batch shape: no Python between the ops, unlike eager calls.
        self.inference = tf.function(
            lambda images: inference(images, training=False), reduce_retracing=True
        )
        self.decoder = model.get_layer("decoder") if model.reconstruction else None
        self.num_classes = model.num_classes
        self.reconstruction = bool(model.reconstruction)

    def predict(self, images, batch_size):
        outputs = {"length": [], "capsules": [], "reconstruction": []}
        for start in range(0, len(images), batch_size):
            batch = self.inference(tf.constant(images[start:start + batch_size]))
            for name in outputs:
                if name in batch:
                    outputs[name].append(np.asarray(batch[name]))
        outputs = {name: np.concatenate(values) for name, values in outputs.items() if values}
        outputs["predictions"] = outputs["length"].argmax(-1).astype("int32")
        return outputs

    def decode(self, capsules, class_ids, batch_size):
        if self.decoder is None:
            raise ValueError("This CapsNet was built with reconstruction=False: no decoder.")
        masked = _masked(capsules, class_ids)
        return np.concatenate([
            np.asarray(self.decoder(masked[start:start + batch_size], training=False))
            for start in range(0, len(masked), batch_size)
        ])



class _SavedModelCapsNet:
    """The `predict` / `decode` view of an exported SavedModel.

    Uses the `serving_float` signature (float32 images -> probabilities,
    class_ids, capsules, reconstruction) and, when the model has a decoder,
    the `decode` signature (capsules [b, classes, dim] + class_ids [b] ->
    reconstruction) written by `capsnet_tf.export`.
    """

    def __init__(self, path):
        self.path = path if isinstance(path, (str, os.PathLike)) else None
        self.loaded = tf.saved_model.load(os.fspath(path)) if self.path else path
        if "serving_float" not in self.loaded.signatures:
            raise ValueError(
                f"The SavedModel {self.path or ''} has no 'serving_float' signature (it has "
                f"{sorted(self.loaded.signatures)}); export it with experiments/export.py."
            )
        self.serving = self.loaded.signatures["serving_float"]
        (self.image_key,) = self.serving.structured_input_signature[1]
        self.num_classes = int(self.serving.structured_outputs["capsules"].shape[1])
        self.reconstruction = "decode" in self.loaded.signatures
        if self.reconstruction:
            self.decoder = self.loaded.signatures["decode"]
            specs = self.decoder.structured_input_signature[1]
            self.capsules_key = next(k for k, spec in specs.items() if spec.shape.rank == 3)
            self.class_ids_key = next(k for k, spec in specs.items() if spec.shape.rank == 1)
            self.class_ids_dtype = specs[self.class_ids_key].dtype

    def predict(self, images, batch_size):
        outputs = {"length": [], "capsules": [], "reconstruction": [], "predictions": []}
        for start in range(0, len(images), batch_size):
            batch = self.serving(**{self.image_key: tf.constant(images[start:start + batch_size])})
            outputs["length"].append(batch["probabilities"].numpy())
            outputs["capsules"].append(batch["capsules"].numpy())
            if "reconstruction" in batch:
                outputs["reconstruction"].append(batch["reconstruction"].numpy())
            outputs["predictions"].append(batch["class_ids"].numpy().astype("int32"))
        return {name: np.concatenate(values) for name, values in outputs.items() if values}

    def decode(self, capsules, class_ids, batch_size):
        if not self.reconstruction:
            raise ValueError(f"The SavedModel {self.path or ''} has no 'decode' signature.")
        capsules = np.asarray(capsules, "float32")
        class_ids = np.asarray(class_ids)
        return np.concatenate([
            self.decoder(**{
                self.capsules_key: tf.constant(capsules[start:start + batch_size]),
                self.class_ids_key: tf.constant(class_ids[start:start + batch_size],
                                                self.class_ids_dtype),
            })["reconstruction"].numpy()
            for start in range(0, len(capsules), batch_size)
        ])



def _adapter(model):
    """A `predict` / `decode` view of a CapsNet, a SavedModel path or a loaded SavedModel."""
    if isinstance(model, (_KerasCapsNet, _SavedModelCapsNet)):
        return model
    if isinstance(model, (str, os.PathLike)) or hasattr(model, "signatures"):
        return _SavedModelCapsNet(model)
    return _KerasCapsNet(model)



def predict(model, images, batch_size=100):
    """Runs a CapsNet on images without labels (reconstruction of the longest capsule).

    Args:
        model: a `capsnet_tf.CapsNet` (the training model, weights loaded),
            or a SavedModel written by `capsnet_tf.export.export_saved_model`
            (its path or what `tf.saved_model.load` returned; the
            `serving_float` signature is used).
        images: float32 `[n, H, W, C]` in [0, 1].
        batch_size: images per forward pass.

    Returns:
        Dict of numpy arrays: `"length"` `[n, classes]`, `"capsules"`
        `[n, classes, dim]`, `"predictions"` `[n]` (the longest capsule) and,
        when the model reconstructs, `"reconstruction"` `[n, H, W, C]`.

    Example:

    >>> from capsnet_tf.workdir import load_trained_model
    >>> model, _ = load_trained_model("/tmp/capsnet_mnist")  # doctest: +SKIP
    >>> images, labels = load_test_images("mnist", 100)  # doctest: +SKIP
    >>> outputs = predict(model, images)  # doctest: +SKIP
    >>> (outputs["predictions"] == labels).mean()  # doctest: +SKIP
    0.99
    """
    return _adapter(model).predict(np.asarray(images, "float32"), batch_size)



def perturbation_grid(model, capsules, class_id, values=PERTURBATION_VALUES):
    """Decoder outputs with each capsule dimension perturbed: the paper's Figure 4.

    The capsule of `class_id` is kept and all other classes are zeroed (as
    the decoder saw them in training); dimension `d` of the kept capsule gets
    `values[v]` added, everything else unchanged, and the decoder redraws
    the digit.

    Args:
        model: a `capsnet_tf.CapsNet` with a decoder, or an exported
            SavedModel (path or loaded object; its `decode` signature is used).
        capsules: the class capsules of one image, `[classes, dim]`.
        class_id: the class whose capsule is perturbed (normally the
            predicted one).
        values: the perturbations added, `[num_values]`.

    Returns:
        float32 `[dim, num_values, H, W, C]`: row `d` is dimension `d`
        perturbed by each value; the column of value 0 is the plain
        reconstruction.

    Example:

    >>> outputs = predict(model, images[:1])  # doctest: +SKIP
    >>> class_id = int(outputs["predictions"][0])  # doctest: +SKIP
    >>> perturbation_grid(model, outputs["capsules"][0], class_id).shape  # doctest: +SKIP
    (16, 11, 28, 28, 1)
    """
    capsules = np.asarray(capsules, "float32")
    values = np.asarray(values, "float32")
    num_classes, dim = capsules.shape
    batch = np.repeat(capsules[None], dim * len(values), axis=0)
    batch = batch.reshape(dim, len(values), num_classes, dim)
    batch[np.arange(dim), :, class_id, np.arange(dim)] += values[None, :]
    batch = batch.reshape(-1, num_classes, dim)
    images = _adapter(model).decode(batch, np.full(len(batch), class_id), batch_size=256)
    return images.reshape((dim, len(values)) + images.shape[1:])



def _primary_grid_shape(model):
    """(types, rows, columns) of the primary capsule maps."""
    primary = model.get_layer("primary_capsules")
    conv = model.get_layer("conv1")
    shape = conv.compute_output_shape((None,) + tuple(model.image_shape))
    sizes = []
    for length in shape[1:3]:
        if primary.padding == "same":
            sizes.append(math.ceil(length / primary.strides))
        else:
            sizes.append((length - primary.kernel_size) // primary.strides + 1)
    return (primary.num_capsule_types, *sizes)



def routing_couplings(model, image):
    """Coupling coefficients of every routing iteration for one image.

    Args:
        model: a `capsnet_tf.CapsNet`.
        image: one image `[H, W, C]`, float in [0, 1].

    Returns:
        Dict of numpy arrays: `"couplings"` `[iterations, types, rows,
        columns, classes]` (primary capsules in their type-major order
        reshaped to their maps: 32 x 6 x 6 for MNIST; summing over classes
        gives 1), `"primary_lengths"` `[types, rows, columns]` (length of each
        primary capsule), `"lengths"` `[classes]` and `"prediction"` (int).

    Example:

    >>> routing = routing_couplings(model, images[0])  # doctest: +SKIP
    >>> routing["couplings"].shape  # doctest: +SKIP
    (3, 32, 6, 6, 10)

    For MNIST: 3 iterations, 32 capsule types, a 6 x 6 grid and 10 classes.
    """
    image = np.asarray(image, "float32")[None]
    features = model.get_layer("conv1")(image)
    primary = model.get_layer("primary_capsules")(features)
    capsules, couplings = model.get_layer("class_capsules")(primary, return_couplings=True)
    grid = _primary_grid_shape(model)
    couplings = np.asarray(couplings)[0]  # [iterations, input_capsules, classes]
    lengths = np.linalg.norm(np.asarray(capsules)[0], axis=-1)
    return {
        "couplings": couplings.reshape((couplings.shape[0], *grid, couplings.shape[-1])),
        "primary_lengths": np.linalg.norm(np.asarray(primary)[0], axis=-1).reshape(grid),
        "lengths": lengths,
        "prediction": int(lengths.argmax()),
    }



def confusion_matrix(labels, predictions, num_classes):
    """Counts of (true class, predicted class) pairs.

    Args:
        labels: int `[n]` true classes.
        predictions: int `[n]` predicted classes.
        num_classes: number of classes.

    Returns:
        int64 `[num_classes, num_classes]`: row = true class, column =
        predicted class.

    Example:

    >>> confusion_matrix([0, 1, 1, 2], [0, 1, 2, 2], 3).tolist()
    [[1, 0, 0], [0, 1, 1], [0, 0, 1]]
    """
    matrix = np.zeros((num_classes, num_classes), "int64")
    np.add.at(matrix, (np.asarray(labels), np.asarray(predictions)), 1)
    return matrix



def read_training_log(path):
    """The CSV log of a run as `{column: float64 array}`, rows in file order.

    Args:
        path: `training_log.csv` written by Keras' `CSVLogger`.

    Returns:
        Dict of numpy arrays, one per column; empty when the file has no rows.
    """
    with open(path, newline="") as file:
        rows = list(csv.DictReader(file))
    if not rows:
        return {}
    return {
        name: np.array([float(row[name]) if row.get(name) else np.nan for row in rows])
        for name in rows[0]
    }



def learning_rates(config, epochs, train_examples):
    """The learning rate at the end of each epoch, from the run's schedule.

    The rate is not logged; it follows from the run's schedule at
    step `(epoch + 1) * steps_per_epoch`, with `steps_per_epoch` from the
    config or `ceil(train_examples / batch_size)`.

    Args:
        config: the run's `ExperimentConfig` (or a dict of `config.json`).
        epochs: epoch indices (0-based, as in the CSV log).
        train_examples: training examples of the data set (used when the
            config sets neither `steps_per_epoch` nor `train_examples`).

    Returns:
        float64 `[len(epochs)]`.

    Example:

    >>> config = {"learning_rate": 1e-3, "decay_steps": 2000, "decay_rate": 0.96,
    ...           "minimum_learning_rate": 1e-6, "batch_size": 128,
    ...           "steps_per_epoch": None, "train_examples": None}
    >>> learning_rates(config, [0, 1], 60000).round(8).tolist()  # steps 469, 938
    [0.00099047, 0.00098104]
    """
    if not isinstance(config, dict):
        config = vars(config)
    steps = config.get("steps_per_epoch")
    if not steps:
        examples = config.get("train_examples") or train_examples
        examples = min(examples, train_examples) if train_examples else examples
        steps = math.ceil(examples / config["batch_size"])
    schedule = make_schedule(config, steps)
    return np.array([float(schedule((int(epoch) + 1) * steps)) for epoch in epochs])
