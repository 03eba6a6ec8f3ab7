"""Training and evaluation of CapsNet with `model.fit`, free of flags.

`train_and_evaluate(config, workdir)` is what `experiments/mnist.py` calls; it
can be called from a notebook the same way. The work directory holds:

- `config.json`: the resolved `ExperimentConfig`;
- `model.json`: the `CapsNet` configuration (`CapsNet.from_config`);
- `checkpoints/latest.weights.h5` (every epoch) and
  `checkpoints/best.weights.h5` (best test accuracy so far);
- `backup/`: Keras `BackupAndRestore` state (weights, optimizer, epoch) so
  that rerunning the same command after an interruption resumes;
- `logs/`: TensorBoard, with the reconstructions of 16 test images drawn
  every epoch (`logs/reconstructions`); `training_log.csv`: one row per epoch;
- `results.json`: the final evaluation of the best checkpoint.
"""

import csv
import dataclasses
import json
import os
import time

import keras

from capsnet_tf.data.pipeline import make_dataset
from capsnet_tf.data.spec import DatasetSpec
from capsnet_tf.losses import MarginLoss, ReconstructionLoss
from capsnet_tf.models.capsnet import CapsNet
from capsnet_tf.schedules import FlooredExponentialDecay

__all__ = [
    "ExperimentConfig",
    "IncompatibleWorkdirError",
    "build_model",
    "compile_model",
    "load_trained_model",
    "read_run_files",
    "train_and_evaluate",
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
        decay_steps, decay_rate, minimum_learning_rate: the continuous
            exponential decay of the learning rate (`FlooredExponentialDecay`).
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
        for name in ("steps_per_epoch", "eval_examples", "train_examples", "backup_every_steps"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"`{name}` must be None or >= 1. Received: {name}={value!r}")
        if not self.learning_rate > 0:
            raise ValueError(f"`learning_rate` must be > 0. Received: {self.learning_rate}")
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
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"`{name}` must be one of {', '.join(allowed)}. "
                    f"Received: {name}={getattr(self, name)!r}"
                )
        return self

    def to_json(self):
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)


def build_model(config, image_shape, num_classes):
    """The CapsNet of `config` for images of `image_shape`."""
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
    )


def compile_model(model, config):
    """Compiles with Adam, the floored decay, the margin and reconstruction losses."""
    schedule = FlooredExponentialDecay(
        config.learning_rate,
        config.decay_steps,
        config.decay_rate,
        config.minimum_learning_rate,
    )
    loss = {"length": MarginLoss(class_reduction=config.margin_class_reduction)}
    loss_weights = {"length": 1.0}
    if config.reconstruction:
        loss["reconstruction"] = ReconstructionLoss()
        loss_weights["reconstruction"] = config.reconstruction_weight
    # epsilon 1e-8: TensorFlow 1's AdamOptimizer default, used by the official release.
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=schedule, epsilon=1e-8),
        loss=loss,
        loss_weights=loss_weights,
        metrics={"length": [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]},
        jit_compile=config.jit_compile,
    )
    return model


def _check_workdir(workdir, config, overwrite):
    """Refuses a work directory whose saved run has a different model."""
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path) or overwrite:
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


class _EpochTimer(keras.callbacks.Callback):
    """Adds `train_seconds` and `train_images_per_second` to the epoch logs.

    Training time only: the evaluation on the test set at the end of the
    epoch is not counted. The first epoch includes tracing and compilation.
    """

    def __init__(self, batch_size, examples_per_epoch):
        super().__init__()
        self.batch_size = batch_size
        self.examples_per_epoch = examples_per_epoch

    def on_epoch_begin(self, epoch, logs=None):
        self._start = self._end = time.perf_counter()
        self._batches = 0

    def on_train_batch_end(self, batch, logs=None):
        self._batches = batch + 1
        self._end = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or self._batches == 0:
            return
        seconds = self._end - self._start
        images = min(self._batches * self.batch_size, self.examples_per_epoch)
        logs["train_seconds"] = seconds
        logs["train_images_per_second"] = images / seconds


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
        `(model, config)`: the training `CapsNet` with the weights loaded (call
        `model.inference_model()` for the image-only model) and the
        `ExperimentConfig` of the run.

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
    model = CapsNet.from_config(model_config)
    try:
        model.load_weights(weights_path)
    except Exception as error:
        raise ValueError(
            f"Cannot load the checkpoint {weights_path}: {error}. The file may be "
            "truncated or from a different model; try checkpoint='latest' or retrain."
        ) from None
    return model, config


def _set_precision(config):
    policy = {"float32": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}
    keras.config.set_dtype_policy(policy[config.mixed_precision])


def _make_strategy(config):
    """The `tf.distribute` strategy of `config.strategy`."""
    # Distribution region (issue 6).
    import tensorflow as tf

    return tf.distribute.get_strategy()


def _make_datasets(config):
    """`(train_data, test_data, spec, extra_evaluations)` of `config.dataset`.

    `extra_evaluations` maps a name to a further test set evaluated after
    training (e.g. affNIST for runs on expanded MNIST).
    """
    # Data region (issue 4).
    train_data, info = make_dataset(
        config.dataset,
        "train",
        config.batch_size,
        training=True,
        shift=config.shift,
        seed=config.seed,
        data_dir=config.data_dir,
        reconstruction=config.reconstruction,
        take=config.train_examples,
    )
    test_data, _ = make_dataset(
        config.dataset,
        "test",
        config.batch_size,
        training=False,
        data_dir=config.data_dir,
        reconstruction=config.reconstruction,
        take=config.eval_examples,
    )
    spec = DatasetSpec(
        name=config.dataset,
        image_shape=tuple(info.features["image"].shape),
        num_classes=info.features["label"].num_classes,
        num_examples=info.splits["train"].num_examples,
    )
    return train_data, test_data, spec, {}


def _make_callbacks(config, workdir, spec):
    """Checkpointing, logging and safety callbacks of a training run."""
    # Recovery region (issue 6).
    checkpoints = os.path.join(workdir, "checkpoints")
    os.makedirs(checkpoints, exist_ok=True)
    train_examples = config.train_examples or spec.num_examples
    csv_log = os.path.join(workdir, "training_log.csv")
    callbacks = [
        # Kept after the last epoch, so that rerunning a finished run neither
        # trains again nor replaces its best checkpoint.
        # double_checkpoint: a backup broken by a kill while saving falls
        # back to the one before it.
        keras.callbacks.BackupAndRestore(
            os.path.join(workdir, "backup"), delete_checkpoint=False, double_checkpoint=True
        ),
        keras.callbacks.ModelCheckpoint(
            os.path.join(checkpoints, "latest.weights.h5"), save_weights_only=True
        ),
        keras.callbacks.ModelCheckpoint(
            os.path.join(checkpoints, "best.weights.h5"),
            save_weights_only=True,
            save_best_only=True,
            monitor="val_length_accuracy",
            mode="max",
            # A resumed run keeps the best of the epochs before the interruption.
            initial_value_threshold=_best_logged(csv_log, "val_length_accuracy"),
        ),
        _EpochTimer(config.batch_size, train_examples),
        keras.callbacks.CSVLogger(csv_log, append=True),
        keras.callbacks.TensorBoard(os.path.join(workdir, "logs"), update_freq="epoch"),
        keras.callbacks.TerminateOnNaN(),
    ]
    if config.reconstruction:
        from capsnet_tf.visualization import ReconstructionImages, load_test_images

        sample_images, sample_labels = load_test_images(config.dataset, 16, config.data_dir)
        callbacks.append(
            ReconstructionImages(
                sample_images,
                sample_labels,
                os.path.join(workdir, "logs", "reconstructions"),
                max_images=16,
            )
        )
    return callbacks


def train_and_evaluate(config, workdir, overwrite=False):
    """Trains CapsNet as `config` says and evaluates the best checkpoint.

    Args:
        config: an `ExperimentConfig`.
        workdir: directory for the configuration, checkpoints and logs. A
            rerun with the same directory resumes an interrupted run.
        overwrite: replace a run with a different model in `workdir`.

    Returns:
        Dict of the final test metrics (`test_accuracy`, `test_error`,
        `test_loss`, ...), also written to `workdir/results.json`.

    Raises:
        ValueError: invalid configuration.
        IncompatibleWorkdirError: `workdir` holds a different model.
        capsnet_tf.data.DatasetNotFoundError: the data set is missing.
    """
    config.validate()
    os.makedirs(workdir, exist_ok=True)
    _check_workdir(workdir, config, overwrite)
    keras.utils.set_random_seed(config.seed)
    _set_precision(config)
    strategy = _make_strategy(config)
    train_data, test_data, spec, extra_evaluations = _make_datasets(config)
    with open(os.path.join(workdir, "config.json"), "w") as file:
        file.write(config.to_json())

    with strategy.scope():
        model = compile_model(build_model(config, spec.image_shape, spec.num_classes), config)
    with open(os.path.join(workdir, "model.json"), "w") as file:
        json.dump(model.get_config(), file, indent=2)
    callbacks = _make_callbacks(config, workdir, spec)
    start = time.perf_counter()
    history = model.fit(
        train_data,
        epochs=config.epochs,
        steps_per_epoch=config.steps_per_epoch,
        validation_data=test_data,
        shuffle=False,  # the tf.data pipeline shuffles
        callbacks=callbacks,
        verbose=config.verbose,
    )
    train_seconds = time.perf_counter() - start

    best = os.path.join(workdir, "checkpoints", "best.weights.h5")
    if os.path.exists(best):
        model.load_weights(best)
    metrics = model.evaluate(test_data, return_dict=True, verbose=config.verbose)
    accuracy = float(metrics["length_accuracy"])
    results = {
        "test_accuracy": accuracy,
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
    for name, dataset in extra_evaluations.items():
        extra = model.evaluate(dataset, return_dict=True, verbose=config.verbose)
        results[f"{name}_accuracy"] = float(extra["length_accuracy"])
    with open(os.path.join(workdir, "results.json"), "w") as file:
        json.dump(results, file, indent=2, sort_keys=True)
    return results
