"""`ReconstructionImages`: inputs over their reconstructions in TensorBoard, every epoch."""

import keras
import numpy as np
import tensorflow as tf

from capsnet_tf.mosaics import reconstruction_mosaic, two_colour

__all__ = ["ReconstructionImages"]


class ReconstructionImages(keras.callbacks.Callback):
    """Writes inputs over their reconstructions into TensorBoard every epoch.

    At the end of each epoch the model reconstructs a fixed batch of test
    images from its longest (predicted) capsule, as at test time, and one
    image is written with `tf.summary.image` under the tag
    `"reconstructions"`: the inputs in the top row, the reconstructions
    below. The summary's description lists the true and predicted labels.

    Args:
        images: float `[n, H, W, C]` test images in [0, 1].
        labels: int `[n]` their classes (`[n, 2]` for MultiMNIST, whose
            bottom row then shows the two reconstructions in red and green).
        log_dir: TensorBoard directory (e.g. `workdir/logs/reconstructions`).
        max_images: how many of the images to draw (the first ones).

    Example:

    >>> import numpy as np
    >>> callback = ReconstructionImages(np.zeros((2, 28, 28, 1)), np.array([1, 7]),
    ...                                 "/tmp/capsnet_logs", max_images=16)
    >>> callback.images.shape
    (2, 28, 28, 1)
    """

    def __init__(self, images, labels, log_dir, max_images=16):
        super().__init__()
        if not isinstance(max_images, int) or max_images < 1:
            raise ValueError(f"`max_images` must be a positive integer. Received: {max_images!r}")
        images = np.asarray(images, "float32")[:max_images]
        labels = np.asarray(labels, "int32")[:max_images]
        if images.ndim != 4 or len(images) != len(labels) or not len(images):
            raise ValueError(
                "`images` must be [n, H, W, C] with n >= 1 and `labels` [n] "
                "(or [n, 2] for two targets). "
                f"Received: images {images.shape}, labels {labels.shape}"
            )
        self.images = images
        self.labels = labels
        self.log_dir = log_dir
        self.max_images = max_images
        self._writer = None

    def on_train_begin(self, logs=None):
        if not getattr(self.model, "reconstruction", True):
            raise ValueError(
                "ReconstructionImages needs a CapsNet with a decoder "
                "(reconstruction=True)."
            )

    def on_epoch_end(self, epoch, logs=None):
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self.log_dir)
        outputs = self.model({"image": self.images, "label": self.labels}, training=False)
        lengths = np.asarray(outputs["length"])
        reconstructions = np.asarray(outputs["reconstruction"])
        images = self.images
        if reconstructions.ndim == 5:  # two targets: Figure 5's colours
            predictions = [",".join(map(str, pair)) for pair in np.argsort(-lengths)[:, :2]]
            labels = [",".join(map(str, pair)) for pair in self.labels]
            reconstructions = two_colour(reconstructions[:, 0], reconstructions[:, 1])
            images = np.repeat(images[..., :1], 3, axis=-1)
            what = ("the two longest class capsules, each decoded alone (red: longest, "
                    "green: second)")
        else:
            predictions, labels = lengths.argmax(-1), self.labels
            what = "the predicted (longest) class capsule"
            if images.shape[-1] not in (1, 3):  # e.g. smallNORB's stereo pair
                images, reconstructions = images[..., :1], reconstructions[..., :1]
        mosaic = reconstruction_mosaic(images, reconstructions)
        description = (
            f"Top row: test inputs; bottom row: reconstructions from {what}.  \n"
            f"True labels: {' '.join(str(label) for label in labels)}  \n"
            f"Predicted:   {' '.join(str(label) for label in predictions)}"
        )
        with self._writer.as_default():
            tf.summary.image("reconstructions", mosaic[None], step=epoch,
                             description=description)
        self._writer.flush()

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.close()
            self._writer = None
