r"""Trains and evaluates CapsNet on MNIST (or Fashion-MNIST) with `model.fit`.

Usage, from the repository root or from `experiments/`:

    python experiments/mnist.py --flagfile=mnist.flags
    python experiments/mnist.py --flagfile=mnist.flags --epochs=1 --workdir=/tmp/capsnet

A `--flagfile` path that does not exist relative to the current directory is
looked up next to this script, so `--flagfile=mnist.flags` works from both
places. Flags after the flagfile override it. The work directory receives
`config.json`, the best and latest checkpoints, TensorBoard logs, a CSV log and
`results.json`; rerunning the same command resumes an interrupted run.
"""

import os
import sys

from absl import app, flags, logging

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))  # the repository, when not installed

_WORKDIR = flags.DEFINE_string(
    "workdir", "/tmp/capsnet_mnist", "Directory for the configuration, checkpoints and logs."
)
_OVERWRITE = flags.DEFINE_bool(
    "overwrite", False, "Replace a run with a different model configuration in --workdir."
)
_DATASET = flags.DEFINE_enum(
    "dataset", "mnist", ["mnist", "fashion_mnist"], "TensorFlow-Datasets data set."
)
_DATA_DIR = flags.DEFINE_string(
    "data_dir", None, "TFDS data directory (default: $TFDS_DATA_DIR or ~/tensorflow_datasets)."
)
_EPOCHS = flags.DEFINE_integer("epochs", 1, "Training epochs.", lower_bound=1)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 128, "Batch size.", lower_bound=1)
_LEARNING_RATE = flags.DEFINE_float(
    "learning_rate", 1e-3, "Adam's initial learning rate.", lower_bound=0.0
)
_DECAY_STEPS = flags.DEFINE_integer(
    "decay_steps", 2000, "Steps per learning-rate decay of --decay_rate.", lower_bound=1
)
_DECAY_RATE = flags.DEFINE_float(
    "decay_rate", 0.96, "Learning-rate decay factor.", lower_bound=0.0, upper_bound=1.0
)
_MIN_LEARNING_RATE = flags.DEFINE_float(
    "min_learning_rate", 1e-6, "Floor of the learning rate.", lower_bound=0.0
)
_ROUTING_ITERATIONS = flags.DEFINE_integer(
    "routing_iterations", 3, "Routing iterations in the class capsules.", lower_bound=1
)
_LEAKY_ROUTING = flags.DEFINE_bool("leaky_routing", False, "Leaky routing.")
_RECONSTRUCTION = flags.DEFINE_bool(
    "reconstruction", True, "Train the decoder with the reconstruction loss."
)
_RECONSTRUCTION_WEIGHT = flags.DEFINE_float(
    "reconstruction_weight", 0.0005, "Weight of the summed squared error.", lower_bound=0.0
)
_MARGIN_REDUCTION = flags.DEFINE_enum(
    "margin_class_reduction",
    "sum",
    ["sum", "official"],
    "Margin loss over classes: 'sum' (paper) or 'official' (0.5 x mean).",
)
_OFFICIAL_PRIMARY_SCALING = flags.DEFINE_bool(
    "official_primary_scaling", False, "Divide PrimaryCaps pre-activations by the number of types."
)
_INITIALIZER = flags.DEFINE_enum(
    "initializer", "keras", ["keras", "official"], "Weight initialisers."
)
_SHIFT = flags.DEFINE_integer(
    "shift", 2, "Maximum random shift of training images, pixels.", lower_bound=0
)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of initialisation, shuffling and augmentation.")
_STEPS_PER_EPOCH = flags.DEFINE_integer(
    "steps_per_epoch", None, "Stop each epoch after this many steps.", lower_bound=1
)
_EVAL_EXAMPLES = flags.DEFINE_integer(
    "eval_examples", None, "Evaluate on the first N test examples only.", lower_bound=1
)
_TRAIN_EXAMPLES = flags.DEFINE_integer(
    "train_examples", None, "Train on the first N training examples only.", lower_bound=1
)
_JIT_COMPILE = flags.DEFINE_bool("jit_compile", False, "Compile steps with XLA.")
_MIXED_PRECISION = flags.DEFINE_enum(
    "mixed_precision", "float32", ["float32", "bfloat16", "float16"], "Compute precision."
)
_VERBOSE = flags.DEFINE_enum(
    "verbose", "auto", ["auto", "0", "1", "2"], "Keras verbosity: 1 progress bar, 2 one line/epoch."
)


def resolve_flagfiles(argv, search_dir=_HERE):
    """Rewrites `--flagfile=NAME` to this script's folder when NAME is not found."""
    resolved = []
    for argument in argv:
        for prefix in ("--flagfile=", "-flagfile="):
            if argument.startswith(prefix):
                path = argument[len(prefix):]
                fallback = os.path.join(search_dir, path)
                if not os.path.exists(path) and os.path.exists(fallback):
                    argument = prefix + fallback
        resolved.append(argument)
    return resolved


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    from capsnet_tf.data import DatasetNotFoundError
    from capsnet_tf.training import ExperimentConfig, IncompatibleWorkdirError, train_and_evaluate

    verbose = _VERBOSE.value if _VERBOSE.value == "auto" else int(_VERBOSE.value)
    config = ExperimentConfig(
        dataset=_DATASET.value,
        data_dir=_DATA_DIR.value,
        epochs=_EPOCHS.value,
        batch_size=_BATCH_SIZE.value,
        learning_rate=_LEARNING_RATE.value,
        decay_steps=_DECAY_STEPS.value,
        decay_rate=_DECAY_RATE.value,
        minimum_learning_rate=_MIN_LEARNING_RATE.value,
        routing_iterations=_ROUTING_ITERATIONS.value,
        leaky_routing=_LEAKY_ROUTING.value,
        reconstruction=_RECONSTRUCTION.value,
        reconstruction_weight=_RECONSTRUCTION_WEIGHT.value,
        margin_class_reduction=_MARGIN_REDUCTION.value,
        official_primary_scaling=_OFFICIAL_PRIMARY_SCALING.value,
        initializer=_INITIALIZER.value,
        shift=_SHIFT.value,
        seed=_SEED.value,
        steps_per_epoch=_STEPS_PER_EPOCH.value,
        eval_examples=_EVAL_EXAMPLES.value,
        train_examples=_TRAIN_EXAMPLES.value,
        jit_compile=_JIT_COMPILE.value,
        mixed_precision=_MIXED_PRECISION.value,
        verbose=verbose,
    )
    logging.info("Configuration:\n%s", config.to_json())
    try:
        results = train_and_evaluate(config, _WORKDIR.value, overwrite=_OVERWRITE.value)
    except (DatasetNotFoundError, IncompatibleWorkdirError, ValueError) as error:
        sys.exit(f"error: {error}")
    print(
        f"Test accuracy: {100 * results['test_accuracy']:.2f}%  "
        f"test error: {100 * results['test_error']:.2f}%  "
        f"(work directory: {_WORKDIR.value})"
    )


if __name__ == "__main__":
    app.run(main, argv=resolve_flagfiles(sys.argv))
