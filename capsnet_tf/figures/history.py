"""A run's history for its curves: the CSV log and the learning rate of each epoch."""

import csv
import math
import os

import numpy as np

from capsnet_tf.schedules import make_schedule

__all__ = [
    "labelled_path",
    "learning_rates",
    "read_training_log",
]


def labelled_path(text, flag):
    """`(label, path)` of a figure script's `--FLAG=LABEL=PATH` (the label may hold `=`).

    Raises:
        ValueError: not `LABEL=PATH`, or the path is not a file; the message
            names the flag and what it received.
    """
    label, separator, path = text.rpartition("=")
    if not separator or not label or not path:
        raise ValueError(f"--{flag} takes LABEL=PATH. Received: --{flag}={text!r}")
    if not os.path.isfile(path):
        raise ValueError(f"--{flag}={text!r}: {path!r} is not a file.")
    return label, path


def read_training_log(path):
    """The CSV log of a run as `{column: float64 array}`, rows in file order.

    Args:
        path: `training_log.csv` written by Keras' `CSVLogger`.

    Returns:
        Dict of numpy arrays, one per column; empty when the file has no rows.
    """
    with open(path, newline="") as file:
        rows = list(csv.DictReader(file))
    if not rows:
        return {}
    return {
        name: np.array([float(row[name]) if row.get(name) else np.nan for row in rows])
        for name in rows[0]
    }


def learning_rates(config, epochs, train_examples):
    """The learning rate at the end of each epoch, from the run's schedule.

    The rate is not logged; it follows from the run's schedule at
    step `(epoch + 1) * steps_per_epoch`, with `steps_per_epoch` from the
    config or `ceil(train_examples / batch_size)`.

    Args:
        config: the run's `ExperimentConfig` (or a dict of `config.json`).
        epochs: epoch indices (0-based, as in the CSV log).
        train_examples: training examples of the data set (used when the
            config sets neither `steps_per_epoch` nor `train_examples`).

    Returns:
        float64 `[len(epochs)]`.

    Example:

    >>> config = {"learning_rate": 1e-3, "decay_steps": 2000, "decay_rate": 0.96,
    ...           "minimum_learning_rate": 1e-6, "batch_size": 128,
    ...           "steps_per_epoch": None, "train_examples": None}
    >>> learning_rates(config, [0, 1], 60000).round(8).tolist()  # steps 469, 938
    [0.00099047, 0.00098104]
    """
    if not isinstance(config, dict):
        config = vars(config)
    steps = config.get("steps_per_epoch")
    if not steps:
        examples = config.get("train_examples") or train_examples
        examples = min(examples, train_examples) if train_examples else examples
        steps = math.ceil(examples / config["batch_size"])
    schedule = make_schedule(config, steps)
    return np.array([float(schedule((int(epoch) + 1) * steps)) for epoch in epochs])
