"""A folder of Fashion-MNIST PNGs, in `train/` and `test/` sub-folders, to try `--image_folder`.

Writes the first `per_class` training and `test_per_class` test images of a
few Fashion-MNIST classes (from the prepared TFDS copy) as 28x28 grayscale
PNG files, one sub-folder per class under `PATH/train/` and `PATH/test/`:
the layout `experiments/mnist.py --image_folder=PATH` reads with its own
test split.

    python examples/fashion_mnist_folder.py /tmp/fashion4

No flags: change the arguments of `write_fashion_folder` instead.
"""

import os
import sys

try:
    import capsnet_tf  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from capsnet_tf.data import load_tfds_split

__all__ = ["write_fashion_folder"]

# TFDS label id: folder name (a "/" cannot be in one).
CLASSES = {0: "T-shirt_top", 1: "Trouser", 7: "Sneaker", 8: "Bag"}


def write_fashion_folder(path, classes=None, per_class=1000, test_per_class=200,
                         data_dir=None):
    """Writes the PNGs; returns the class folder names in label order of the folder."""
    from PIL import Image

    classes = classes or CLASSES
    for split, limit in (("train", per_class), ("test", test_per_class)):
        counts = dict.fromkeys(classes, 0)
        for name in classes.values():
            os.makedirs(os.path.join(path, split, name), exist_ok=True)
        data, _ = load_tfds_split("fashion_mnist", split, data_dir)
        for image, label in data.as_numpy_iterator():
            label = int(label)
            if label not in classes or counts[label] >= limit:
                continue
            Image.fromarray(image[..., 0]).save(
                os.path.join(path, split, classes[label], f"{counts[label]:04d}.png")
            )
            counts[label] += 1
            if all(count >= limit for count in counts.values()):
                break
    return sorted(classes.values())


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python examples/fashion_mnist_folder.py PATH")
    names = write_fashion_folder(sys.argv[1])
    print(f"Wrote {', '.join(names)} to {sys.argv[1]}/train and {sys.argv[1]}/test")
