"""A folder of generated shape images, one sub-folder per class, to try `--image_folder`.

Each image is a filled circle, square or triangle (more classes: pentagon,
star, ...) of random size, position and colour on a random background, with
a little noise, written as PNG (or JPEG) files in the layout that
`experiments/mnist.py --image_folder` and
`keras.utils.image_dataset_from_directory` read:

    PATH/circle/0000.png, PATH/square/0000.png, PATH/triangle/0000.png, ...

Run it from the repository root:

    python examples/shapes_folder.py /tmp/shapes          # 3 classes, 48x48, 300 each
    python examples/shapes_folder.py /tmp/shapes128 128 200

or in a notebook: `write_shapes_folder("/tmp/shapes", size=48, per_class=300)`.
"""

import math
import os
import sys

import numpy as np

__all__ = ["SHAPES", "draw_shape", "write_shapes_folder"]

SHAPES = ("circle", "square", "triangle", "pentagon", "star")


def _polygon(points, size, centre, radius, rotation, star=False):
    """Boolean mask `[size, size]` of a regular polygon (or star) inside the image."""
    angles = rotation + 2 * math.pi * np.arange(points) / points
    radii = np.full(points, radius)
    if star:
        angles = rotation + math.pi * np.arange(2 * points) / points
        radii = np.where(np.arange(2 * points) % 2 == 0, radius, radius * 0.45)
    vertices = np.stack([centre[0] + radii * np.cos(angles),
                         centre[1] + radii * np.sin(angles)], axis=1)
    ys, xs = np.mgrid[0:size, 0:size] + 0.5
    inside = np.zeros((size, size), bool)
    # Even-odd rule over the polygon's edges.
    for (x0, y0), (x1, y1) in zip(vertices, np.roll(vertices, -1, axis=0)):
        crosses = ((y0 > ys) != (y1 > ys)) & (
            xs < (x1 - x0) * (ys - y0) / (y1 - y0 + 1e-12) + x0
        )
        inside ^= crosses
    return inside


def draw_shape(kind, size, rng, channels=3):
    """One uint8 image `[size, size, channels]` of the shape `kind`."""
    radius = rng.uniform(0.2, 0.4) * size
    centre = rng.uniform(radius, size - radius, 2)
    if kind == "circle":
        ys, xs = np.mgrid[0:size, 0:size] + 0.5
        mask = (xs - centre[0]) ** 2 + (ys - centre[1]) ** 2 <= radius**2
    else:
        points = {"square": 4, "triangle": 3, "pentagon": 5, "star": 5}[kind]
        mask = _polygon(points, size, centre, radius, rng.uniform(0, 2 * math.pi),
                        star=kind == "star")
    background = rng.uniform(0, 110, channels)
    colour = rng.uniform(140, 255, channels)
    image = np.where(mask[..., None], colour, background)
    image = image + rng.normal(0, 8, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def write_shapes_folder(path, size=48, per_class=300, classes=3, seed=0, image_format="png",
                        grayscale_every=0):
    """Writes `per_class` images of each of the first `classes` shapes under `path`.

    Args:
        path: the folder (made if missing).
        size: images are `size x size`.
        per_class: images per class.
        classes: how many of `SHAPES` (2 to 5).
        seed: seed of the shapes.
        image_format: `"png"` or `"jpg"`.
        grayscale_every: write every n-th image as grayscale (0: none).

    Returns:
        The class names written.
    """
    from PIL import Image

    if not 2 <= classes <= len(SHAPES):
        raise ValueError(f"`classes` must be in [2, {len(SHAPES)}]. Received: {classes}")
    rng = np.random.default_rng(seed)
    names = SHAPES[:classes]
    for name in names:
        os.makedirs(os.path.join(path, name), exist_ok=True)
        for index in range(per_class):
            image = Image.fromarray(draw_shape(name, size, rng))
            if grayscale_every and index % grayscale_every == 0:
                image = image.convert("L")
            image.save(os.path.join(path, name, f"{index:04d}.{image_format}"))
    return names


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3, 4):
        sys.exit("usage: python examples/shapes_folder.py PATH [SIZE [PER_CLASS]]")
    target = sys.argv[1]
    written = write_shapes_folder(
        target,
        size=int(sys.argv[2]) if len(sys.argv) > 2 else 48,
        per_class=int(sys.argv[3]) if len(sys.argv) > 3 else 300,
    )
    print(f"Wrote {', '.join(written)} images to {target}")
