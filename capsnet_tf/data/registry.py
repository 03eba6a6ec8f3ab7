"""One entry point to every data set an experiment can train on.

`load_experiment_data(name, split, ...)` dispatches to the pipeline of
`name` and always returns `(dataset, DatasetSpec)`, so that the training loop
does not need to know where the examples come from:

| name | pipeline | images | classes | targets |
| --- | --- | --- | --- | --- |
| `mnist`, `fashion_mnist` | `make_dataset` (TFDS, random shift) | 28x28x1 | 10 | 1 |
| `multi_mnist` | `make_multimnist_dataset` (generated from MNIST) | 36x36x1 | 10 | 2 |
| `expanded_mnist` | `make_expanded_mnist_dataset` (MNIST on 40x40, shifted) | 40x40x1 | 10 | 1 |
| `affnist` | `make_affnist_dataset` (test only: generated, or the real files) | 40x40x1 | 10 | 1 |
| `cifar10` | `make_cifar10_dataset` (TFDS, official preprocessing) | 24x24x3 | 10 | 1 |
| `smallnorb` | `make_smallnorb_dataset` (TFDS, official preprocessing) | 32x32x2 | 5 | 1 |
"""

from capsnet_tf.data.spec import DatasetSpec

__all__ = ["DATASETS", "load_experiment_data"]

DATASETS = (
    "mnist",
    "fashion_mnist",
    "multi_mnist",
    "expanded_mnist",
    "affnist",
    "cifar10",
    "smallnorb",
)


def load_experiment_data(
    name,
    split,
    batch_size,
    training,
    seed=0,
    shift=None,
    data_dir=None,
    reconstruction=True,
    take=None,
    test_pairs_per_image=1,
    affnist_path=None,
):
    """The `tf.data` pipeline and `DatasetSpec` of one split of a data set.

    Args:
        name: one of `DATASETS`.
        split: `"train"` or `"test"` (`affnist` has only `"test"`).
        batch_size: examples per batch.
        training: shuffle and augment.
        seed: seed of shuffling, augmentation and generated test sets.
        shift: maximum random translation in pixels (MNIST-style data sets;
            `multi_mnist`: each digit's shift, which also sets the canvas
            to 28 + 2 * shift; `expanded_mnist`: the shift on the 40x40
            canvas). None: each pipeline's default (0 for `mnist`, 4 for
            `multi_mnist`, 6 for `expanded_mnist`). Ignored by `cifar10` and
            `smallnorb`, whose augmentation is the official one.
        data_dir: TFDS data directory.
        reconstruction: include the label input and the reconstruction target.
        take: keep only the first `take` examples.
        test_pairs_per_image: `multi_mnist` test pairs per MNIST test image.
        affnist_path: real affNIST data for `affnist` (None: generated).

    Returns:
        `(dataset, spec)`.

    Raises:
        ValueError: unknown `name` or split.
        capsnet_tf.data.DatasetNotFoundError: the source data are missing.
    """
    if name not in DATASETS:
        raise ValueError(f"Unknown data set {name!r}; choose one of {', '.join(DATASETS)}.")
    if name in ("mnist", "fashion_mnist"):
        from capsnet_tf.data.pipeline import make_dataset

        dataset, info = make_dataset(
            name,
            split,
            batch_size,
            training=training,
            shift=(shift or 0) if training else 0,
            seed=seed,
            data_dir=data_dir,
            reconstruction=reconstruction,
            take=take,
        )
        spec = DatasetSpec(
            name=name,
            image_shape=tuple(info.features["image"].shape),
            num_classes=info.features["label"].num_classes,
            num_examples=info.splits[split].num_examples,
            class_names=tuple(info.features["label"].names),
        )
        return dataset, spec
    shift_option = {} if shift is None else {"max_shift": shift}
    if name == "multi_mnist":
        from capsnet_tf.data.multimnist import make_multimnist_dataset

        return make_multimnist_dataset(
            split,
            batch_size,
            training=training,
            seed=seed,
            test_pairs_per_image=test_pairs_per_image,
            data_dir=data_dir,
            reconstruction=reconstruction,
            take=take,
            **shift_option,
        )
    if name == "expanded_mnist":
        from capsnet_tf.data.affnist import make_expanded_mnist_dataset

        return make_expanded_mnist_dataset(
            split,
            batch_size,
            training=training,
            seed=seed,
            data_dir=data_dir,
            reconstruction=reconstruction,
            take=take,
            **shift_option,
        )
    if name == "affnist":
        if split != "test":
            raise ValueError(
                "affNIST is a test set only (train on expanded_mnist). "
                f"Received: split={split!r}"
            )
        from capsnet_tf.data.affnist import make_affnist_dataset

        return make_affnist_dataset(
            batch_size,
            seed=seed,
            data_dir=data_dir,
            path=affnist_path,
            reconstruction=reconstruction,
            take=take,
        )
    if name == "cifar10":
        from capsnet_tf.data.cifar10 import make_cifar10_dataset

        if reconstruction:
            raise ValueError(
                "CIFAR-10 is trained without reconstruction, as in the official "
                "release (remake=false): pass reconstruction=False (--noreconstruction)."
            )
        return make_cifar10_dataset(
            split, batch_size, training=training, seed=seed, data_dir=data_dir, take=take
        )
    from capsnet_tf.data.smallnorb import make_smallnorb_dataset

    return make_smallnorb_dataset(
        split,
        batch_size,
        training=training,
        seed=seed,
        data_dir=data_dir,
        reconstruction=reconstruction,
        take=take,
    )
