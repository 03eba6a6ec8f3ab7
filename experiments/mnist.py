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

import time

_START_TIME = time.time()  # the run's clock (time to --target_accuracy) starts here

import os  # noqa: E402
import sys  # noqa: E402

from absl import app, flags, logging  # noqa: E402

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))  # the repository, when not installed

_WORKDIR = flags.DEFINE_string(
    "workdir", "/tmp/capsnet_mnist", "Directory for the configuration, checkpoints and logs."
)
_OVERWRITE = flags.DEFINE_bool(
    "overwrite", False, "Replace a run with a different model configuration in --workdir."
)
_DATASET = flags.DEFINE_enum(
    "dataset",
    "mnist",
    ["mnist", "fashion_mnist", "multi_mnist", "expanded_mnist", "cifar10", "smallnorb"],
    "Data set: TFDS mnist / fashion_mnist / cifar10 / smallnorb, or generated from "
    "MNIST: multi_mnist (two overlapping digits, 36x36), expanded_mnist (40x40, "
    "shifted; also evaluated on an affNIST-style test set).",
)
_MODEL = flags.DEFINE_enum(
    "model", "capsnet", ["capsnet", "baseline"], "CapsNet or the paper's baseline CNN."
)
_TEST_PAIRS_PER_IMAGE = flags.DEFINE_integer(
    "test_pairs_per_image",
    1,
    "multi_mnist: test pairs per MNIST test image (the paper used 1000).",
    lower_bound=1,
)
_AFFNIST_PATH = flags.DEFINE_string(
    "affnist_path",
    None,
    "expanded_mnist: real affNIST test data (test.mat or .npz) instead of the generated set.",
)
_NUM_TRIALS = flags.DEFINE_integer(
    "num_trials",
    1,
    "Train this many models (seeds seed, seed+1, ...) and evaluate their ensemble.",
    lower_bound=1,
)
_DATA_DIR = flags.DEFINE_string(
    "data_dir", None, "TFDS data directory (default: $TFDS_DATA_DIR or ~/tensorflow_datasets)."
)
_EPOCHS = flags.DEFINE_integer("epochs", 1, "Training epochs.", lower_bound=1)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 128, "Batch size.", lower_bound=1)
_LEARNING_RATE = flags.DEFINE_float(
    "learning_rate", 1e-3, "Adam's initial learning rate.", lower_bound=0.0
)
_SCHEDULE = flags.DEFINE_enum(
    "schedule",
    "exponential",
    ["exponential", "cosine"],
    "Learning-rate schedule: exponential (official: x --decay_rate every --decay_steps, "
    "floor --min_learning_rate) or cosine (linear warm-up over --warmup_epochs from a "
    "tenth of --learning_rate, then cosine decay to --min_learning_rate at the last epoch).",
)
_WARMUP_EPOCHS = flags.DEFINE_float(
    "warmup_epochs", 0.0, "--schedule=cosine: epochs of linear warm-up.", lower_bound=0.0
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
_PADDING = flags.DEFINE_enum(
    "padding", "valid", ["valid", "same"], "Padding of both convolutions (CIFAR-10: same)."
)
_PRIMARY_CAPSULE_TYPES = flags.DEFINE_integer(
    "primary_capsule_types", 32, "Capsule maps in PrimaryCaps (CIFAR-10: 64).", lower_bound=1
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
_VALIDATION_EXAMPLES = flags.DEFINE_integer(
    "validation_examples",
    None,
    "mnist/fashion_mnist: hold out the last N training images as a validation split "
    "(never trained on or augmented) that chooses the best checkpoint; the test set is "
    "then evaluated every epoch beside it but selects nothing. Default: none (the "
    "official behaviour: the test set is the validation data).",
    lower_bound=1,
)
_TARGET_ACCURACY = flags.DEFINE_float(
    "target_accuracy",
    None,
    "Stop at the first epoch whose test accuracy reaches this (e.g. 0.995) and record the "
    "wall-clock time from the command's start (time_to_target.json, results.json).",
    lower_bound=0.0,
    upper_bound=1.0,
)
_JIT_COMPILE = flags.DEFINE_bool(
    "jit_compile",
    False,
    "Compile the whole train/eval steps with XLA (for GPUs/TPUs; on CPUs XLA's "
    "convolutions made a float32 step 25x slower). The routing is XLA-compiled "
    "in training either way.",
)
_MIXED_PRECISION = flags.DEFINE_enum(
    "mixed_precision", "float32", ["float32", "bfloat16", "float16"], "Compute precision."
)
_VERBOSE = flags.DEFINE_enum(
    "verbose", "auto", ["auto", "0", "1", "2"], "Keras verbosity: 1 progress bar, 2 one line/epoch."
)
_BACKUP_EVERY_STEPS = flags.DEFINE_integer(
    "backup_every_steps", 100,
    "Also back up the training state every this many steps inside an epoch (besides every "
    "epoch end), so that a killed run, rerun with the same command, loses at most that many.",
    lower_bound=1,
)
_STRATEGY = flags.DEFINE_enum(
    "strategy",
    "default",
    ["default", "mirrored", "multi_worker", "tpu"],
    "Distribution: default (one device); mirrored (all local GPUs, or --devices; one CPU "
    "replica without either); multi_worker (one process per machine, cluster from "
    "$TF_CONFIG); tpu (--tpu). --batch_size is the global batch, split across replicas.",
)
_DEVICES = flags.DEFINE_list(
    "devices",
    None,
    "--strategy=mirrored only: devices to train on, e.g. /gpu:0,/gpu:1 (or /cpu:0,/cpu:1 "
    "to split the CPU into logical devices). Default: all local GPUs.",
)
_TPU = flags.DEFINE_string(
    "tpu",
    None,
    "--strategy=tpu only: TPU name or grpc://host:port address, or 'local' on a TPU VM "
    "(default: $TPU_NAME or the local TPU).",
)


def resolve_flagfiles(argv, search_dir=_HERE):
    """Expands `--flagfile=NAME` arguments, nested ones included, in place.

    NAME is looked up in the current directory, then next to the flagfile
    that names it (for nested flagfiles), then in `search_dir` (this
    script's folder), so `--flagfile=multi_mnist.flags`, which itself starts
    with `--flagfile=mnist.flags`, works from the repository root and from
    `experiments/`. Each flagfile's flags take its place in the argument
    list, so later flags override earlier ones as absl's own flagfiles do.
    A flagfile that cannot be found is left as it is for absl to report.
    """
    return _expand_flagfiles(argv, [search_dir], depth=0)


def _expand_flagfiles(argv, search_dirs, depth):
    if depth > 10:
        raise app.UsageError("Flagfiles include each other more than 10 levels deep.")
    expanded = []
    for argument in argv:
        prefix = next(
            (p for p in ("--flagfile=", "-flagfile=") if argument.startswith(p)), None
        )
        if prefix is None:
            expanded.append(argument)
            continue
        name = argument[len(prefix):]
        candidates = [name] + [os.path.join(folder, name) for folder in search_dirs]
        path = next((c for c in candidates if os.path.isfile(c)), None)
        if path is None:
            expanded.append(argument)
            continue
        with open(path) as file:
            lines = [line.strip() for line in file]
        flags_in_file = [
            line for line in lines if line and not line.startswith(("#", "//"))
        ]
        folder = os.path.dirname(os.path.abspath(path))
        expanded += _expand_flagfiles(flags_in_file, [folder] + search_dirs, depth + 1)
    return expanded


def main(argv):
    if len(argv) > 1:
        sys.exit(
            f"error: unexpected argument(s) {' '.join(argv[1:])!r}: this script takes flags "
            "only, written --name=value (boolean flags: --name or --noname). Remove the "
            "extra argument(s); pass --helpshort to see the flags."
        )
    from capsnet_tf.data import DatasetNotFoundError
    from capsnet_tf.extras import MissingDependencyError
    from capsnet_tf.training import (
        ExperimentConfig,
        IncompatibleWorkdirError,
        train_and_evaluate,
        train_ensemble,
    )

    verbose = _VERBOSE.value if _VERBOSE.value == "auto" else int(_VERBOSE.value)
    config = ExperimentConfig(
        dataset=_DATASET.value,
        data_dir=_DATA_DIR.value,
        epochs=_EPOCHS.value,
        batch_size=_BATCH_SIZE.value,
        learning_rate=_LEARNING_RATE.value,
        schedule=_SCHEDULE.value,
        warmup_epochs=_WARMUP_EPOCHS.value,
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
        padding=_PADDING.value,
        primary_capsule_types=_PRIMARY_CAPSULE_TYPES.value,
        shift=_SHIFT.value,
        seed=_SEED.value,
        steps_per_epoch=_STEPS_PER_EPOCH.value,
        eval_examples=_EVAL_EXAMPLES.value,
        train_examples=_TRAIN_EXAMPLES.value,
        validation_examples=_VALIDATION_EXAMPLES.value,
        target_accuracy=_TARGET_ACCURACY.value,
        jit_compile=_JIT_COMPILE.value,
        mixed_precision=_MIXED_PRECISION.value,
        verbose=verbose,
        model=_MODEL.value,
        test_pairs_per_image=_TEST_PAIRS_PER_IMAGE.value,
        affnist_path=_AFFNIST_PATH.value,
        num_trials=_NUM_TRIALS.value,
        strategy=_STRATEGY.value,
        devices=tuple(_DEVICES.value) if _DEVICES.value is not None else None,
        tpu=_TPU.value,
        backup_every_steps=_BACKUP_EVERY_STEPS.value,
    )
    logging.info("Configuration:\n%s", config.to_json())
    try:
        if config.num_trials > 1:
            results = train_ensemble(config, _WORKDIR.value, overwrite=_OVERWRITE.value)
        else:
            results = train_and_evaluate(
                config, _WORKDIR.value, overwrite=_OVERWRITE.value, start_time=_START_TIME
            )
    except (
        DatasetNotFoundError, IncompatibleWorkdirError, MissingDependencyError, ValueError
    ) as error:
        sys.exit(f"error: {error}")
    print(
        f"Test accuracy: {100 * results['test_accuracy']:.2f}%  "
        f"test error: {100 * results['test_error']:.2f}%  "
        f"(work directory: {_WORKDIR.value})"
    )
    if results.get("final_epoch_test_accuracy") is not None:
        print(f"Final epoch's test accuracy: {100 * results['final_epoch_test_accuracy']:.2f}%")
    if "time_to_target" in results:
        hit = results["time_to_target"]
        print(
            f"Time to {100 * hit['target_accuracy']:.2f}%: {hit['seconds']:.0f} s "
            f"(epoch {hit['epoch']}, step {hit['global_step']})"
        )
    for name, value in sorted(results.items()):
        shown = ("test_accuracy", "final_epoch_test_accuracy")
        if name.endswith("_accuracy") and name not in shown and value is not None:
            print(f"{name}: {100 * value:.2f}%")
    if "test_metrics" in results and "length_accuracy_any" in results["test_metrics"]:
        print(
            "At least one of the two digits right: "
            f"{100 * results['test_metrics']['length_accuracy_any']:.2f}%"
        )


if __name__ == "__main__":
    app.run(main, argv=resolve_flagfiles(sys.argv))
