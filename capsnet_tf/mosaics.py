"""Images tiled into one image, in numpy: inputs over reconstructions, grids, two colours.

Below both of their users: the TensorBoard callback of training
(`capsnet_tf.callbacks.images`) and the figures (`capsnet_tf.figures`).
"""

import numpy as np

__all__ = [
    "grid_mosaic",
    "reconstruction_mosaic",
    "two_colour",
]


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


def grid_mosaic(grid, gap=2):
    """`[rows, columns, H, W, C]` images -> one `[rows*H + gaps, columns*W + gaps]` image.

    The first channel of each image is drawn; the gaps are NaN (drawn as the
    colour map's "bad" colour).
    """
    rows, columns, height, width = grid.shape[:4]
    mosaic = np.full(
        (rows * (height + gap) - gap, columns * (width + gap) - gap), np.nan, "float32"
    )
    for row in range(rows):
        for column in range(columns):
            top, left = row * (height + gap), column * (width + gap)
            mosaic[top:top + height, left:left + width] = grid[row, column, ..., 0]
    return mosaic
