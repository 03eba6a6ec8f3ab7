"""Routing analysis of a trained CapsNet: the coupling coefficients of every iteration.

`routing_couplings(model, image)` runs the three layers before the decoder
(`conv1`, `primary_capsules`, `class_capsules`) of a Keras `CapsNet` on one
image and returns the couplings `c_ij` of each routing iteration over the
primary capsule grid. An exported SavedModel returns no couplings; the
trained-model adapter (`capsnet_tf.trained`) rebuilds those three layers
from an export when it can (`TrainedCapsNet.routing_model`).
"""

import math

import numpy as np

__all__ = [
    "primary_grid_shape",
    "routing_couplings",
]


def primary_grid_shape(model):
    """(types, rows, columns) of the primary capsule maps of a Keras `CapsNet`."""
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
    grid = primary_grid_shape(model)
    couplings = np.asarray(couplings)[0]  # [iterations, input_capsules, classes]
    lengths = np.linalg.norm(np.asarray(capsules)[0], axis=-1)
    return {
        "couplings": couplings.reshape((couplings.shape[0], *grid, couplings.shape[-1])),
        "primary_lengths": np.linalg.norm(np.asarray(primary)[0], axis=-1).reshape(grid),
        "lengths": lengths,
        "prediction": int(lengths.argmax()),
    }
