"""Figures of a trained CapsNet: reconstructions, perturbations, curves, routing.

Two kinds of functions, free of flags so that a notebook can call them too:

- functions returning arrays (`predict`, `perturbation_grid`,
  `routing_couplings`, `confusion_matrix`, `learning_rates`,
  `read_training_log`, `reconstruction_mosaic`);
- functions writing one PNG each with matplotlib (`plot_reconstructions`,
  `plot_perturbations`, `plot_training_curves`, `plot_confusion_matrix`,
  `plot_routing`), and `write_figures`, which makes all of them for a work
  directory of `capsnet_tf.training.train_and_evaluate` (what
  `experiments/visualize.py` calls).

Every figure has a fixed size in inches (`FIGURE_SIZES`) and is saved at a
given `dpi` without tight cropping, so a PNG is exactly
`FIGURE_SIZES[name] * dpi` pixels. Figures are drawn on matplotlib's Agg
canvas without pyplot: no display is needed, and pyplot's backend (a
notebook's inline plots) is left as it is.

`ReconstructionImages` is a Keras callback that writes inputs over their
reconstructions into TensorBoard at the end of every epoch.

For a MultiMNIST work directory (two targets) `write_figures` draws the
paper's Figure 5 (`plot_multimnist_separations`: each of the two longest
capsules reconstructed alone, in red and green over the input) instead of
the one-digit reconstruction, perturbation and confusion figures.

Reference:
    Sabour et al., 2017, arXiv:1710.09829, figures 3 (reconstructions), 4
    (dimension perturbations) and 5 (MultiMNIST separations).
"""

import csv
import math
import os

import keras
import matplotlib.colors
import matplotlib.patches
import numpy as np
import tensorflow as tf
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from capsnet_tf.schedules import FlooredExponentialDecay

__all__ = [
    "DPI",
    "FIGURE_NAMES",
    "FIGURE_SIZES",
    "PERTURBATION_VALUES",
    "RECONSTRUCTION_POOL",
    "ReconstructionImages",
    "confusion_matrix",
    "learning_rates",
    "load_test_images",
    "perturbation_grid",
    "plot_confusion_matrix",
    "plot_multimnist_separations",
    "plot_perturbations",
    "plot_reconstructions",
    "plot_routing",
    "plot_training_curves",
    "predict",
    "read_training_log",
    "reconstruction_mosaic",
    "routing_couplings",
    "two_colour",
    "write_figures",
]

DPI = 100
# (width, height) in inches of every figure; the PNG is this times the dpi.
FIGURE_SIZES = {
    "reconstructions": (10.0, 8.0),
    "perturbations": (8.0, 9.5),
    "training_curves": (15.0, 5.0),
    "confusion_matrix": (8.0, 7.0),
    "routing": (15.0, 3.6),
    "multimnist": (12.0, 6.0),
}
FIGURE_NAMES = tuple(FIGURE_SIZES)
# The paper's Figure 4: -0.25 to 0.25 in steps of 0.05 (11 values).
PERTURBATION_VALUES = np.round(np.linspace(-0.25, 0.25, 11), 2)

# Test images classified for the reconstruction and perturbation figures when
# no confusion matrix is asked for (whose whole test set would serve as well).
RECONSTRUCTION_POOL = 1000
_WRONG = "tab:red"
_RIGHT = "black"


# --------------------------------------------------------------------------
# Arrays
# --------------------------------------------------------------------------


def load_test_images(
    dataset="mnist",
    num_examples=None,
    data_dir=None,
    seed=0,
    test_pairs_per_image=1,
    affnist_path=None,
    shift=None,
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
        # A graph per batch shape: ~1.4x faster than eager calls on a CPU.
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

    >>> from capsnet_tf.training import load_trained_model
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

    The rate is not logged; it follows from `FlooredExponentialDecay` at
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
    schedule = FlooredExponentialDecay(
        config["learning_rate"],
        config["decay_steps"],
        config["decay_rate"],
        config["minimum_learning_rate"],
    )
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


# --------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------


def _figure(name):
    """A figure drawn by the Agg canvas directly: headless, and it leaves
    pyplot's backend (a notebook's inline plots) untouched."""
    figure = Figure(figsize=FIGURE_SIZES[name])
    FigureCanvasAgg(figure)
    return figure


def _save(figure, path, dpi):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    figure.savefig(path, dpi=dpi)  # no bbox_inches: the size stays FIGURE_SIZES * dpi
    return path


def _show(axis, image, **kwargs):
    """Draws a [H, W, 1] or [H, W, 3] image on an axis without ticks."""
    image = np.asarray(image)
    if image.ndim == 3 and image.shape[-1] == 1:
        image = image[..., 0]
    drawn = axis.imshow(image, cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest",
                        **kwargs)
    axis.set_xticks([])
    axis.set_yticks([])
    return drawn


def plot_reconstructions(
    images,
    labels,
    reconstructions,
    predictions,
    path,
    wrong=None,
    columns=8,
    dpi=DPI,
    title="CapsNet reconstructions",
):
    """Inputs over their reconstructions, plus a row of misclassified examples.

    Args:
        images: `[n, H, W, C]` test inputs (n <= 2 * columns are drawn).
        labels: `[n]` true classes.
        reconstructions: `[n, H, W, C]`, from the predicted (longest) capsule.
        predictions: `[n]` predicted classes.
        path: PNG file to write.
        wrong: optional `(images, labels, reconstructions, predictions)` of
            misclassified examples for the last pair of rows (up to
            `columns`); an empty or missing one is said in the figure.
        columns: images per row.
        dpi: resolution; the PNG is `FIGURE_SIZES["reconstructions"] * dpi`.
        title: the figure's title.

    Returns:
        `path`.
    """
    blocks = []
    count = min(len(images), 2 * columns)
    for start in range(0, count, columns):
        stop = min(start + columns, count)
        blocks.append((
            f"test images {start + 1}-{stop}",
            images[start:stop], labels[start:stop],
            reconstructions[start:stop], predictions[start:stop],
        ))
    if wrong is not None and len(wrong[0]):
        blocks.append(("misclassified", *(array[:columns] for array in wrong)))
    else:
        blocks.append(("misclassified", None, None, None, None))

    figure = _figure("reconstructions")
    grid = figure.add_gridspec(
        2 * len(blocks), columns, left=0.13, right=0.88, top=0.86, bottom=0.03,
        hspace=0.45, wspace=0.08,
    )
    drawn = None
    for block_index, (kind, block_images, block_labels, block_recons, block_preds) in enumerate(
        blocks
    ):
        row = 2 * block_index
        if block_images is None:
            axis = figure.add_subplot(grid[row:row + 2, :])
            axis.axis("off")
            axis.text(0.5, 0.5, "no misclassified examples among the evaluated test images",
                      ha="center", va="center", fontsize=11)
            continue
        for column in range(columns):
            top = figure.add_subplot(grid[row, column])
            bottom = figure.add_subplot(grid[row + 1, column])
            if column >= len(block_images):
                top.axis("off")
                bottom.axis("off")
                continue
            drawn = _show(top, block_images[column])
            _show(bottom, block_recons[column])
            correct = int(block_labels[column]) == int(block_preds[column])
            top.set_title(
                f"true {int(block_labels[column])}, pred {int(block_preds[column])}",
                fontsize=8, color=_RIGHT if correct else _WRONG,
            )
            if column == 0:
                top.set_ylabel("input", fontsize=9)
                bottom.set_ylabel("reconstruction", fontsize=9)
        figure.text(
            0.02, 1.0 - (0.14 + 0.83 * (block_index + 0.5) / len(blocks)), kind,
            rotation=90, va="center", ha="center", fontsize=11, weight="bold",
        )
    figure.suptitle(title, fontsize=12, y=0.985)
    figure.text(
        0.5, 0.925, "each pair of rows: test inputs over the decoder's reconstructions "
        "from the predicted (longest) class capsule; titles: true and predicted class",
        ha="center", fontsize=9,
    )
    figure.legend(
        handles=[
            matplotlib.patches.Patch(color=_RIGHT, label="correct"),
            matplotlib.patches.Patch(color=_WRONG, label="misclassified"),
        ],
        loc="upper left", bbox_to_anchor=(0.885, 0.84), fontsize=8, frameon=False,
    )
    if drawn is not None:
        bar = figure.add_axes([0.91, 0.1, 0.015, 0.6])
        figure.colorbar(drawn, cax=bar, label="pixel intensity")
    return _save(figure, path, dpi)


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


def plot_multimnist_separations(
    images, labels, reconstructions, predictions, path, columns=8, dpi=DPI, title=None
):
    """The paper's Figure 5: MultiMNIST inputs and their two-colour separations.

    Args:
        images: `[n, H, W, 1]` overlapping-digit inputs (the first
            `2 * columns` are drawn, in two blocks of two rows).
        labels: `[n, 2]` the two true classes.
        reconstructions: `[n, 2, H, W, 1]`: the decoder's reconstructions
            from the longest and the second-longest class capsule.
        predictions: `[n, 2]` those two classes (longest first).
        path: PNG file to write.
        columns: examples per row.
        dpi: resolution; the PNG is `FIGURE_SIZES["multimnist"] * dpi`.
        title: the figure's title.

    Returns:
        `path`.
    """
    count = min(len(images), 2 * columns)
    figure = _figure("multimnist")
    rows = 2 * math.ceil(count / columns)
    grid = figure.add_gridspec(
        max(rows, 2), columns, left=0.08, right=0.84, top=0.84, bottom=0.03,
        hspace=0.5, wspace=0.08,
    )
    for index in range(count):
        row, column = 2 * (index // columns), index % columns
        top = figure.add_subplot(grid[row, column])
        bottom = figure.add_subplot(grid[row + 1, column])
        _show(top, images[index])
        bottom.imshow(two_colour(reconstructions[index, 0], reconstructions[index, 1]),
                      interpolation="nearest")
        bottom.set_xticks([])
        bottom.set_yticks([])
        true = sorted(int(label) for label in labels[index])
        predicted = [int(label) for label in predictions[index]]
        correct = true == sorted(predicted)
        top.set_title(f"L: {true[0]}, {true[1]}", fontsize=8,
                      color=_RIGHT if correct else _WRONG)
        bottom.set_title(f"R: {predicted[0]}, {predicted[1]}", fontsize=8,
                         color=_RIGHT if correct else _WRONG)
        if column == 0:
            top.set_ylabel("input", fontsize=9)
            bottom.set_ylabel("separation", fontsize=9)
    figure.suptitle(title or "CapsNet on MultiMNIST: each digit reconstructed from its own "
                    "capsule", fontsize=12, y=0.985)
    figure.text(
        0.5, 0.905, "L: true labels; R: the two longest class capsules, each reconstructed "
        "by the decoder alone and drawn in its own colour over black (yellow: both)",
        ha="center", fontsize=9,
    )
    figure.legend(
        handles=[
            matplotlib.patches.Patch(color="red", label="longest capsule"),
            matplotlib.patches.Patch(color="lime", label="second longest"),
            matplotlib.patches.Patch(color="yellow", label="both"),
            matplotlib.patches.Patch(color=_WRONG, label="labels text: wrong pair"),
        ],
        loc="upper left", bbox_to_anchor=(0.845, 0.8), fontsize=8, frameon=False,
    )
    return _save(figure, path, dpi)


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


def plot_perturbations(
    grid,
    path,
    image=None,
    label=None,
    class_id=None,
    values=PERTURBATION_VALUES,
    dpi=DPI,
    model_name="CapsNet",
):
    """The 16 x 11 grid of the paper's Figure 4 for one digit.

    Args:
        grid: `[dim, num_values, H, W, C]` from `perturbation_grid`.
        path: PNG file to write.
        image: optional input image `[H, W, C]`, drawn beside the grid.
        label: its true class (or classes), for the title.
        class_id: the class whose capsule was perturbed.
        values: the perturbation of each column.
        dpi: resolution; the PNG is `FIGURE_SIZES["perturbations"] * dpi`.
        model_name: names the model in the title (e.g. `"CapsNet, 1 epoch"`).

    Returns:
        `path`.
    """
    grid = np.asarray(grid)
    rows, columns, height, width = grid.shape[:4]
    gap = 2
    figure = _figure("perturbations")
    axis = figure.add_axes([0.19, 0.07, 0.68, 0.8])
    cmap = matplotlib.colormaps["gray"].with_extremes(bad="white")
    drawn = axis.imshow(
        _mosaic(grid, gap), cmap=cmap, vmin=0.0, vmax=1.0, interpolation="nearest"
    )
    axis.set_xticks([column * (width + gap) + width / 2 - 0.5 for column in range(columns)])
    axis.set_xticklabels([f"{value:+.2f}" for value in values], fontsize=8)
    axis.set_yticks([row * (height + gap) + height / 2 - 0.5 for row in range(rows)])
    axis.set_yticklabels([str(row + 1) for row in range(rows)], fontsize=8)
    axis.tick_params(length=0)
    for side in axis.spines.values():
        side.set_visible(False)
    axis.set_xlabel("value added to the dimension")
    axis.set_ylabel("dimension of the class capsule")
    middle = list(np.round(values, 6)).index(0.0) if 0.0 in np.round(values, 6) else None
    if middle is not None:
        axis.add_patch(matplotlib.patches.Rectangle(
            (middle * (width + gap) - 1.5, -1.5), width + 2, rows * (height + gap) - gap + 2,
            fill=False, edgecolor="tab:orange", linewidth=1.5,
        ))
    if image is not None:
        inset = figure.add_axes([0.02, 0.7, 0.12, 0.1])
        _show(inset, image)
        inset.set_title("input", fontsize=9)
    digit = "" if label is None else f"a test image of a {int(label)}: "
    figure.suptitle(
        f"{model_name}: perturbing the class-{class_id} capsule ({digit}predicted "
        f"{class_id})\n"
        "each row: one of its dimensions, moved from -0.25 to +0.25; the decoder "
        "redraws the digit\n(orange: unperturbed reconstruction)",
        fontsize=10,
    )
    bar = figure.add_axes([0.9, 0.25, 0.02, 0.45])
    figure.colorbar(drawn, cax=bar, label="pixel intensity")
    return _save(figure, path, dpi)


def plot_training_curves(log, path, rates=None, reconstruction_weight=None, dpi=DPI):
    """Loss terms, train/test accuracy and learning rate over the epochs.

    Args:
        log: `read_training_log`'s dict (columns `epoch`, `loss`,
            `length_loss`, `reconstruction_loss`, `length_accuracy` and the
            `val_` versions; missing ones are left out).
        path: PNG file to write.
        rates: learning rate at the end of each epoch (`learning_rates`), or
            None to leave that panel empty.
        reconstruction_weight: the weight of the reconstruction loss in the
            total, to draw the weighted term on the same scale.
        dpi: resolution; the PNG is `FIGURE_SIZES["training_curves"] * dpi`.

    Returns:
        `path`.
    """
    epochs = np.asarray(log["epoch"]) + 1 if log else np.array([])
    figure = _figure("training_curves")
    loss_axis, accuracy_axis, rate_axis = figure.subplots(1, 3)
    figure.subplots_adjust(left=0.06, right=0.98, top=0.85, bottom=0.28, wspace=0.3)
    style = {"marker": "o", "markersize": 4}
    terms = [("loss", "total loss", "tab:blue"), ("length_loss", "margin loss", "tab:orange")]
    weight = reconstruction_weight if reconstruction_weight else 1.0
    recon_label = (
        f"{reconstruction_weight:g} x reconstruction loss" if reconstruction_weight
        else "reconstruction loss"
    )
    terms.append(("reconstruction_loss", recon_label, "tab:green"))
    for key, name, colour in terms:
        scale = weight if key == "reconstruction_loss" else 1.0
        if key in log:
            loss_axis.plot(
                epochs, scale * log[key], color=colour, label=f"{name} (train)", **style
            )
        if f"val_{key}" in log:
            loss_axis.plot(epochs, scale * log[f"val_{key}"], color=colour, linestyle="--",
                           label=f"{name} (test)", **style)
    loss_axis.set_yscale("log")
    loss_axis.set(title="Loss terms", xlabel="epoch", ylabel="loss (log scale)")
    # Models without a decoder log plain "accuracy" (a single output).
    prefix = "length_" if "length_accuracy" in log else ""
    for key, name, colour in (
        (f"{prefix}accuracy", "train", "tab:blue"), (f"val_{prefix}accuracy", "test", "tab:red")
    ):
        if key in log:
            accuracy_axis.plot(epochs, 100 * log[key], color=colour, label=name,
                               linestyle="--" if name == "test" else "-", **style)
    accuracy_axis.set(title="Accuracy", xlabel="epoch", ylabel="accuracy (%)")
    if rates is not None and len(rates):
        rate_axis.plot(epochs, rates, color="tab:purple", label="Adam learning rate", **style)
        rate_axis.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
    else:
        rate_axis.text(0.5, 0.5, "learning rate unknown\n(no config.json)", ha="center",
                       va="center", transform=rate_axis.transAxes)
    rate_axis.set(title="Learning rate at the end of each epoch", xlabel="epoch",
                  ylabel="learning rate")
    for axis in (loss_axis, accuracy_axis, rate_axis):
        if len(epochs):
            axis.set_xticks(epochs if len(epochs) <= 12 else axis.get_xticks())
            axis.set_xlim(epochs.min() - 0.5, epochs.max() + 0.5)
        axis.grid(alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            # Below the axes, where it hides no point.
            axis.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2,
                        frameon=False)
    figure.suptitle(
        "Training curves (train: mean over the epoch, solid; test: end of the epoch, dashed)"
        if len(epochs) else "Training curves (the log has no epochs yet)",
        fontsize=12,
    )
    return _save(figure, path, dpi)


def plot_confusion_matrix(matrix, path, class_names=None, dpi=DPI, title=None):
    """The confusion matrix with counts in the cells and a log colour scale.

    Args:
        matrix: `[classes, classes]` counts, row = true class.
        path: PNG file to write.
        class_names: tick labels (default 0, 1, ...).
        dpi: resolution; the PNG is `FIGURE_SIZES["confusion_matrix"] * dpi`.
        title: figure title (default: number of images and accuracy).

    Returns:
        `path`.
    """
    matrix = np.asarray(matrix)
    classes = len(matrix)
    names = class_names or [str(index) for index in range(classes)]
    total = int(matrix.sum())
    accuracy = 100.0 * np.trace(matrix) / max(total, 1)
    figure = _figure("confusion_matrix")
    axis = figure.add_axes([0.1, 0.1, 0.72, 0.78])
    shown = np.ma.masked_equal(matrix, 0)
    drawn = axis.imshow(
        shown, cmap="viridis", norm=matplotlib.colors.LogNorm(vmin=1, vmax=max(matrix.max(), 2))
    )
    for row in range(classes):
        for column in range(classes):
            if matrix[row, column]:
                bright = matrix[row, column] > math.sqrt(max(matrix.max(), 1))
                axis.text(column, row, str(matrix[row, column]), ha="center", va="center",
                          fontsize=8, color="black" if bright else "white")
    axis.set_facecolor("white")
    axis.set_xticks(range(classes), names)
    axis.set_yticks(range(classes), names)
    axis.set_xlabel("predicted class")
    axis.set_ylabel("true class")
    bar = figure.add_axes([0.85, 0.1, 0.03, 0.78])
    ticks = [tick for tick in (1, 3, 10, 30, 100, 300, 1000, 3000, 10000)
             if tick <= max(matrix.max(), 2)]
    colour_bar = figure.colorbar(
        drawn, cax=bar, label="number of test images (log scale; blank: 0)", ticks=ticks
    )
    colour_bar.ax.set_yticklabels([str(tick) for tick in ticks])
    colour_bar.ax.minorticks_off()
    axis.set_title(
        title or f"Confusion matrix on {total} test images (accuracy {accuracy:.2f}%)"
    )
    return _save(figure, path, dpi)


def plot_routing(routing, path, image=None, label=None, class_id=None, dpi=DPI):
    """Coupling coefficients to one class over the primary capsule grid, per iteration.

    The couplings `c_ij` of the primary capsules at each grid position to
    class `class_id` are averaged over the capsule types (32 for MNIST);
    beside them, the input and the mean length of the primary capsules at
    each position (where there is evidence to route).

    Args:
        routing: `routing_couplings`' dict.
        path: PNG file to write.
        image: the input image `[H, W, C]`.
        label: its true class (or classes), for the title.
        class_id: the class to draw (default: the predicted one).
        dpi: resolution; the PNG is `FIGURE_SIZES["routing"] * dpi`.

    Returns:
        `path`.
    """
    class_id = routing["prediction"] if class_id is None else class_id
    couplings = routing["couplings"][..., class_id].mean(axis=1)  # [iterations, rows, cols]
    iterations = len(couplings)
    types = routing["couplings"].shape[1]
    classes = routing["couplings"].shape[-1]
    figure = _figure("routing")
    grid = figure.add_gridspec(
        1, iterations + 2, left=0.03, right=0.9, top=0.74, bottom=0.14, wspace=0.5
    )
    axis = figure.add_subplot(grid[0, 0])
    if image is not None:
        _show(axis, image)
        if label is not None:
            label = ", ".join(str(int(value)) for value in np.ravel(label))
        axis.set_title("input" + ("" if label is None else f" (true {label})"), fontsize=10)
    else:
        axis.axis("off")
    axis = figure.add_subplot(grid[0, 1])
    activity = axis.imshow(routing["primary_lengths"].mean(axis=0), cmap="magma", vmin=0)
    axis.set_title("primary capsule length\n(mean over the types)", fontsize=10)
    axis.set(xlabel="column", ylabel="row")
    figure.colorbar(activity, ax=axis, fraction=0.046, pad=0.04)
    # Diverging colours around the uniform coupling 1/classes (white): red cells
    # send more than a uniform share of their votes to the class, blue less.
    uniform = 1.0 / classes
    spread = max(float(np.abs(couplings - uniform).max()), 1e-3)
    norm = matplotlib.colors.Normalize(vmin=uniform - spread, vmax=uniform + spread)
    drawn = None
    for iteration in range(iterations):
        axis = figure.add_subplot(grid[0, iteration + 2])
        drawn = axis.imshow(couplings[iteration], cmap="RdBu_r", norm=norm)
        axis.set_title(f"iteration {iteration + 1}", fontsize=10)
        axis.set(xlabel="column", ylabel="row" if iteration == 0 else None)
    bar = figure.add_axes([0.92, 0.14, 0.012, 0.6])
    figure.colorbar(drawn, cax=bar, label=f"coupling to class {class_id}\n(white: uniform, "
                    f"1/{classes})")
    figure.suptitle(
        f"Routing to the predicted class {class_id} (its capsule's length "
        f"{routing['lengths'][class_id]:.2f}): coupling coefficients c_ij of the primary "
        f"capsules, averaged over the {types} capsule types at each grid position\n"
        f"(iteration 1 is uniform, 1/{classes}; later iterations move votes towards the classes "
        "they agree with: red more, blue less than uniform)",
        fontsize=10,
    )
    return _save(figure, path, dpi)


# --------------------------------------------------------------------------
# A whole work directory
# --------------------------------------------------------------------------


def _is_multi_target(model_config, config):
    """True for a model that reconstructs several digits per image (MultiMNIST)."""
    targets = model_config.get("num_targets") or model_config.get("targets") or 1
    return targets > 1 or "multi" in str(config.get("dataset", "")).lower()


def _pick(labels, predictions, digit):
    """Index of the first correctly classified test image of `digit` (or any of it)."""
    candidates = np.flatnonzero(labels == digit)
    correct = candidates[predictions[candidates] == digit]
    if len(correct):
        return int(correct[0])
    return int(candidates[0]) if len(candidates) else None


def write_figures(
    workdir,
    output_dir=None,
    figures=FIGURE_NAMES,
    checkpoint="best",
    eval_examples=None,
    reconstruction_examples=16,
    perturbation_digits=tuple(range(10)),
    routing_example=0,
    data_dir=None,
    dpi=DPI,
    saved_model=None,
    log=print,
):
    """Writes the figures of a trained work directory as PNG files.

    Args:
        workdir: a directory written by `capsnet_tf.training.train_and_evaluate`.
        output_dir: where the PNGs go (default `workdir/figures`).
        figures: which of `FIGURE_NAMES` to make.
        checkpoint: `"best"` or `"latest"`.
        eval_examples: test images classified for the confusion matrix and
            searched for misclassified examples (None: the whole test set
            with a confusion matrix; without one, the reconstruction and
            perturbation figures use at most the first `RECONSTRUCTION_POOL`
            images unless `eval_examples` is given).
        reconstruction_examples: test images in the reconstruction grid
            (at most 16; misclassified ones are added).
        perturbation_digits: one `perturbations_<digit>.png` per digit, made
            from the first correctly classified test image of that digit.
        routing_example: index of the test image whose routing is drawn.
        data_dir: TFDS data directory.
        dpi: resolution of every PNG.
        saved_model: optional path of a SavedModel exported from this run
            (`capsnet_tf.export`); the reconstruction, perturbation and
            confusion figures then use its `serving_float` and `decode`
            signatures instead of the checkpoint. The routing figure always
            needs the checkpoint (the export has no couplings).
        log: function called with progress messages.

    Returns:
        Dict `{figure name: path}` of the files written
        (`"perturbations_3"` etc. for the digits).

    Raises:
        FileNotFoundError: not a finished work directory.
        ValueError: unknown figure names, or a SavedModel without the
            `serving_float` and `decode` signatures.

    Example:

    >>> write_figures("/tmp/capsnet_mnist", eval_examples=1000,  # doctest: +SKIP
    ...               perturbation_digits=[3, 7])
    {'training_curves': '/tmp/capsnet_mnist/figures/training_curves.png', ...}
    """
    from capsnet_tf.training import load_trained_model, read_run_files

    unknown = sorted(set(figures) - set(FIGURE_NAMES))
    if unknown:
        raise ValueError(f"Unknown figures {unknown}; choose from {list(FIGURE_NAMES)}")
    output_dir = output_dir or os.path.join(workdir, "figures")  # made by the first figure
    written = {}
    config, model_config = read_run_files(workdir, require_model=False)
    multi_target = _is_multi_target(model_config, config)
    if multi_target:
        single = {"reconstructions", "perturbations", "confusion_matrix"} & set(figures)
        if single:
            log(f"MultiMNIST work directory: {', '.join(sorted(single))} assume one digit "
                "per image and are skipped; Figure 5 is 'multimnist'.")
        figures = [name for name in figures if name not in single]
    elif "multimnist" in figures:
        figures = [name for name in figures if name != "multimnist"]
    dataset = config.get("dataset", "mnist")
    data_dir = data_dir or config.get("data_dir")
    test_options = {
        "seed": config.get("seed", 0),
        "test_pairs_per_image": config.get("test_pairs_per_image", 1),
        "affnist_path": config.get("affnist_path"),
        "shift": config.get("shift"),
    }

    log_path = os.path.join(workdir, "training_log.csv")
    history = read_training_log(log_path) if os.path.exists(log_path) else {}
    epochs = len(history.get("epoch", ()))
    model_name = "CapsNet"
    if epochs and config.get("steps_per_epoch"):  # shortened epochs: count steps
        model_name += f" after {epochs * int(config['steps_per_epoch']):,} training steps"
    elif epochs:
        model_name += f" after {epochs} epoch{'s' if epochs != 1 else ''}"
    if "training_curves" in figures:
        if os.path.exists(log_path):
            rates = None
            if history:
                rates = learning_rates(
                    config, history["epoch"], _train_examples(config, data_dir)
                )
            written["training_curves"] = plot_training_curves(
                history, os.path.join(output_dir, "training_curves.png"), rates,
                config.get("reconstruction_weight") if config.get("reconstruction") else None,
                dpi=dpi,
            )
        else:
            log(f"No {log_path}: training curves skipped.")

    needs_model = {"reconstructions", "perturbations", "confusion_matrix", "routing",
                   "multimnist"}
    if not needs_model & set(figures):
        return written
    model = None
    if saved_model is None or "routing" in figures:
        model, _ = load_trained_model(workdir, checkpoint)
    if saved_model is not None:
        log(f"Reconstructions, perturbations and confusion matrix from {saved_model}.")
        adapter = _SavedModelCapsNet(saved_model)
    else:
        adapter = _KerasCapsNet(model)
    wanted = set(figures)
    if not adapter.reconstruction:
        log("The model has no decoder: reconstruction and perturbation figures skipped.")
        wanted -= {"reconstructions", "perturbations"}
    classify = bool({"confusion_matrix", "reconstructions", "perturbations"} & wanted)
    classified = eval_examples if classify else 0
    if classify and "confusion_matrix" not in wanted and eval_examples is None:
        classified = RECONSTRUCTION_POOL
    count = classified
    if "routing" in wanted and count is not None:
        count = max(count, routing_example + 1)
    if "multimnist" in wanted:
        count = max(count or 0, reconstruction_examples)
    all_images, all_labels = load_test_images(dataset, count, data_dir, **test_options)
    images, labels = all_images[:classified], all_labels[:classified]
    if classify:
        log(f"Classifying {len(images)} test images ...")
        outputs = adapter.predict(images, batch_size=100)
        predictions = outputs["predictions"]
        accuracy = 100.0 * float(np.mean(predictions == labels))
        log(f"Accuracy on these {len(images)} test images: {accuracy:.2f}%")
    name = {"mnist": "MNIST", "fashion_mnist": "Fashion-MNIST"}.get(dataset, dataset)

    if "confusion_matrix" in wanted:
        matrix = confusion_matrix(labels, predictions, adapter.num_classes)
        written["confusion_matrix"] = plot_confusion_matrix(
            matrix, os.path.join(output_dir, "confusion_matrix.png"), dpi=dpi,
            title=f"Confusion matrix on {len(images)} {name} test images "
            f"(accuracy {accuracy:.2f}%)",
        )
    if "reconstructions" in wanted:
        shown = slice(0, min(reconstruction_examples, 16, len(images)))
        wrong = np.flatnonzero(predictions != labels)
        num_wrong, wrong = len(wrong), wrong[:8]
        written["reconstructions"] = plot_reconstructions(
            images[shown], labels[shown], outputs["reconstruction"][shown], predictions[shown],
            os.path.join(output_dir, "reconstructions.png"),
            wrong=(images[wrong], labels[wrong], outputs["reconstruction"][wrong],
                   predictions[wrong]),
            dpi=dpi,
            title=f"{model_name}: reconstructions of {name} test images\n({num_wrong} of the "
            f"{len(images)} evaluated misclassified; the first {len(wrong)} shown)",
        )
    if "perturbations" in wanted:
        for digit in perturbation_digits:
            index = _pick(labels, predictions, digit)
            if index is None:
                log(f"No test image of digit {digit} among the {len(images)} evaluated.")
                continue
            class_id = int(predictions[index])
            grid = perturbation_grid(adapter, outputs["capsules"][index], class_id)
            written[f"perturbations_{digit}"] = plot_perturbations(
                grid, os.path.join(output_dir, f"perturbations_{digit}.png"),
                image=images[index], label=labels[index], class_id=class_id, dpi=dpi,
                model_name=model_name,
            )
    if "multimnist" in wanted:
        shown = min(reconstruction_examples, 16, len(all_images))
        outputs = adapter.predict(all_images[:shown], batch_size=100)
        predicted_pairs = np.argsort(-outputs["length"], axis=-1)[:, :2]
        correct = np.mean([
            sorted(pair) == sorted(labels_pair)
            for pair, labels_pair in zip(predicted_pairs, all_labels[:shown])
        ])
        written["multimnist"] = plot_multimnist_separations(
            all_images[:shown], all_labels[:shown], outputs["reconstruction"],
            predicted_pairs, os.path.join(output_dir, "multimnist.png"), dpi=dpi,
            title=f"{model_name} on MultiMNIST: each digit reconstructed from its own "
            f"capsule ({100 * correct:.0f}% of these {shown} pairs right)",
        )
    if "routing" in wanted:
        if routing_example >= len(all_images):
            raise ValueError(
                f"routing_example={routing_example}, but the test set has only "
                f"{len(all_images)} images."
            )
        routing = routing_couplings(model, all_images[routing_example])
        written["routing"] = plot_routing(
            routing, os.path.join(output_dir, "routing.png"),
            image=all_images[routing_example], label=all_labels[routing_example], dpi=dpi,
        )
    return written


# --------------------------------------------------------------------------
# TensorBoard
# --------------------------------------------------------------------------


class ReconstructionImages(keras.callbacks.Callback):
    """Writes inputs over their reconstructions into TensorBoard every epoch.

    At the end of each epoch the model reconstructs a fixed batch of test
    images from its longest (predicted) capsule, as at test time, and one
    image is written with `tf.summary.image` under the tag
    `"reconstructions"`: the inputs in the top row, the reconstructions
    below. The summary's description lists the true and predicted labels.

    Args:
        images: float `[n, H, W, C]` test images in [0, 1].
        labels: int `[n]` their classes (`[n, 2]` for MultiMNIST, whose
            bottom row then shows the two reconstructions in red and green).
        log_dir: TensorBoard directory (e.g. `workdir/logs/reconstructions`).
        max_images: how many of the images to draw (the first ones).

    Example:

    >>> import numpy as np
    >>> callback = ReconstructionImages(np.zeros((2, 28, 28, 1)), np.array([1, 7]),
    ...                                 "/tmp/capsnet_logs", max_images=16)
    >>> callback.images.shape
    (2, 28, 28, 1)
    """

    def __init__(self, images, labels, log_dir, max_images=16):
        super().__init__()
        if not isinstance(max_images, int) or max_images < 1:
            raise ValueError(f"`max_images` must be a positive integer. Received: {max_images!r}")
        images = np.asarray(images, "float32")[:max_images]
        labels = np.asarray(labels, "int32")[:max_images]
        if images.ndim != 4 or len(images) != len(labels) or not len(images):
            raise ValueError(
                "`images` must be [n, H, W, C] with n >= 1 and `labels` [n] "
                "(or [n, 2] for two targets). "
                f"Received: images {images.shape}, labels {labels.shape}"
            )
        self.images = images
        self.labels = labels
        self.log_dir = log_dir
        self.max_images = max_images
        self._writer = None

    def on_train_begin(self, logs=None):
        if not getattr(self.model, "reconstruction", True):
            raise ValueError(
                "ReconstructionImages needs a CapsNet with a decoder "
                "(reconstruction=True)."
            )

    def on_epoch_end(self, epoch, logs=None):
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self.log_dir)
        outputs = self.model({"image": self.images, "label": self.labels}, training=False)
        lengths = np.asarray(outputs["length"])
        reconstructions = np.asarray(outputs["reconstruction"])
        images = self.images
        if reconstructions.ndim == 5:  # two targets: Figure 5's colours
            predictions = [",".join(map(str, pair)) for pair in np.argsort(-lengths)[:, :2]]
            labels = [",".join(map(str, pair)) for pair in self.labels]
            reconstructions = two_colour(reconstructions[:, 0], reconstructions[:, 1])
            images = np.repeat(images[..., :1], 3, axis=-1)
            what = ("the two longest class capsules, each decoded alone (red: longest, "
                    "green: second)")
        else:
            predictions, labels = lengths.argmax(-1), self.labels
            what = "the predicted (longest) class capsule"
            if images.shape[-1] not in (1, 3):  # e.g. smallNORB's stereo pair
                images, reconstructions = images[..., :1], reconstructions[..., :1]
        mosaic = reconstruction_mosaic(images, reconstructions)
        description = (
            f"Top row: test inputs; bottom row: reconstructions from {what}.  \n"
            f"True labels: {' '.join(str(label) for label in labels)}  \n"
            f"Predicted:   {' '.join(str(label) for label in predictions)}"
        )
        with self._writer.as_default():
            tf.summary.image("reconstructions", mosaic[None], step=epoch,
                             description=description)
        self._writer.flush()

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.close()
            self._writer = None
