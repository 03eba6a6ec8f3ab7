"""Mean class-capsule length over the first Adam steps on an image folder, per vote scale.

Shows why `--vote_scaling` exists (docs/experiments.md, "Many primary
capsules"): with the paper's votes, 8,192 primary capsules and 3 classes, the
first step takes every class capsule to a length near 1.

Usage, from the repository root (TFDS_DATA_DIR need not be set):

    python examples/shapes_folder.py /tmp/shapes_val 48 300   # or write_shapes_folder(seed=1)
    python benchmarks/image_folder/first_steps.py /tmp/shapes_val

Prints one line per vote scale: `step:mean length` before steps 0, 1, 2, 5, 10, 19
(`mnist.flags` training settings, batch 16, seed 0).
"""

import os
import sys

import keras

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from capsnet_tf.config import ExperimentConfig  # noqa: E402
from capsnet_tf.data.registry import load_experiment_data  # noqa: E402
from capsnet_tf.training import build_model, compile_model  # noqa: E402


def main(folder, scales=(1.0, 0.1125, 0.042), steps=20, shown=(0, 1, 2, 5, 10, 19)):
    data, spec = load_experiment_data(
        "image_folder", "train", 16, True, image_folder=folder, shift=2
    )
    batches = list(data.take(steps))
    for scale in scales:
        keras.utils.set_random_seed(0)
        config = ExperimentConfig(image_folder=folder, vote_scaling="none", batch_size=16)
        model = build_model(config, spec.image_shape, spec.num_classes)
        model.get_layer("class_capsules").vote_scale = scale  # before the first call
        compile_model(model, config, steps_per_epoch=len(batches))
        lengths = []
        for step, (inputs, targets) in enumerate(batches):
            if step in shown:
                mean = model(inputs, training=False)["length"].numpy().mean()
                lengths.append(f"{step}:{mean:.3f}")
            model.train_on_batch(inputs, targets)
        print(f"vote_scale {scale}: " + " ".join(lengths), flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python benchmarks/image_folder/first_steps.py FOLDER")
    main(sys.argv[1])
