"""The MNIST test images behind the explorer's "random test digit" button.

Read once, on the first request, from the prepared TFDS copy (see
`capsnet_tf.data.resolve_data_dir`): starting the page does not wait for the
10,000 images, and a missing data set only greys out that button.
"""

import threading

import numpy as np

__all__ = ["SampleDigits"]


class SampleDigits:
    """MNIST's test split as uint8 `[10000, 28, 28]` images and int labels.

    Args:
        data_dir: TFDS data directory (None: `TFDS_DATA_DIR` or
            `~/tensorflow_datasets`).
        images: optional `(images, labels)` arrays to serve instead (tests).
    """

    def __init__(self, data_dir=None, images=None):
        self.data_dir = data_dir
        self._arrays = images
        self._error = None
        self._lock = threading.Lock()

    def _load(self):
        with self._lock:
            if self._arrays is None and self._error is None:
                from capsnet_tf.data.pipeline import DatasetNotFoundError, load_tfds_split

                try:
                    dataset, _ = load_tfds_split("mnist", "test", self.data_dir)
                    images, labels = [], []
                    for image, label in dataset.batch(2000).as_numpy_iterator():
                        images.append(image[..., 0])
                        labels.append(label)
                    self._arrays = (np.concatenate(images), np.concatenate(labels))
                except DatasetNotFoundError as error:
                    self._error = str(error)
        if self._error is not None:
            raise LookupError(self._error)
        return self._arrays

    def __len__(self):
        return len(self._load()[0])

    def get(self, index=None, rng=None):
        """`(index, image float32 [28, 28] in [0, 1], label)`; a random one without `index`.

        Raises:
            LookupError: MNIST is not prepared (the message says where it was looked for).
            IndexError: `index` outside the test split.
        """
        images, labels = self._load()
        if index is None:
            index = int((rng or np.random.default_rng()).integers(len(images)))
        if not 0 <= index < len(images):
            raise IndexError(f"Test digit {index} does not exist: MNIST has {len(images)} "
                             f"test images, 0 to {len(images) - 1}.")
        return index, images[index].astype("float32") / 255.0, int(labels[index])
