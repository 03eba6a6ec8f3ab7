"""Input pipelines: TFDS loading with clear errors, MNIST-style augmentation, your images."""

from capsnet_tf.data.affnist import (
    affine_transform,
    load_affnist,
    make_affnist_dataset,
    make_expanded_mnist_dataset,
    warp_digit,
)
from capsnet_tf.data.cifar10 import make_cifar10_dataset, preprocess_cifar10
from capsnet_tf.data.folder import ImageFolderError, make_image_folder_dataset, scan_image_folder
from capsnet_tf.data.multimnist import (
    load_mnist_arrays,
    make_multimnist_dataset,
    merge_digits,
    place_digit,
)
from capsnet_tf.data.pipeline import (
    DatasetNotFoundError,
    load_tfds_split,
    make_dataset,
    random_shift,
    random_subpixel_shift,
    resolve_data_dir,
)
from capsnet_tf.data.smallnorb import (
    load_smallnorb_split,
    make_smallnorb_dataset,
    preprocess_smallnorb,
)
from capsnet_tf.data.tfds_images import make_tfds_image_dataset

__all__ = [
    "DatasetNotFoundError",
    "ImageFolderError",
    "affine_transform",
    "load_affnist",
    "load_mnist_arrays",
    "load_smallnorb_split",
    "load_tfds_split",
    "make_affnist_dataset",
    "make_cifar10_dataset",
    "make_dataset",
    "make_expanded_mnist_dataset",
    "make_image_folder_dataset",
    "make_multimnist_dataset",
    "make_smallnorb_dataset",
    "make_tfds_image_dataset",
    "merge_digits",
    "place_digit",
    "preprocess_cifar10",
    "preprocess_smallnorb",
    "random_shift",
    "random_subpixel_shift",
    "resolve_data_dir",
    "scan_image_folder",
    "warp_digit",
]
