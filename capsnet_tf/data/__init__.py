"""Input pipelines: TFDS loading with clear errors, MNIST-style augmentation."""

from capsnet_tf.data.pipeline import (
    DatasetNotFoundError,
    load_tfds_split,
    make_dataset,
    random_shift,
    resolve_data_dir,
)

__all__ = [
    "DatasetNotFoundError",
    "load_tfds_split",
    "make_dataset",
    "random_shift",
    "resolve_data_dir",
]
