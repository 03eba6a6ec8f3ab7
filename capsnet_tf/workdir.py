"""A run's work directory: what it holds, reading it back, and refusing another model's.

`train_and_evaluate` (`capsnet_tf.training`) writes the directory; figures,
export and prediction read it through `read_run_files` and
`load_trained_model`. The directory holds:

- `config.json`: the resolved `ExperimentConfig`;
- `model.json`: the `CapsNet` configuration (`CapsNet.from_config`);
- `labels.txt`: the class names, one a line in label order, when the data
  set has them (an image folder's sub-folder names, TFDS label names), read
  back by `read_class_names` for the export's `labels.txt` and the figures;
- `checkpoints/latest.weights.h5` (every epoch) and
  `checkpoints/best.weights.h5` (best validation accuracy so far; the test
  set is the validation data of the official runs): model weights only,
  each written atomically (`capsnet_tf.checkpoints`);
- `backup/`: the training state (weights, optimizer, epoch and step), saved
  every epoch and every `backup_every_steps` steps, with the one before it, so
  that rerunning the same command after an interruption (even SIGKILL)
  resumes where it stopped and runs the same number of steps in all;
- `logs/`: TensorBoard, with the reconstructions of 16 test images drawn
  every epoch (`logs/reconstructions`); `training_log.csv`: one row per epoch;
- `time_to_target.json`: when the run first reached `target_accuracy`;
- `results.json`: the final evaluation of the best checkpoint.
"""

import csv
import dataclasses
import json
import os

from capsnet_tf.checkpoints import load_weights
from capsnet_tf.config import MODEL_FIELDS, ExperimentConfig
from capsnet_tf.models.capsnet import CapsNet

__all__ = [
    "IncompatibleWorkdirError",
    "best_logged",
    "last_logged",
    "logged_values",
    "check_workdir",
    "load_trained_model",
    "read_class_names",
    "read_run_files",
    "write_class_names",
]

LABELS_FILE = "labels.txt"


class IncompatibleWorkdirError(ValueError):
    """The work directory holds a run whose model differs from the requested one."""


# What a run writes into its work directory; `--overwrite` removes these only.
_RUN_FILES = (
    "config.json",
    "model.json",
    "labels.txt",
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



def check_workdir(workdir, config, overwrite):
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
    # As saved (tuples become lists); a field newer than the saved run has its default.
    current = json.loads(config.to_json())
    defaults = json.loads(ExperimentConfig().to_json())
    differences = [
        f"{name}: saved {saved.get(name, defaults[name])!r}, requested {current[name]!r}"
        for name in MODEL_FIELDS
        if saved.get(name, defaults[name]) != current[name]
    ]
    if differences:
        raise IncompatibleWorkdirError(
            f"The work directory {workdir!r} holds a run with a different model ("
            + "; ".join(differences)
            + "). Use another --workdir, or pass --overwrite to replace it."
        )



def logged_values(csv_path, column):
    """The values of `column` in a run's CSV log, rows in order (missing cells left out)."""
    if not os.path.exists(csv_path):
        return []
    with open(csv_path, newline="") as file:
        return [float(row[column]) for row in csv.DictReader(file) if row.get(column)]


def best_logged(csv_path, metric):
    """The best value of `metric` in an earlier run's CSV log, or None."""
    values = logged_values(csv_path, metric)
    return max(values) if values else None


def last_logged(csv_path, column):
    """The value of `column` in the last row of a CSV log that has one, or None."""
    values = logged_values(csv_path, column)
    return values[-1] if values else None



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
    if config.model != "capsnet":
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


def write_class_names(workdir, class_names):
    """Writes `labels.txt`: one class name a line, in label order.

    Raises:
        ValueError: a name holds a newline (it could not be read back).
    """
    names = [str(name) for name in class_names]
    if any("\n" in name or "\r" in name for name in names):
        raise ValueError(f"Class names must not hold newlines. Received: {names!r}")
    path = os.path.join(workdir, LABELS_FILE)
    with open(path + ".tmp", "w") as file:
        file.write("\n".join(names) + "\n")
    os.replace(path + ".tmp", path)


def read_class_names(workdir, num_classes=None):
    """The class names of a run (`labels.txt`), or None without that file.

    With `num_classes`, a file holding another number of names counts as absent.
    """
    path = os.path.join(workdir, LABELS_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as file:
        names = file.read().splitlines()
    if num_classes is not None and len(names) != num_classes:
        return None
    return names
