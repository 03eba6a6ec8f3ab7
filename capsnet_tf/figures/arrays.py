"""The arrays behind the figures, for notebooks as well: predictions, perturbations
and confusion matrices.

The model may be anything `capsnet_tf.trained.open_capsnet` opens: a
training `CapsNet`, a `.keras` file or an exported SavedModel; all are read
through that one adapter. The test images come from
`capsnet_tf.data.samples`, the mosaics from `capsnet_tf.mosaics` and a
run's log from `capsnet_tf.figures.history`; they are imported here too,
where notebooks found them before. (The routing couplings are in
`capsnet_tf.routing`.)
"""

import numpy as np

from capsnet_tf.data.samples import load_test_images
from capsnet_tf.figures.history import learning_rates, read_training_log
from capsnet_tf.figures.style import PERTURBATION_VALUES
from capsnet_tf.mosaics import reconstruction_mosaic, two_colour
from capsnet_tf.trained import open_capsnet

__all__ = [
    "confusion_matrix",
    "learning_rates",
    "load_test_images",
    "perturbation_grid",
    "predict",
    "read_training_log",
    "reconstruction_mosaic",
    "two_colour",
]


def predict(model, images, batch_size=100):
    """Runs a CapsNet on images without labels (reconstruction of the longest capsule).

    Args:
        model: a `capsnet_tf.CapsNet` (the training model, weights loaded),
            or a SavedModel written by `capsnet_tf.export.export_saved_model`
            (its path or what `tf.saved_model.load` returned; the
            `serving_float` signature is used), or anything else
            `capsnet_tf.trained.open_capsnet` opens.
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
    return open_capsnet(model).predict(np.asarray(images, "float32"), batch_size)


def perturbation_grid(model, capsules, class_id, values=PERTURBATION_VALUES):
    """Decoder outputs with each capsule dimension perturbed: the paper's Figure 4.

    The capsule of `class_id` is kept and all other classes are zeroed (as
    the decoder saw them in training); dimension `d` of the kept capsule gets
    `values[v]` added, everything else unchanged, and the decoder redraws
    the digit.

    Args:
        model: a `capsnet_tf.CapsNet` with a decoder, or an exported
            SavedModel (path or loaded object; its `decode` signature is used),
            or anything else `capsnet_tf.trained.open_capsnet` opens.
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
    images = open_capsnet(model).decode(batch, np.full(len(batch), class_id), batch_size=256)
    return images.reshape((dim, len(values)) + images.shape[1:])


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
