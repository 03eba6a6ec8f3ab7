"""A small capsule network for another image size, built from capsnet_tf's parts.

Notebook-style example: `build_small_capsnet` assembles a classifier with a
reconstruction decoder from `PrimaryCapsule`, `CapsuleLayer`, `Length` and
`Mask`, and `main` trains it for a few steps with `model.fit` on
Fashion-MNIST padded to 32x32 (from the prepared TFDS copy; random data when
there is none), with the margin and reconstruction losses.

Run it from the repository root:

    python examples/fashion_mnist_capsules.py

or in a notebook:

    from fashion_mnist_capsules import build_small_capsnet, main
    results = main(steps=50)
    results["model"].summary()

No flags: change the arguments of `main` instead.
"""

import os
import sys

try:
    import capsnet_tf  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras
import numpy as np
import tensorflow as tf

from capsnet_tf import (
    RECONSTRUCTION_WEIGHT,
    CapsuleLayer,
    Length,
    MarginLoss,
    Mask,
    PrimaryCapsule,
    ReconstructionLoss,
)
from capsnet_tf.data import DatasetNotFoundError, load_tfds_split

__all__ = ["build_small_capsnet", "make_data", "main"]


def build_small_capsnet(
    image_shape=(32, 32, 1),
    num_classes=10,
    conv_filters=64,
    conv_kernel_size=5,
    primary_capsule_types=8,
    primary_capsule_dim=8,
    primary_kernel_size=5,
    capsule_dim=12,
    routing_iterations=3,
    decoder_units=(256,),
    name="small_capsnet",
):
    """A small CapsNet for `image_shape` images: conv, capsules, lengths, decoder.

    Conv2D (ReLU) -> `PrimaryCapsule` (stride 2) -> `CapsuleLayer` with
    routing -> `Length` gives one score per class; `Mask` keeps the capsule
    of the label (in training) or the longest one (otherwise), and a Dense
    decoder reconstructs the image from it.

    Args:
        image_shape: `(height, width, channels)`; any size for which both
            convolutions fit (`valid` padding).
        num_classes: number of classes (output capsules).
        conv_filters: filters of the first convolution.
        conv_kernel_size: its kernel size.
        primary_capsule_types: capsule maps of `PrimaryCapsule`.
        primary_capsule_dim: dimension of the primary capsules.
        primary_kernel_size: kernel size of `PrimaryCapsule`.
        capsule_dim: dimension of the class capsules.
        routing_iterations: routing iterations of `CapsuleLayer`.
        decoder_units: hidden layer sizes of the decoder.
        name: model name.

    Returns:
        A functional `keras.Model` taking `{"image": [batch, *image_shape]
        float32 in [0, 1], "label": [batch] int32}` and returning
        `{"length": [batch, num_classes], "reconstruction": [batch,
        *image_shape]}`. Outside training the label is not used (the longest
        capsule is decoded): pass zeros.

    Example:

    >>> model = build_small_capsnet((20, 24, 3), num_classes=5, conv_filters=8,
    ...                             primary_capsule_types=2, capsule_dim=4,
    ...                             decoder_units=(16,))
    >>> outputs = model({"image": np.zeros((2, 20, 24, 3), "float32"),
    ...                  "label": np.zeros((2,), "int32")})
    >>> tuple(outputs["length"].shape), tuple(outputs["reconstruction"].shape)
    ((2, 5), (2, 20, 24, 3))
    """
    image = keras.Input(shape=image_shape, name="image")
    label = keras.Input(shape=(), dtype="int32", name="label")
    features = keras.layers.Conv2D(
        conv_filters, conv_kernel_size, activation="relu", name="conv1"
    )(image)
    primary = PrimaryCapsule(
        num_capsule_types=primary_capsule_types,
        capsule_dim=primary_capsule_dim,
        kernel_size=primary_kernel_size,
        strides=2,
        name="primary_capsules",
    )(features)
    capsules = CapsuleLayer(
        num_capsules=num_classes,
        capsule_dim=capsule_dim,
        routing_iterations=routing_iterations,
        name="class_capsules",
    )(primary)
    lengths = Length(name="length")(capsules)
    masked = Mask(name="mask")(capsules, label)
    decoder = keras.Sequential(
        [keras.layers.Flatten()]
        + [keras.layers.Dense(units, activation="relu") for units in decoder_units]
        + [
            keras.layers.Dense(int(np.prod(image_shape)), activation="sigmoid"),
            keras.layers.Reshape(image_shape),
        ],
        name="decoder",
    )
    return keras.Model(
        {"image": image, "label": label},
        {"length": lengths, "reconstruction": decoder(masked)},
        name=name,
    )


def make_data(split, batch_size, image_size=32, data_dir=None, take=None, seed=0):
    """Fashion-MNIST padded to `image_size`, or random data when it is missing.

    Args:
        split: TFDS split (`"train"`, `"test"`).
        batch_size: examples per batch.
        image_size: output height and width (zero padding or cropping around
            the 28x28 image).
        data_dir: TFDS directory (default: `$TFDS_DATA_DIR`).
        take: keep the first `take` examples.
        seed: shuffle seed and the seed of random data.

    Returns:
        `(dataset, source)`: batches of `(inputs, targets)` for the model of
        `build_small_capsnet`, and `"fashion_mnist"` or `"random"`.
    """
    try:
        dataset, _ = load_tfds_split("fashion_mnist", split, data_dir)
        source = "fashion_mnist"
    except DatasetNotFoundError as error:
        print(f"Fashion-MNIST not available ({error}); using random data instead.")
        rng = np.random.default_rng(seed)
        count = take or 1024
        images = rng.integers(0, 256, (count, 28, 28, 1), dtype=np.uint8)
        labels = rng.integers(0, 10, count)
        dataset = tf.data.Dataset.from_tensor_slices((images, labels))
        source = "random"
    if take is not None:
        dataset = dataset.take(take)

    def prepare(image, label):
        image = tf.image.resize_with_crop_or_pad(
            tf.cast(image, tf.float32) / 255.0, image_size, image_size
        )
        label = tf.cast(label, tf.int32)
        return {"image": image, "label": label}, {"length": label, "reconstruction": image}

    dataset = dataset.map(prepare, num_parallel_calls=tf.data.AUTOTUNE)
    if split.startswith("train"):
        dataset = dataset.shuffle(4096, seed=seed).repeat()
    return dataset.batch(batch_size).prefetch(tf.data.AUTOTUNE), source


def main(steps=30, batch_size=32, image_size=32, eval_examples=256, data_dir=None,
         seed=0, verbose=2):
    """Builds the small capsule network and trains it for `steps` steps.

    Args:
        steps: training steps (one epoch of `steps` batches).
        batch_size: examples per batch.
        image_size: height and width of the padded Fashion-MNIST images.
        eval_examples: test examples evaluated after training.
        data_dir: TFDS directory (default: `$TFDS_DATA_DIR`).
        seed: seed of initialisation and shuffling.
        verbose: `model.fit` verbosity.

    Returns:
        Dict with the trained `model`, the data `source` (`"fashion_mnist"`
        or `"random"`), the training `history` (dict of lists) and the test
        `accuracy` and `loss`.
    """
    keras.utils.set_random_seed(seed)
    train, source = make_data("train", batch_size, image_size, data_dir, seed=seed)
    test, _ = make_data("test", batch_size, image_size, data_dir, take=eval_examples, seed=seed)
    model = build_small_capsnet(image_shape=(image_size, image_size, 1))
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss={"length": MarginLoss(), "reconstruction": ReconstructionLoss()},
        # The paper's 0.0005 is for 784 pixels; keep the same weight per pixel.
        loss_weights={
            "length": 1.0,
            "reconstruction": RECONSTRUCTION_WEIGHT * 784 / image_size**2,
        },
        metrics={"length": [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]},
    )
    history = model.fit(
        train, epochs=1, steps_per_epoch=steps, shuffle=False, verbose=verbose
    )
    metrics = model.evaluate(test, return_dict=True, verbose=0)
    print(
        f"{source}: {steps} steps of {batch_size}; test accuracy on {eval_examples} "
        f"examples {metrics['length_accuracy']:.3f}"
    )
    return {
        "model": model,
        "source": source,
        "history": {key: [float(v) for v in values] for key, values in history.history.items()},
        "accuracy": float(metrics["length_accuracy"]),
        "loss": float(metrics["loss"]),
    }


if __name__ == "__main__":
    main()
