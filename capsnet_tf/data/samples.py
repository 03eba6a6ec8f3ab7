"""A data set's test images as numpy arrays, and a run's training examples per epoch.

For what looks at a few test images outside `tf.data`: the TensorBoard
reconstructions of training (`capsnet_tf.training`), the figures
(`capsnet_tf.figures`) and notebooks.
"""

import numpy as np

from capsnet_tf.data.pipeline import load_tfds_split
from capsnet_tf.data.registry import IMAGE_FOLDER, load_experiment_data, scan_folder

__all__ = [
    "load_test_images",
    "run_train_examples",
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
    if dataset not in ("mnist", "fashion_mnist"):
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


def run_train_examples(config, data_dir):
    """Training examples per epoch of a run's configuration.

    Args:
        config: the dict of a run's `config.json`.
        data_dir: TFDS data directory.

    Returns:
        The run's `train_examples` when it set one, else the size of the
        training split (the image folder's, or the TFDS source's: MNIST's for
        `multi_mnist` and `expanded_mnist`).
    """
    if config.get("train_examples"):
        return int(config["train_examples"])
    dataset = config.get("dataset", "mnist")
    if dataset == IMAGE_FOLDER:
        folder = scan_folder(config["image_folder"], config.get("image_size"),
                             config.get("test_fraction", 0.2), config.get("seed", 0))
        return len(folder.splits["train"][0])
    source = {"multi_mnist": "mnist", "expanded_mnist": "mnist"}.get(dataset, dataset)
    _, info = load_tfds_split(source, "train", data_dir)
    return info.splits["train"].num_examples
