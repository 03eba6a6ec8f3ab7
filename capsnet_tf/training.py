"""Training and evaluation of CapsNet with `model.fit`, free of flags.

`train_and_evaluate(config, workdir)` is what `experiments/mnist.py` calls; it
can be called from a notebook the same way. It builds the model of an
`ExperimentConfig` (`capsnet_tf.config`), its data pipelines and callbacks,
trains, evaluates the best checkpoint and writes the work directory that
`capsnet_tf.workdir` describes and reads back. `train_ensemble` trains several
seeds and evaluates their ensemble (the official `--num_trials`).
"""

import dataclasses
import json
import math
import os
import time
import warnings

import keras

from capsnet_tf import cpu
from capsnet_tf.callbacks import (
    AveragedWeights,
    DivergenceGuard,
    EpochTimer,
    GracefulStop,
    ReconstructionImages,
    TargetAccuracy,
    TestSetEvaluation,
    TrainingStateBackup,
    WallClock,
    WeightsCheckpoint,
    load_weights,
)
from capsnet_tf.config import PRECISION_POLICIES, capsnet_options
from capsnet_tf.data.pipeline import resumable_training_data
from capsnet_tf.data.registry import load_experiment_data
from capsnet_tf.distribute import (
    is_multi_worker,
    make_strategy,
    prepare_model,
    shard_by_data,
    worker_workdir,
)
from capsnet_tf.losses import MarginLoss, ReconstructionLoss
from capsnet_tf.memory import check_run_memory
from capsnet_tf.models.baseline import build_cnn, is_cnn
from capsnet_tf.models.capsnet import CapsNet
from capsnet_tf.optimizers import FusedAdam
from capsnet_tf.runlock import lock_workdir
from capsnet_tf.schedules import make_schedule
from capsnet_tf.workdir import (
    best_logged,
    check_workdir,
    last_logged,
    load_trained_model,
    write_class_names,
)

__all__ = [
    "build_model",
    "compile_model",
    "accuracy_key",
    "score_output",
    "train_and_evaluate",
    "train_ensemble",
]


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
    if is_cnn(config.model):
        return build_cnn(config.model, image_shape, num_classes)
    options = {"num_targets": num_targets} if num_targets != 1 else {}
    return CapsNet(
        image_shape=image_shape,
        num_classes=num_classes,
        name="capsnet",
        **capsnet_options(config),
        **options,
    )


def score_output(model_kind):
    """The output holding class scores: `"length"` (CapsNet) or `"logits"`."""
    return "logits" if is_cnn(model_kind) else "length"


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
    schedule = make_schedule(config, steps_per_epoch)
    if is_cnn(config.model):
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
    # FusedAdam: Keras's Adam in one TensorFlow kernel per variable (same values).
    model.compile(
        optimizer=FusedAdam(
            learning_rate=schedule,
            epsilon=1e-8,
            use_ema=config.ema_momentum > 0,
            ema_momentum=config.ema_momentum or 0.99,  # Keras checks it even when unused
        ),
        loss=loss,
        loss_weights=loss_weights,
        metrics=metrics,
        jit_compile=config.jit_compile,
    )
    return model


def resolve_precision(config):
    """`(precision, reason)`: what `config.mixed_precision` trains in here, and why.

    `"auto"` resolves by the hardware that trains (`cpu.choose_precision`):
    the TPUs of `--strategy=tpu`, else the GPUs TensorFlow sees (none where
    `--devices` names CPUs only), else the CPU. Any other value is kept as
    asked. Lists physical devices only, so TensorFlow's runtime is not yet
    started (`--strategy=multi_worker` and CPU logical devices need that).
    """
    if config.mixed_precision != "auto":
        return config.mixed_precision, f"--mixed_precision={config.mixed_precision}"
    tpu = config.strategy == "tpu"
    gpus = () if tpu else _gpu_compute_capabilities(config.devices)
    precision, reason = cpu.choose_precision(gpu_compute_capabilities=gpus, tpu=tpu)
    return precision, f"--mixed_precision=auto; {reason}"


def _gpu_compute_capabilities(devices):
    """`(major, minor)` (None where unknown) of each GPU a run on `devices` may use."""
    if devices and all("cpu" in device.lower() for device in devices):
        return ()
    import tensorflow as tf

    return [
        tf.config.experimental.get_device_details(gpu).get("compute_capability")
        for gpu in tf.config.list_physical_devices("GPU")
    ]


def _set_precision(config):
    """Sets Keras's global dtype policy; warns where bfloat16 cannot be faster.

    `--mixed_precision=auto` resolves first (`resolve_precision`). On a CPU
    with no bfloat16 arithmetic (no AMX, no AVX-512 BF16: AVX2 machines such
    as AMD EPYC Zen 1-3) oneDNN multiplies bfloat16 in float32 after
    converting it, and mixed bfloat16 trains slower than float32: asking for
    it there warns.

    Returns:
        `resolve_precision(config)`'s `(precision, reason)`.
    """
    precision, reason = resolve_precision(config)
    keras.config.set_dtype_policy(PRECISION_POLICIES[precision])
    if (config.mixed_precision == "bfloat16" and not cpu.accelerated()
            and cpu.bfloat16_unit() is None):
        warnings.warn(
            "mixed_precision='bfloat16' on a CPU without bfloat16 arithmetic (no "
            f"amx_bf16 or avx512_bf16; it reports {cpu.instruction_sets()}): oneDNN "
            "computes bfloat16 in float32 here, so this run will train slower than "
            "with --mixed_precision=float32 or auto (docs/performance.md).",
            stacklevel=2,
        )
    return precision, reason


def _config_record(config, precision, reason):
    """`config.json`'s text: the options as given, plus the precision they resolved to.

    `mixed_precision` stays what was asked (e.g. "auto");
    `mixed_precision_resolved` and `mixed_precision_reason` say what the run
    trained in and why. They are not `ExperimentConfig` fields: readers
    that build a config from the file keep the fields they know
    (`load_trained_model`), and files written before them still load.
    """
    record = json.loads(config.to_json())
    record["mixed_precision_resolved"] = precision
    record["mixed_precision_reason"] = reason
    return json.dumps(record, indent=2, sort_keys=True)


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
    if is_cnn(config.model):
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
        shift_mode=config.shift_mode,
        data_dir=config.data_dir,
        reconstruction=reconstruction,
        take=take,
        test_pairs_per_image=config.test_pairs_per_image,
        affnist_path=config.affnist_path,
        **image_source(config),
    )


def _training_stream(config, train_data, resume_step):
    """`fit`'s endless training stream from batch `resume_step` on.

    The last `config.unshifted_final_epochs` epochs read the same training
    images unshifted (see `resumable_training_data`).
    """
    unshifted = None
    if config.unshifted_final_epochs and config.shift:
        unshifted, _ = _load_split(dataclasses.replace(config, shift=0), "train")
        if is_cnn(config.model):  # the same targets as the shifted epochs'
            unshifted = _baseline_targets(unshifted)
        unshifted = shard_by_data(unshifted)
    return resumable_training_data(
        train_data,
        resume_step,
        final=unshifted,
        epochs_before_final=config.epochs - config.unshifted_final_epochs,
    )


def image_source(config):
    """The `load_experiment_data` arguments of a run on a folder or another TFDS set."""
    return {
        "image_folder": config.image_folder,
        "image_size": config.image_size,
        "test_fraction": config.test_fraction,
        "horizontal_flip": config.horizontal_flip,
    }


def _baseline_targets(dataset):
    """Renames the `length` target to the baseline CNN's `logits` output."""
    return dataset.map(lambda inputs, targets: ({"image": inputs["image"]},
                                                {"logits": targets["length"]}))


def _make_callbacks(config, workdir, spec, test_data, start_time, multi_worker=False,
                    validation_data=None):
    """Checkpointing, logging, progress and safety callbacks of a training run.

    `test_data` is evaluated every epoch beside a validation split
    (`config.validation_examples`); `start_time` starts the run's clock.
    Under a multi-worker strategy (`multi_worker`) a signal stops training
    without a new backup (see `GracefulStop`). With `config.ema_momentum`
    the validation, the test set, the checkpoints and the reconstruction
    images see the averaged weights (`AveragedWeights`), and
    `validation_data` is evaluated with the trained weights too
    (`val_trained_*`), so that a log shows what the averaging changed.
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
    averaged = AveragedWeights()
    callbacks = [
        # First: a NaN loss stops training before any callback saves that step.
        _divergence_guard(backup),
        *_progress_callbacks(config, workdir, test_data, validation_data, averaged, clock,
                             monitor),
        *_weights_checkpoints(checkpoints, monitor, csv_log),
        EpochTimer(config.batch_size, train_examples),
        keras.callbacks.CSVLogger(csv_log, append=True),
        keras.callbacks.TensorBoard(os.path.join(workdir, "logs"), update_freq="epoch"),
    ]
    if config.reconstruction and config.model == "capsnet":
        callbacks.append(_reconstruction_images(config, workdir))
    # The trained weights back in the model before the backup (see `AveragedWeights`).
    callbacks.append(averaged.restore)
    callbacks.append(backup)
    # After the backup: at an epoch end it stops once that epoch is saved.
    callbacks.append(GracefulStop(backup, save=not multi_worker))
    return callbacks


def _divergence_guard(backup):
    """The `DivergenceGuard` whose advice is this command's: a rerun resumes from `backup`."""
    return DivergenceGuard(
        backup=backup,
        advice=(
            "Lower --learning_rate (or check the input data) and run again with "
            "the same --workdir: training continues from the last backup."
        ),
    )


def _progress_callbacks(config, workdir, test_data, validation_data, averaged, clock, monitor):
    """The epoch-end evaluations and clock, in the order their logs depend on.

    In order: the validation split with the trained weights (`val_trained_*`,
    with `config.ema_momentum`), the averaged weights swapped in, the test
    set beside a validation split, the clock (after the evaluations it
    times), and the time to `config.target_accuracy`, which reads the clock.
    """
    progress = [averaged, clock]
    if config.ema_momentum and validation_data is not None:
        progress.insert(0, TestSetEvaluation(validation_data, prefix="val_trained_"))
    if config.validation_examples:
        progress.insert(-1, TestSetEvaluation(test_data))  # before the clock reads the time
    if config.target_accuracy is not None:
        # The held-out data the best checkpoint is chosen on: the test set,
        # or the validation split where there is one, since stopping early
        # is a model choice and the test set makes none.
        record = os.path.join(workdir, "time_to_target.json")
        progress.append(TargetAccuracy(monitor, config.target_accuracy, clock, record))
    return progress


def _weights_checkpoints(checkpoints, monitor, csv_log):
    """The latest and the best (by `monitor`) weights, so a run can be evaluated and resumed."""
    # Model weights only (no optimizer state), written atomically.
    return [
        WeightsCheckpoint(os.path.join(checkpoints, "latest.weights.h5")),
        WeightsCheckpoint(
            os.path.join(checkpoints, "best.weights.h5"),
            monitor=monitor,
            mode="max",
            # A resumed run keeps the best of the epochs before the interruption.
            initial_value_threshold=best_logged(csv_log, monitor),
        ),
    ]


def _reconstruction_images(config, workdir):
    """`ReconstructionImages` of 16 test images, so TensorBoard shows what the decoder learns."""
    from capsnet_tf.data.samples import load_test_images

    sample_images, sample_labels = load_test_images(
        config.dataset,
        16,
        config.data_dir,
        seed=config.seed,
        test_pairs_per_image=config.test_pairs_per_image,
        shift=config.shift,
        **image_source(config),
    )
    return ReconstructionImages(
        sample_images,
        sample_labels,
        os.path.join(workdir, "logs", "reconstructions"),
        max_images=16,
    )


def train_and_evaluate(config, workdir, overwrite=False, start_time=None):
    """Trains the model of `config` on its data set and evaluates the best checkpoint.

    The model is CapsNet or the baseline CNN (`config.model`), the data any
    of `capsnet_tf.data.registry.DATASETS` but affNIST, which expanded-MNIST
    runs are evaluated on as well (`affnist_accuracy`), a folder of images
    (`config.image_folder`) or another TFDS image data set. Before the model
    is built the peak memory of a training step is estimated and logged
    (`capsnet_tf.memory`); the class names, when the data have them, are
    written to `workdir/labels.txt`.

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
        capsnet_tf.workdir.IncompatibleWorkdirError: `workdir` holds a different model.
        capsnet_tf.data.DatasetNotFoundError: the data set is missing.
        capsnet_tf.data.folder.ImageFolderError: the image folder cannot be
            trained on (missing, one class, an empty class, a file that is
            not an image, images of different sizes).
        capsnet_tf.memory.InsufficientMemoryError: a training step would
            need more memory than is available; nothing was written.
        capsnet_tf.callbacks.TrainingDivergedError: the loss became NaN or
            infinite; the message names the step. Checkpoints and backup
            hold the last good state.
        capsnet_tf.callbacks.CheckpointError: no backup can be restored
            (all truncated or corrupted); nothing was changed.
        capsnet_tf.callbacks.CheckpointWriteError: a checkpoint or backup
            could not be written (disk full); the file before it is intact.
        capsnet_tf.callbacks.TrainingInterrupted: SIGTERM or Ctrl-C during
            training; the state was backed up after the step in flight, and
            calling again continues with the very next batch.
        capsnet_tf.runlock.WorkdirBusyError: another process is training in
            `workdir`; nothing was changed.
    """
    config.validate()
    start_time = time.time() if start_time is None else start_time
    # First: multi_worker and several CPU devices need TensorFlow not yet started.
    strategy = _make_strategy(config)
    # Workers other than the chief write their own copy elsewhere.
    workdir = worker_workdir(workdir, strategy)
    # One training process per work directory, before anything in it changes.
    with lock_workdir(workdir):
        return _train_and_evaluate(config, workdir, overwrite, start_time, strategy)


def _train_and_evaluate(config, workdir, overwrite, start_time, strategy):
    """`train_and_evaluate` once the work directory is locked."""
    check_workdir(workdir, config, overwrite)
    keras.utils.set_random_seed(config.seed)
    precision, reason = _set_precision(config)
    train_data, validation_data, test_data, spec, extra_evaluations = _sharded_datasets(config)
    # Before anything is written or built: a step that cannot fit stops here.
    test_examples = int(test_data.cardinality()) * config.batch_size
    check_run_memory(config, spec, max(test_examples, 0))
    _write_run_description(workdir, config, precision, reason, spec)

    model, steps_per_epoch = _compiled_model(config, spec, train_data, strategy)
    prepare_model(model, strategy, train_data.element_spec)
    with open(os.path.join(workdir, "model.json"), "w") as file:
        json.dump(model.get_config(), file, indent=2)
    callbacks = _make_callbacks(
        config, workdir, spec, test_data, start_time, multi_worker=is_multi_worker(strategy),
        validation_data=validation_data,
    )
    # The official runs validate on the test set; with a validation split
    # the test set is evaluated beside it by `TestSetEvaluation`.
    history, train_seconds = _fit(
        model, config, callbacks, train_data,
        test_data if validation_data is None else validation_data, steps_per_epoch,
    )

    _load_best_checkpoint(model, workdir)
    results = _test_results(model, config, workdir, test_data, history, train_seconds)
    results.update(_extra_accuracies(model, config, extra_evaluations))
    with open(os.path.join(workdir, "results.json"), "w") as file:
        json.dump(results, file, indent=2, sort_keys=True)
    return results


def _sharded_datasets(config):
    """`_make_datasets(config)`, each data set sharded for a multi-worker strategy."""
    train_data, validation_data, test_data, spec, extra_evaluations = _make_datasets(config)
    # Under multi_worker every worker reads the same batches and keeps its share.
    train_data, test_data = shard_by_data(train_data), shard_by_data(test_data)
    if validation_data is not None:
        validation_data = shard_by_data(validation_data)
    extra_evaluations = {name: shard_by_data(data) for name, data in extra_evaluations.items()}
    return train_data, validation_data, test_data, spec, extra_evaluations


def _write_run_description(workdir, config, precision, reason, spec):
    """Writes `config.json` and, when the data have them, `labels.txt`: how to read the run."""
    with open(os.path.join(workdir, "config.json"), "w") as file:
        file.write(_config_record(config, precision, reason))
    if spec.class_names:
        write_class_names(workdir, spec.class_names)


def _compiled_model(config, spec, train_data, strategy):
    """`(model, steps_per_epoch)`: the compiled model, its variables under `strategy`."""
    with strategy.scope():
        model = build_model(config, spec.image_shape, spec.num_classes, spec.num_targets)
        batches = int(train_data.cardinality())
        steps_per_epoch = config.steps_per_epoch or (
            batches if batches > 0
            else math.ceil((config.train_examples or spec.num_examples) / config.batch_size)
        )
        model = compile_model(model, config, spec.num_targets, steps_per_epoch)
    return model, steps_per_epoch


def _fit(model, config, callbacks, train_data, validation_data, steps_per_epoch):
    """`(history, seconds)` of `model.fit`, resumed where the backup among `callbacks` left off."""
    backup = next(c for c in callbacks if isinstance(c, TrainingStateBackup))
    # The batches the interrupted run would have read next (see `resumable_training_data`).
    resume_step = backup.resume_point(model)
    backup.data_position = resume_step
    start = time.perf_counter()
    try:
        history = model.fit(
            _training_stream(config, train_data, resume_step),
            epochs=config.epochs,
            steps_per_epoch=steps_per_epoch,
            validation_data=validation_data,
            shuffle=False,  # the tf.data pipeline shuffles
            callbacks=callbacks,
            verbose=config.verbose,
        )
    finally:  # a notebook's Ctrl-C is its own again, however fit ended
        for callback in callbacks:
            if isinstance(callback, GracefulStop):
                callback.uninstall()
    return history, time.perf_counter() - start


def _load_best_checkpoint(model, workdir):
    """Loads the best epoch's weights, where one was saved, so that it is what is evaluated."""
    best = os.path.join(workdir, "checkpoints", "best.weights.h5")
    if os.path.exists(best):
        load_weights(model, best)  # model weights only; a broken file is named


def _test_results(model, config, workdir, test_data, history, train_seconds):
    """The test metrics of `model`, with what the training log and this call recorded."""
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
        results["validation_accuracy"] = best_logged(csv_log, "val_" + accuracy_key(config))
    target_record = os.path.join(workdir, "time_to_target.json")
    if os.path.exists(target_record):
        with open(target_record) as file:
            results["time_to_target"] = json.load(file)
    return results


def _extra_accuracies(model, config, extra_evaluations):
    """`{"<name>_accuracy": ...}` on each further test set (e.g. affNIST after expanded MNIST)."""
    accuracies = {}
    for name, dataset in extra_evaluations.items():
        extra = model.evaluate(dataset, return_dict=True, verbose=config.verbose)
        accuracies[f"{name}_accuracy"] = float(extra[accuracy_key(config)])
    return accuracies


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
    config.validate()
    with lock_workdir(workdir):  # each trial's directory is locked by its own run as well
        return _train_ensemble(config, workdir, overwrite)


def _train_ensemble(config, workdir, overwrite):
    """`train_ensemble` once the parent work directory is locked."""
    from capsnet_tf.ensemble import evaluate_ensemble

    check_workdir(workdir, config, overwrite)
    with open(os.path.join(workdir, "config.json"), "w") as file:
        file.write(_config_record(config, *resolve_precision(config)))
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
