"""Training and evaluation of CapsNet with `model.fit`, free of flags.

`train_and_evaluate(config, workdir)` is what `experiments/mnist.py` calls; it
can be called from a notebook the same way. The work directory holds:

- `config.json`: the resolved `ExperimentConfig`;
- `model.json`: the `CapsNet` configuration (`CapsNet.from_config`);
- `checkpoints/latest.weights.h5` (every epoch) and
  `checkpoints/best.weights.h5` (best test accuracy so far): model weights
  only, each written atomically (`capsnet_tf.callbacks`);
- `backup/`: the training state (weights, optimizer, epoch and step), saved
  every epoch and every `backup_every_steps` steps, with the one before it, so
  that rerunning the same command after an interruption (even SIGKILL)
  resumes where it stopped and runs the same number of steps in all;
- `logs/`: TensorBoard, with the reconstructions of 16 test images drawn
  every epoch (`logs/reconstructions`); `training_log.csv`: one row per epoch;
- `results.json`: the final evaluation of the best checkpoint.
"""

import csv
import dataclasses
import json
import math
import os
import time

import keras

from capsnet_tf.callbacks import (
    DivergenceGuard,
    TrainingStateBackup,
    WeightsCheckpoint,
    load_weights,
)
from capsnet_tf.data.registry import DATASETS, load_experiment_data
from capsnet_tf.distribute import make_strategy, prepare_model, shard_by_data, worker_workdir
from capsnet_tf.losses import MarginLoss, ReconstructionLoss
from capsnet_tf.models.capsnet import CapsNet
from capsnet_tf.progress import (
    EpochTimer,
    TargetAccuracy,
    TestSetEvaluation,
    WallClock,
    last_logged,
)
from capsnet_tf.schedules import FlooredExponentialDecay, warmup_cosine_decay

__all__ = [
    "ExperimentConfig",
    "IncompatibleWorkdirError",
    "build_model",
    "compile_model",
    "load_trained_model",
    "accuracy_key",
    "read_run_files",
    "score_output",
    "train_and_evaluate",
    "train_ensemble",
]

_MODEL_FIELDS = (
    "model",
    "dataset",
    "routing_iterations",
    "leaky_routing",
    "reconstruction",
    "official_primary_scaling",
    "initializer",
    "padding",
    "primary_capsule_types",
)


class IncompatibleWorkdirError(ValueError):
    """The work directory holds a run whose model differs from the requested one."""


@dataclasses.dataclass
class ExperimentConfig:
    """Everything that defines a training run; defaults are the official MNIST run.

    Attributes:
        dataset: TFDS name (`"mnist"`, `"fashion_mnist"`).
        data_dir: TFDS data directory (None: `$TFDS_DATA_DIR` or the default).
        epochs: training epochs.
        batch_size: examples per training and evaluation batch.
        learning_rate: Adam's initial learning rate.
        schedule: `"exponential"` (the official continuous decay,
            `FlooredExponentialDecay`) or `"cosine"` (linear warm-up over
            `warmup_epochs` from a tenth of `learning_rate`, then cosine
            decay to `minimum_learning_rate` at the end of `epochs`).
        decay_steps, decay_rate, minimum_learning_rate: the exponential
            decay; `minimum_learning_rate` is also the cosine's end.
        warmup_epochs: `"cosine"`: epochs of linear warm-up.
        routing_iterations: routing iterations in the class capsules.
        leaky_routing: leaky routing.
        reconstruction: train the decoder with the reconstruction loss.
        reconstruction_weight: weight of the summed squared error (0.0005).
        margin_class_reduction: `"sum"` (paper) or `"official"`.
        official_primary_scaling: the official release's PrimaryCaps scaling.
        initializer: `"official"` or `"keras"`.
        padding: `"valid"` or `"same"`.
        primary_capsule_types: capsule maps in PrimaryCaps.
        shift: maximum random shift of training images, pixels.
        seed: seed of initialisation, shuffling and augmentation.
        steps_per_epoch: stop each epoch after this many steps (None: all).
        eval_examples: evaluate on the first N test examples (None: all).
        train_examples: train on the first N training examples (None: all).
        validation_examples: hold out the last N training examples as a
            validation split (never trained on, never augmented) that
            chooses the best checkpoint; the test set is then evaluated
            every epoch beside it (`test_*` logs) but selects nothing. None:
            the official behaviour, the test set as the validation data.
        target_accuracy: stop at the first epoch whose test accuracy is at
            least this, and record the time to it (`time_to_target.json`,
            `results.json`). None: train all `epochs`.
        jit_compile: compile train/eval steps with XLA.
        mixed_precision: `"float32"`, `"bfloat16"` or `"float16"`.
        verbose: Keras verbosity for fit/evaluate (`"auto"`, 0, 1, 2).
        model: `"capsnet"` or `"baseline"` (the paper's CNN baseline).
        test_pairs_per_image: MultiMNIST test set size, in pairs per MNIST
            test image (the paper used 1,000).
        affnist_path: real affNIST test data to evaluate on (expanded_mnist
            runs); None: the generated affNIST-style test set.
        num_trials: models trained with seeds `seed, seed + 1, ...` and
            evaluated as an ensemble (the official `--num_trials`).
        strategy: `"default"`, `"mirrored"`, `"multi_worker"` or `"tpu"`.
        devices: devices for `"mirrored"` (None: all local GPUs, else CPU).
        tpu: TPU address for `"tpu"`.
        backup_every_steps: also back up training state every this many
            steps inside an epoch, so that a killed run loses at most this
            many steps (None: at epoch ends only).
    """

    dataset: str = "mnist"
    data_dir: str | None = None
    epochs: int = 1
    batch_size: int = 128
    learning_rate: float = 1e-3
    schedule: str = "exponential"
    warmup_epochs: float = 0.0
    decay_steps: int = 2000
    decay_rate: float = 0.96
    minimum_learning_rate: float = 1e-6
    routing_iterations: int = 3
    leaky_routing: bool = False
    reconstruction: bool = True
    reconstruction_weight: float = 0.0005
    margin_class_reduction: str = "sum"
    official_primary_scaling: bool = False
    initializer: str = "keras"
    padding: str = "valid"
    primary_capsule_types: int = 32
    shift: int = 2
    seed: int = 0
    steps_per_epoch: int | None = None
    eval_examples: int | None = None
    train_examples: int | None = None
    validation_examples: int | None = None
    target_accuracy: float | None = None
    jit_compile: bool = False
    mixed_precision: str = "float32"
    verbose: str | int = "auto"
    model: str = "capsnet"
    test_pairs_per_image: int = 1
    affnist_path: str | None = None
    num_trials: int = 1
    strategy: str = "default"
    devices: tuple | None = None
    tpu: str | None = None
    backup_every_steps: int | None = 100

    def validate(self):
        """Raises `ValueError` naming the first invalid field."""
        positive = ("epochs", "batch_size", "decay_steps", "routing_iterations",
                    "primary_capsule_types", "test_pairs_per_image", "num_trials")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
        for name in ("steps_per_epoch", "eval_examples", "train_examples", "backup_every_steps",
                     "validation_examples"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"`{name}` must be None or >= 1. Received: {name}={value!r}")
        if not self.learning_rate > 0:
            raise ValueError(f"`learning_rate` must be > 0. Received: {self.learning_rate}")
        if self.schedule not in ("exponential", "cosine"):
            raise ValueError(
                f"`schedule` must be exponential or cosine. Received: schedule={self.schedule!r}"
            )
        if self.warmup_epochs < 0 or self.warmup_epochs >= self.epochs:
            raise ValueError(
                "`warmup_epochs` must be >= 0 and less than `epochs`. "
                f"Received: warmup_epochs={self.warmup_epochs}, epochs={self.epochs}"
            )
        if self.target_accuracy is not None and not 0 < self.target_accuracy <= 1:
            raise ValueError(
                "`target_accuracy` must be in (0, 1] (0.995 for 99.5%). "
                f"Received: target_accuracy={self.target_accuracy}"
            )
        if self.validation_examples is not None and self.dataset not in (
            "mnist", "fashion_mnist"
        ):
            raise ValueError(
                "`validation_examples` holds out training images of mnist or fashion_mnist "
                f"only. Received: dataset={self.dataset!r}"
            )
        if self.shift < 0:
            raise ValueError(f"`shift` must be >= 0. Received: shift={self.shift}")
        if self.reconstruction_weight < 0:
            raise ValueError(
                f"`reconstruction_weight` must be >= 0. Received: {self.reconstruction_weight}"
            )
        if self.mixed_precision not in ("float32", "bfloat16", "float16"):
            raise ValueError(
                "`mixed_precision` must be float32, bfloat16 or float16. "
                f"Received: {self.mixed_precision!r}"
            )
        choices = {
            "model": ("capsnet", "baseline"),
            "strategy": ("default", "mirrored", "multi_worker", "tpu"),
            "dataset": tuple(name for name in DATASETS if name != "affnist"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"`{name}` must be one of {', '.join(allowed)}. "
                    f"Received: {name}={getattr(self, name)!r}"
                )
        if self.num_trials > 1 and self.strategy == "multi_worker":
            raise ValueError(
                "`num_trials` > 1 (an ensemble) cannot run under the multi_worker "
                "strategy: train the members as separate multi-worker runs with "
                "different --seed values instead."
            )
        return self

    def to_json(self):
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)


def build_model(config, image_shape, num_classes, num_targets=1):
    """The model of `config` (CapsNet or the baseline CNN) for these images.

    Args:
        config: an `ExperimentConfig`.
        image_shape: `(height, width, channels)`.
        num_classes: number of classes.
        num_targets: labels per image (2 for MultiMNIST; CapsNet only).

    Returns:
        An uncompiled `CapsNet` or `BaselineCNN`.
    """
    if config.model == "baseline":
        from capsnet_tf.models.baseline import BaselineCNN

        return BaselineCNN(image_shape=image_shape, num_classes=num_classes, name="baseline")
    options = {"num_targets": num_targets} if num_targets != 1 else {}
    return CapsNet(
        image_shape=image_shape,
        num_classes=num_classes,
        padding=config.padding,
        primary_capsule_types=config.primary_capsule_types,
        routing_iterations=config.routing_iterations,
        leaky_routing=config.leaky_routing,
        reconstruction=config.reconstruction,
        official_primary_scaling=config.official_primary_scaling,
        initializer=config.initializer,
        name="capsnet",
        **options,
    )


def score_output(model_kind):
    """The output holding class scores: `"length"` (CapsNet) or `"logits"`."""
    return "logits" if model_kind == "baseline" else "length"


def accuracy_key(config):
    """The key of the accuracy in Keras logs for the model of `config`.

    Keras prefixes metrics with the output name only when the model has
    several outputs: `"length_accuracy"` for CapsNet with its decoder,
    `"accuracy"` for CapsNet without one and for the baseline CNN.
    """
    if config.model == "capsnet" and config.reconstruction:
        return "length_accuracy"
    return "accuracy"


def compile_model(model, config, num_targets=1, steps_per_epoch=None):
    """Compiles with Adam and the schedule of `config`, and the losses of the model.

    `steps_per_epoch` (training steps in one epoch) is needed by the cosine
    schedule, which ends with the run.

    CapsNet: margin loss on `length` (+ weighted reconstruction loss);
    accuracy, or for two targets the official "correct" (`accuracy`: both
    labels are the two longest capsules) and "almost" (`accuracy_any`).
    Baseline CNN: softmax cross-entropy on `logits`, accuracy.
    """
    if config.schedule == "cosine":
        if not steps_per_epoch:
            raise ValueError("The cosine schedule needs `steps_per_epoch`.")
        schedule = warmup_cosine_decay(
            config.learning_rate,
            total_steps=config.epochs * steps_per_epoch,
            warmup_steps=round(config.warmup_epochs * steps_per_epoch),
            minimum_learning_rate=config.minimum_learning_rate,
        )
    else:
        schedule = FlooredExponentialDecay(
            config.learning_rate,
            config.decay_steps,
            config.decay_rate,
            config.minimum_learning_rate,
        )
    if config.model == "baseline":
        loss = {"logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True)}
        loss_weights = {"logits": 1.0}
        metrics = {"logits": [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]}
    else:
        loss = {"length": MarginLoss(class_reduction=config.margin_class_reduction)}
        loss_weights = {"length": 1.0}
        if config.reconstruction:
            loss["reconstruction"] = ReconstructionLoss()
            loss_weights["reconstruction"] = config.reconstruction_weight
        if num_targets == 1:
            metrics = {"length": [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]}
        else:
            from capsnet_tf.metrics import MultiLabelAccuracy

            metrics = {
                "length": [
                    MultiLabelAccuracy(mode="all", name="accuracy"),
                    MultiLabelAccuracy(mode="any", name="accuracy_any"),
                ]
            }
    # epsilon 1e-8: TensorFlow 1's AdamOptimizer default, used by the official release.
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=schedule, epsilon=1e-8),
        loss=loss,
        loss_weights=loss_weights,
        metrics=metrics,
        jit_compile=config.jit_compile,
    )
    return model


# What a run writes into its work directory; `--overwrite` removes these only.
_RUN_FILES = (
    "config.json",
    "model.json",
    "results.json",
    "training_log.csv",
    "time_to_target.json",
    "checkpoints",
    "backup",
    "logs",
)


def _remove_run_files(workdir):
    """Deletes the files of an earlier run (and nothing else) from `workdir`."""
    import shutil

    for name in _RUN_FILES:
        path = os.path.join(workdir, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)


def _check_workdir(workdir, config, overwrite):
    """Refuses a work directory whose saved run has a different model.

    With `overwrite`, the earlier run's files (`_RUN_FILES`) are deleted so
    that the new run starts from scratch instead of resuming a backup of
    another model; other files in the directory are left alone.
    """
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        return
    if overwrite:
        _remove_run_files(workdir)
        return
    try:
        with open(path) as file:
            saved = json.load(file)
    except (OSError, json.JSONDecodeError) as error:
        raise IncompatibleWorkdirError(
            f"{path} exists but cannot be read ({error}); choose another --workdir "
            "or pass --overwrite to start afresh."
        ) from None
    current = dataclasses.asdict(config)
    differences = [
        f"{name}: saved {saved.get(name)!r}, requested {current[name]!r}"
        for name in _MODEL_FIELDS
        if saved.get(name) != current[name]
    ]
    if differences:
        raise IncompatibleWorkdirError(
            f"The work directory {workdir!r} holds a run with a different model ("
            + "; ".join(differences)
            + "). Use another --workdir, or pass --overwrite to replace it."
        )


def _best_logged(csv_path, metric):
    """The best value of `metric` in an earlier run's CSV log, or None."""
    if not os.path.exists(csv_path):
        return None
    with open(csv_path, newline="") as file:
        values = [
            float(row[metric]) for row in csv.DictReader(file) if row.get(metric)
        ]
    return max(values) if values else None


def _not_a_run_message(path, workdir):
    return (
        f"{path} does not exist: is {workdir!r} a work directory of a finished "
        "training run (experiments/mnist.py --workdir=...)?"
    )


def read_run_files(workdir, require_model=True):
    """The experiment and model configurations saved in a work directory.

    Args:
        workdir: a directory written by `train_and_evaluate`.
        require_model: raise when `model.json` is missing (else return `{}`).

    Returns:
        `(config, model_config)`: the dicts of `config.json` and `model.json`.

    Raises:
        FileNotFoundError: a required file is missing; the message names it.
    """
    contents = {}
    for name in ("config.json", "model.json"):
        path = os.path.join(workdir, name)
        if not os.path.exists(path):
            if name == "model.json" and not require_model:
                contents[name] = {}
                continue
            raise FileNotFoundError(_not_a_run_message(path, workdir))
        with open(path) as file:
            contents[name] = json.load(file)
    return contents["config.json"], contents["model.json"]


def load_trained_model(workdir, checkpoint="best"):
    """Rebuilds the model of a work directory and loads one of its checkpoints.

    Args:
        workdir: a directory written by `train_and_evaluate`.
        checkpoint: `"best"` or `"latest"`.

    Returns:
        `(model, config)`: the training `CapsNet` (or `BaselineCNN`) with the
        weights loaded (call `model.inference_model()` for the image-only
        model) and the `ExperimentConfig` of the run.

    Raises:
        FileNotFoundError: no `config.json` or no such checkpoint, named.
        ValueError: the checkpoint cannot be read or does not fit the model.
    """
    if checkpoint not in ("best", "latest"):
        raise ValueError(f'`checkpoint` must be "best" or "latest". Received: {checkpoint!r}')
    weights_path = os.path.join(workdir, "checkpoints", f"{checkpoint}.weights.h5")
    saved, model_config = read_run_files(workdir)
    if not os.path.exists(weights_path):
        raise FileNotFoundError(_not_a_run_message(weights_path, workdir))
    known = {field.name for field in dataclasses.fields(ExperimentConfig)}
    config = ExperimentConfig(**{k: v for k, v in saved.items() if k in known})
    if config.model == "baseline":
        from capsnet_tf.models.baseline import BaselineCNN

        model = BaselineCNN.from_config(model_config)
    else:
        model = CapsNet.from_config(model_config)
    try:
        load_weights(model, weights_path)
    except ValueError as error:  # CheckpointError: truncated, corrupted, other model
        other = "latest" if checkpoint == "best" else "best"
        raise ValueError(
            f"Cannot load the checkpoint: {error} Try the {other} checkpoint "
            f"(checkpoint='{other}', --checkpoint={other}) or train again."
        ) from None
    return model, config


def _set_precision(config):
    policy = {"float32": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}
    keras.config.set_dtype_policy(policy[config.mixed_precision])


def _make_strategy(config):
    """The `tf.distribute` strategy of `config.strategy` (`capsnet_tf.distribute`)."""
    return make_strategy(config.strategy, config.devices, config.tpu)


def _make_datasets(config):
    """`(train_data, validation_data, test_data, spec, extra_evaluations)`.

    `validation_data` is the held-out split of `config.validation_examples`
    (None without one); `extra_evaluations` maps a name to a further test
    set evaluated after training (e.g. affNIST for runs on expanded MNIST).
    """
    train_data, spec = _load_split(config, "train")
    test_data, _ = _load_split(config, "test")
    validation_data = None
    if config.validation_examples:
        validation_data, _ = _load_split(config, "validation")
    extra_evaluations = {}
    if config.dataset == "expanded_mnist":
        extra_evaluations["affnist"], _ = _load_split(config, "test", name="affnist")
    if config.model == "baseline":
        if spec.num_targets != 1:
            raise ValueError(
                f"The baseline CNN classifies one object per image; {config.dataset!r} "
                f"has {spec.num_targets} labels per image. Use --model=capsnet."
            )
        train_data, test_data = (_baseline_targets(d) for d in (train_data, test_data))
        if validation_data is not None:
            validation_data = _baseline_targets(validation_data)
        extra_evaluations = {k: _baseline_targets(d) for k, d in extra_evaluations.items()}
    return train_data, validation_data, test_data, spec, extra_evaluations


def _load_split(config, split, name=None, reconstruction=None):
    """`(dataset, spec)` of one split as `config` asks for it.

    Args:
        config: an `ExperimentConfig`.
        split: `"train"` (shuffled, augmented, `train_examples`; without
            the last `validation_examples`), `"validation"` (those last
            training examples, neither shuffled nor augmented) or `"test"`
            (`eval_examples`).
        name: another data set than `config.dataset` (e.g. `"affnist"`).
        reconstruction: include the label input and reconstruction target
            (None: when the model is a CapsNet with a decoder).
    """
    training = split == "train"
    if reconstruction is None:
        reconstruction = config.reconstruction and config.model == "capsnet"
    take = config.train_examples if training else config.eval_examples
    held_out = config.validation_examples
    if split == "validation":
        split, take = f"train[-{held_out}:]", None
    elif training and held_out:
        split = f"train[:-{held_out}]"
    return load_experiment_data(
        name or config.dataset,
        split,
        config.batch_size,
        training=training,
        seed=config.seed,
        shift=config.shift,
        data_dir=config.data_dir,
        reconstruction=reconstruction,
        take=take,
        test_pairs_per_image=config.test_pairs_per_image,
        affnist_path=config.affnist_path,
    )


def _baseline_targets(dataset):
    """Renames the `length` target to the baseline CNN's `logits` output."""
    return dataset.map(lambda inputs, targets: ({"image": inputs["image"]},
                                                {"logits": targets["length"]}))


def _make_callbacks(config, workdir, spec, test_data, start_time):
    """Checkpointing, logging, progress and safety callbacks of a training run.

    `test_data` is evaluated every epoch beside a validation split
    (`config.validation_examples`); `start_time` starts the run's clock.
    """
    checkpoints = os.path.join(workdir, "checkpoints")
    os.makedirs(checkpoints, exist_ok=True)
    train_examples = config.train_examples or spec.num_examples
    csv_log = os.path.join(workdir, "training_log.csv")
    monitor = "val_" + accuracy_key(config)
    # Kept after the last epoch, so that rerunning a finished run neither
    # trains again nor replaces its best checkpoint. Last in the list: an
    # epoch counts as done only once its checkpoints and log row are written.
    backup = TrainingStateBackup(
        os.path.join(workdir, "backup"),
        save_every_steps=config.backup_every_steps,
        csv_log=csv_log,
    )
    clock = WallClock(start_time, csv_log)
    progress = [clock]
    test_monitor = monitor
    if config.validation_examples:
        progress.insert(0, TestSetEvaluation(test_data))  # before the clock reads the time
        test_monitor = "test_" + accuracy_key(config)
    if config.target_accuracy is not None:
        record = os.path.join(workdir, "time_to_target.json")
        progress.append(TargetAccuracy(test_monitor, config.target_accuracy, clock, record))
    callbacks = [
        # First: a NaN loss stops training before any callback saves that step.
        DivergenceGuard(
            backup=backup,
            advice=(
                "Lower --learning_rate (or check the input data) and run again with "
                "the same --workdir: training continues from the last backup."
            ),
        ),
        *progress,
        # Model weights only (no optimizer state), written atomically.
        WeightsCheckpoint(os.path.join(checkpoints, "latest.weights.h5")),
        WeightsCheckpoint(
            os.path.join(checkpoints, "best.weights.h5"),
            monitor=monitor,
            mode="max",
            # A resumed run keeps the best of the epochs before the interruption.
            initial_value_threshold=_best_logged(csv_log, monitor),
        ),
        EpochTimer(config.batch_size, train_examples),
        keras.callbacks.CSVLogger(csv_log, append=True),
        keras.callbacks.TensorBoard(os.path.join(workdir, "logs"), update_freq="epoch"),
    ]
    if config.reconstruction and config.model == "capsnet":
        from capsnet_tf.visualization import ReconstructionImages, load_test_images

        sample_images, sample_labels = load_test_images(
            config.dataset,
            16,
            config.data_dir,
            seed=config.seed,
            test_pairs_per_image=config.test_pairs_per_image,
            shift=config.shift,
        )
        callbacks.append(
            ReconstructionImages(
                sample_images,
                sample_labels,
                os.path.join(workdir, "logs", "reconstructions"),
                max_images=16,
            )
        )
    callbacks.append(backup)
    return callbacks


def train_and_evaluate(config, workdir, overwrite=False, start_time=None):
    """Trains the model of `config` on its data set and evaluates the best checkpoint.

    The model is CapsNet or the baseline CNN (`config.model`), the data any
    of `capsnet_tf.data.registry.DATASETS` but affNIST, which expanded-MNIST
    runs are evaluated on as well (`affnist_accuracy`).

    Args:
        config: an `ExperimentConfig`.
        workdir: directory for the configuration, checkpoints and logs. A
            rerun with the same directory resumes an interrupted run.
        overwrite: replace a run with a different model in `workdir`.
        start_time: `time.time()` at the command's start, where the run's
            clock (`wall_seconds`, the time to `config.target_accuracy`)
            starts; None: now.

    Returns:
        Dict of the final test metrics (`test_accuracy`, `test_error`,
        `test_loss`, `test_metrics`, ...), also written to
        `workdir/results.json`.

    Raises:
        ValueError: invalid configuration.
        IncompatibleWorkdirError: `workdir` holds a different model.
        capsnet_tf.data.DatasetNotFoundError: the data set is missing.
        capsnet_tf.callbacks.TrainingDivergedError: the loss became NaN or
            infinite; the message names the step. Checkpoints and backup
            hold the last good state.
        capsnet_tf.callbacks.CheckpointError: no backup can be restored
            (all truncated or corrupted); nothing was changed.
    """
    config.validate()
    start_time = time.time() if start_time is None else start_time
    # First: multi_worker and several CPU devices need TensorFlow not yet started.
    strategy = _make_strategy(config)
    # Workers other than the chief write their own copy elsewhere.
    workdir = worker_workdir(workdir, strategy)
    os.makedirs(workdir, exist_ok=True)
    _check_workdir(workdir, config, overwrite)
    keras.utils.set_random_seed(config.seed)
    _set_precision(config)
    train_data, validation_data, test_data, spec, extra_evaluations = _make_datasets(config)
    # Under multi_worker every worker reads the same batches and keeps its share.
    train_data, test_data = shard_by_data(train_data), shard_by_data(test_data)
    if validation_data is not None:
        validation_data = shard_by_data(validation_data)
    extra_evaluations = {name: shard_by_data(data) for name, data in extra_evaluations.items()}
    with open(os.path.join(workdir, "config.json"), "w") as file:
        file.write(config.to_json())

    with strategy.scope():
        model = build_model(config, spec.image_shape, spec.num_classes, spec.num_targets)
        steps_per_epoch = config.steps_per_epoch or math.ceil(
            (config.train_examples or spec.num_examples) / config.batch_size
        )
        model = compile_model(model, config, spec.num_targets, steps_per_epoch)
    prepare_model(model, strategy, train_data.element_spec)
    with open(os.path.join(workdir, "model.json"), "w") as file:
        json.dump(model.get_config(), file, indent=2)
    callbacks = _make_callbacks(config, workdir, spec, test_data, start_time)
    start = time.perf_counter()
    history = model.fit(
        train_data,
        epochs=config.epochs,
        steps_per_epoch=config.steps_per_epoch,
        # The official runs validate on the test set; with a validation split
        # the test set is evaluated beside it by `TestSetEvaluation`.
        validation_data=test_data if validation_data is None else validation_data,
        shuffle=False,  # the tf.data pipeline shuffles
        callbacks=callbacks,
        verbose=config.verbose,
    )
    train_seconds = time.perf_counter() - start

    best = os.path.join(workdir, "checkpoints", "best.weights.h5")
    if os.path.exists(best):
        load_weights(model, best)  # model weights only; a broken file is named
    metrics = model.evaluate(test_data, return_dict=True, verbose=config.verbose)
    accuracy = float(metrics[accuracy_key(config)])
    prefix = "test_" if config.validation_examples else "val_"
    csv_log = os.path.join(workdir, "training_log.csv")
    results = {
        "test_accuracy": accuracy,
        "checkpoint_chosen_on": "validation" if config.validation_examples else "test",
        "final_epoch_test_accuracy": last_logged(csv_log, prefix + accuracy_key(config)),
        "wall_seconds": last_logged(csv_log, "wall_seconds"),
        "test_error": 1.0 - accuracy,
        "test_loss": float(metrics["loss"]),
        "test_metrics": {name: float(value) for name, value in metrics.items()},
        "epochs_run_this_call": len(history.history.get("loss", [])),
        "train_seconds_this_call": train_seconds,
        "history": {
            name: [float(value) for value in values]
            for name, values in history.history.items()
        },
    }
    if config.validation_examples:
        results["validation_accuracy"] = _best_logged(csv_log, "val_" + accuracy_key(config))
    target_record = os.path.join(workdir, "time_to_target.json")
    if os.path.exists(target_record):
        with open(target_record) as file:
            results["time_to_target"] = json.load(file)
    for name, dataset in extra_evaluations.items():
        extra = model.evaluate(dataset, return_dict=True, verbose=config.verbose)
        results[f"{name}_accuracy"] = float(extra[accuracy_key(config)])
    with open(os.path.join(workdir, "results.json"), "w") as file:
        json.dump(results, file, indent=2, sort_keys=True)
    return results


def train_ensemble(config, workdir, overwrite=False):
    """Trains `config.num_trials` models and evaluates them as an ensemble.

    The official release's `--num_trials`: trial `i` is an ordinary run
    (`train_and_evaluate`) with seed `config.seed + i` in `workdir/trial_<i>`;
    the ensemble's class scores are the mean of the members' scores (CapsNet:
    capsule lengths; baseline: softmax probabilities), evaluated on the test
    set. Rerunning resumes unfinished trials and skips finished ones.

    Args:
        config: an `ExperimentConfig` with `num_trials >= 1`.
        workdir: parent directory of the trials' work directories.
        overwrite: passed to every trial.

    Returns:
        Dict with `test_accuracy` (the ensemble's), `member_accuracies`,
        `test_error`, and `trials` (each trial's results), also written to
        `workdir/results.json`.
    """
    from capsnet_tf.ensemble import evaluate_ensemble

    config.validate()
    os.makedirs(workdir, exist_ok=True)
    _check_workdir(workdir, config, overwrite)
    with open(os.path.join(workdir, "config.json"), "w") as file:
        file.write(config.to_json())
    trials = []
    for trial in range(config.num_trials):
        trial_config = dataclasses.replace(config, seed=config.seed + trial, num_trials=1)
        trial_dir = os.path.join(workdir, f"trial_{trial}")
        trials.append(train_and_evaluate(trial_config, trial_dir, overwrite=overwrite))
    models = [
        load_trained_model(os.path.join(workdir, f"trial_{trial}"))[0]
        for trial in range(config.num_trials)
    ]
    test_data, spec = _load_split(config, "test", reconstruction=False)
    ensemble = evaluate_ensemble(models, test_data, reduction="mean", num_targets=spec.num_targets)
    results = {
        "test_accuracy": float(ensemble["ensemble_accuracy"]),
        "test_error": 1.0 - float(ensemble["ensemble_accuracy"]),
        "member_accuracies": [float(value) for value in ensemble["member_accuracies"]],
        "num_trials": config.num_trials,
        "trials": trials,
    }
    with open(os.path.join(workdir, "results.json"), "w") as file:
        json.dump(results, file, indent=2, sort_keys=True)
    return results
