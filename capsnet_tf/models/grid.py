"""The sizes of CapsNet's layer grids, from its arguments alone (no TensorFlow).

Shared by the model (`CapsNet(vote_scaling="capsule_count")` needs the number
of primary capsules before its layers are built) and by the memory estimate
(`capsnet_tf.memory`), which runs before anything is built.
"""

import math

__all__ = ["MNIST_PRIMARY_CAPSULES", "capsule_counts"]

# The paper's MNIST model: 6 x 6 positions x 32 capsule types.
MNIST_PRIMARY_CAPSULES = 1152


def _conv_length(size, kernel, stride, padding):
    if padding == "same":
        return math.ceil(size / stride)
    return (size - kernel) // stride + 1


def capsule_counts(
    image_shape,
    stem_layers=0,
    conv_kernel_size=9,
    primary_capsule_types=32,
    primary_kernel_size=9,
    primary_strides=2,
    padding="valid",
):
    """The layer grids: `(stem sizes, conv1 size, PrimaryCaps grid, primary capsules)`.

    Sizes are `(height, width)`; the primary capsules are the grid's
    positions times `primary_capsule_types`.

    Raises:
        ValueError: the image is too small for the layers; the message names
            the smallest size and what to change.
    """
    height, width = int(image_shape[0]), int(image_shape[1])
    stem = []
    for _ in range(stem_layers):
        height, width = math.ceil(height / 2), math.ceil(width / 2)
        stem.append((height, width))
    conv = (_conv_length(height, conv_kernel_size, 1, padding),
            _conv_length(width, conv_kernel_size, 1, padding))
    grid = tuple(_conv_length(size, primary_kernel_size, primary_strides, padding)
                 for size in conv)
    if min(conv) < 1 or min(grid) < 1:
        raise ValueError(
            f"Images of {image_shape[0]}x{image_shape[1]} are too small for "
            f"{stem_layers} stem layer(s), a {conv_kernel_size}x{conv_kernel_size} conv1 and "
            f"{primary_kernel_size}x{primary_kernel_size} PrimaryCaps with "
            f"padding={padding!r}: use fewer --stem_layers, --padding=same or larger "
            "--image_size."
        )
    return stem, conv, grid, grid[0] * grid[1] * primary_capsule_types
