"""The arrays behind the figures, for notebooks as well: predictions, perturbations,
routing couplings, confusion matrices, logs, learning rates and mosaics.

The model may be a training `CapsNet` or a loaded SavedModel export; both
are read through the same small adapter.
"""

import csv
import math
import os

import numpy as np
import tensorflow as tf

from capsnet_tf.figures.style import PERTURBATION_VALUES
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


def load_test_images(
    dataset="mnist",
    num_examples=None,
    data_dir=None,
    seed=0,
    test_pairs_per_image=1,
    affnist_path=None,
    shift=None,
    **image_source,
):
    """The first test images of a data set, as numpy arrays.

    Args:
        dataset: a name of `capsnet_tf.data.registry.DATASETS`: the TFDS
            test split of `"mnist"` / `"fashion_mnist"`, or the generated
            test sets of `"multi_mnist"`, `"expanded_mnist"`, `"affnist"`
            (fixed by `seed`), or the preprocessed `"cifar10"` /
            `"smallnorb"` test images.
        num_examples: how many (None: the whole test split).
        data_dir: TFDS data directory (see `capsnet_tf.data.resolve_data_dir`).
        seed: seed of generated test sets (the run's `--seed`).
        test_pairs_per_image: `multi_mnist` test set size.
        affnist_path: real affNIST data for `"affnist"`.
        shift: the run's `--shift` (sets the MultiMNIST canvas and the
            expanded-MNIST test translation; None: the pipeline's default).
        **image_source: `image_folder`, `image_size`, `test_fraction` of a
            run on an image folder (`dataset="image_folder"`) or on another
            TFDS data set (see `capsnet_tf.data.registry.load_experiment_data`).

    Returns:
        `(images, labels)`: float32 `[n, H, W, C]` (in [0, 1] for the MNIST
        family) and int32 `[n]` (`[n, 2]` for `multi_mnist`).

    Raises:
        capsnet_tf.data.DatasetNotFoundError: the data set is not prepared.
    """
    from capsnet_tf.data.pipeline import load_tfds_split

    if dataset not in ("mnist", "fashion_mnist"):
        from capsnet_tf.data.registry import load_experiment_data

        data, _ = load_experiment_data(
            dataset, "test", 1000, training=False, seed=seed, shift=shift, data_dir=data_dir,
            reconstruction=False, take=num_examples,
            test_pairs_per_image=test_pairs_per_image, affnist_path=affnist_path,
            **image_source,
        )
        batches = list(data.as_numpy_iterator())
        return (
            np.concatenate([inputs["image"] for inputs, _ in batches]).astype("float32"),
            np.concatenate([targets["length"] for _, targets in batches]).astype("int32"),
        )
    data, _ = load_tfds_split(dataset, "test", data_dir)
    if num_examples is not None:
        data = data.take(num_examples)
    shape = tuple(data.element_spec[0].shape)
    images, labels = [np.zeros((0, *shape), "uint8")], [np.zeros((0,), "int64")]
    for image, label in data.batch(1000).as_numpy_iterator():
        images.append(image)
        labels.append(label)
    return (
        np.concatenate(images).astype("float32") / 255.0,
        np.concatenate(labels).astype("int32"),
    )



def _train_examples(config, data_dir):
    """Training examples per epoch of a run's configuration."""
    from capsnet_tf.data.pipeline import load_tfds_split

    if config.get("train_examples"):
        return int(config["train_examples"])
    dataset = config.get("dataset", "mnist")
    if dataset == "image_folder":
        from capsnet_tf.data.registry import scan_folder

        folder = scan_folder(config["image_folder"], config.get("image_size"),
                             config.get("test_fraction", 0.2), config.get("seed", 0))
        return len(folder.splits["train"][0])
    source = {"multi_mnist": "mnist", "expanded_mnist": "mnist"}.get(dataset, dataset)
    _, info = load_tfds_split(source, "train", data_dir)
    return info.splits["train"].num_examples



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



def reconstruction_mosaic(images, reconstructions, gap=2):
    """One image: inputs in the top row, their reconstructions below.

    Args:
        images: `[n, H, W, C]` in [0, 1].
        reconstructions: `[n, H, W, C]`.
        gap: pixels between tiles (filled with 0.5 grey).

    Returns:
        float32 `[2 * H + gap, n * W + (n - 1) * gap, C]`.

    Example:

    >>> import numpy as np
    >>> reconstruction_mosaic(np.ones((3, 4, 4, 1)), np.zeros((3, 4, 4, 1))).shape
    (10, 16, 1)
    """
    images = np.asarray(images, "float32")
    reconstructions = np.asarray(reconstructions, "float32")
    count, height, width, channels = images.shape
    mosaic = np.full(
        (2 * height + gap, count * width + (count - 1) * gap, channels), 0.5, "float32"
    )
    for index in range(count):
        left = index * (width + gap)
        mosaic[:height, left:left + width] = images[index]
        mosaic[height + gap:, left:left + width] = reconstructions[index]
    return mosaic



def two_colour(first, second):
    """Two single-channel images as one RGB image: `first` red, `second` green.

    Where both are bright the pixel is yellow, as in the paper's Figure 5.

    Args:
        first: `[..., H, W, 1]` (or `[..., H, W]`) in [0, 1].
        second: same shape.

    Returns:
        float32 `[..., H, W, 3]` in [0, 1], blue zero.

    Example:

    >>> import numpy as np
    >>> two_colour(np.ones((2, 2, 1)), np.zeros((2, 2, 1)))[0, 0].tolist()
    [1.0, 0.0, 0.0]
    """
    first = np.asarray(first, "float32")
    second = np.asarray(second, "float32")
    if first.shape[-1:] == (1,):
        first, second = first[..., 0], second[..., 0]
    colour = np.stack([first, second, np.zeros_like(first)], axis=-1)
    return np.clip(colour, 0.0, 1.0)



def _mosaic(grid, gap=2):
    """`[rows, columns, H, W, C]` images -> one `[rows*H + gaps, columns*W + gaps]` image."""
    rows, columns, height, width = grid.shape[:4]
    mosaic = np.full(
        (rows * (height + gap) - gap, columns * (width + gap) - gap), np.nan, "float32"
    )
    for row in range(rows):
        for column in range(columns):
            top, left = row * (height + gap), column * (width + gap)
            mosaic[top:top + height, left:left + width] = grid[row, column, ..., 0]
    return mosaic
