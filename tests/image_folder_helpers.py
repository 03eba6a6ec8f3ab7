"""Small generated image folders for the `--image_folder` tests."""

import os

import numpy as np
from PIL import Image

CLASSES = ("circle", "cross", "square")


def write_folder(path, size=20, per_class=6, classes=CLASSES, grayscale_every=3, seed=0):
    """One sub-folder of `per_class` images per class; PNG and JPEG, RGB and some grayscale.

    Each class has its own mean colour, so a few steps already separate them.
    Returns `path`.
    """
    rng = np.random.default_rng(seed)
    for label, name in enumerate(classes):
        os.makedirs(os.path.join(path, name), exist_ok=True)
        for index in range(per_class):
            colour = np.zeros(3)
            colour[label % 3] = 200
            pixels = np.clip(colour + rng.normal(0, 30, (size, size, 3)), 0, 255)
            image = Image.fromarray(pixels.astype(np.uint8))
            if grayscale_every and index % grayscale_every == 0:
                image = image.convert("L")
            extension = "jpg" if index % 2 else "png"
            image.save(os.path.join(path, name, f"{index:03d}.{extension}"))
    return str(path)
