"""The paper's evaluation protocols beyond MNIST, applied to a trained work directory.

Sabour et al. (2017) argue for capsules with two experiments beyond MNIST:

- section 5.2, affNIST: a model trained on expanded MNIST only (40x40,
  translated by up to 6 px) is scored on affNIST, every MNIST test digit
  under 32 random affine transformations (CapsNet 79%, a CNN of similar size
  66%, both at about 99.2% on expanded MNIST);
- section 6, MultiMNIST: a pair of overlapping digits is right only when its
  two classes are the two longest capsules (CapsNet 5.2% error).

`evaluate_affnist_protocol` and `evaluate_multimnist_protocol` score a work
directory written by `capsnet_tf.training.train_and_evaluate` on those sets
(generated from the MNIST test split, seeded) and return the numbers with the
number of examples each was computed on, the model and its parameter count,
and the training budget read from the run's own files (`training_budget`).
`experiments/paper_eval.py` is the script around them.
"""

import csv
import json
import os

import keras
import numpy as np
import tensorflow as tf

from capsnet_tf.models.baseline import is_cnn

__all__ = [
    "PAPER_NUMBERS",
    "AFFNIST_CURVE_EDGES",
    "affnist_breakdown",
    "affnist_by_transformation",
    "class_scores",
    "evaluate_affnist_protocol",
    "evaluate_multimnist_protocol",
    "multimnist_scores",
    "single_label_accuracy",
    "training_budget",
]

# The paper's numbers the protocols reproduce (arXiv:1710.09829, sections 5.2 and 6).
PAPER_NUMBERS = {
    "affnist": {
        "capsnet_affnist_accuracy": 0.79,
        "cnn_affnist_accuracy": 0.66,
        "capsnet_expanded_mnist_accuracy": 0.9923,
        "cnn_expanded_mnist_accuracy": 0.9922,
    },
    "multi_mnist": {"capsnet_error": 0.052, "cnn_error": 0.081},
}


def _score_function(model, model_kind):
    """A compiled function from images to class scores (capsule lengths or logits)."""
    inference = model.inference_model()
    key = "logits" if is_cnn(model_kind) else "length"
    return tf.function(lambda images: inference(images, training=False)[key])


def class_scores(model, model_kind, dataset, examples=None, progress=True):
    """Class scores and labels of every example of `dataset`, as NumPy arrays.

    Args:
        model: a trained `CapsNet` or `BaselineCNN` (as `load_trained_model`
            returns it).
        model_kind: the run's `config.model` (`"capsnet"` or a CNN's name).
        dataset: batches of `(inputs, targets)` whose inputs hold `"image"`
            and whose targets hold the labels under `"length"` (the format of
            `capsnet_tf.data`'s pipelines with `reconstruction=False`).
        examples: the number of examples, for the progress bar.
        progress: show a Keras progress bar.

    Returns:
        `(scores, labels)`: float32 `[N, classes]` and int32 `[N]` or `[N, k]`.
    """
    scores_of = _score_function(model, model_kind)
    bar = keras.utils.Progbar(examples, unit_name="image") if progress else None
    scores, labels = [], []
    for inputs, targets in dataset:
        scores.append(scores_of(inputs["image"]).numpy().astype(np.float32))
        labels.append(np.asarray(targets["length"], np.int32))
        if bar is not None:
            bar.add(len(labels[-1]))
    return np.concatenate(scores), np.concatenate(labels)


def single_label_accuracy(scores, labels):
    """Top-1 accuracy: the fraction of rows whose highest score is its label."""
    scores, labels = np.asarray(scores), np.asarray(labels)
    if scores.ndim != 2 or labels.shape != scores.shape[:1]:
        raise ValueError(
            "`scores` must be [N, classes] and `labels` [N]. Received shapes "
            f"{scores.shape} and {labels.shape}"
        )
    return float(np.mean(np.argmax(scores, axis=1) == labels))


def multimnist_scores(scores, labels):
    """The paper's MultiMNIST metric and the looser ones other reproductions report.

    A label counts as found when it is among the two longest capsules: at
    most one other class is as long as it or longer. A tie counts against
    the label, so a pair is never right by the order ties happen to be
    broken in. A pair is right (the paper's metric) when both its labels are
    found, i.e. its two classes are exactly the two longest capsules.

    Args:
        scores: capsule lengths `[N, classes]`.
        labels: the two classes of each pair, `[N, 2]`.

    Returns:
        A dict: `pair_accuracy` (the paper's accuracy; `pair_error` is one
        minus it), `any_accuracy` (at least one label found), `digit_error`
        (the fraction of the `2N` labels not found), `ties` (pairs where a
        label is exactly as long as another class) and `examples`.

    Example:

    >>> import numpy as np
    >>> lengths = np.array([[0.9, 0.8, 0.1, 0.0],   # both right
    ...                     [0.9, 0.1, 0.8, 0.0],   # one wrong
    ...                     [0.1, 0.2, 0.9, 0.8]])  # both wrong
    >>> result = multimnist_scores(lengths, np.array([[0, 1], [0, 1], [0, 1]]))
    >>> result["pair_accuracy"], result["any_accuracy"], result["digit_error"]
    (0.3333333333333333, 0.6666666666666666, 0.5)
    """
    scores, labels = np.asarray(scores), np.asarray(labels)
    if scores.ndim != 2 or labels.ndim != 2 or labels.shape != (scores.shape[0], 2):
        raise ValueError(
            "`scores` must be [N, classes] and `labels` [N, 2]. Received shapes "
            f"{scores.shape} and {labels.shape}"
        )
    if np.any(labels[:, 0] == labels[:, 1]):
        raise ValueError("Each pair's two labels must differ (MultiMNIST pairs two classes).")
    own = np.take_along_axis(scores, labels, axis=1)  # [N, 2]
    # Other classes at least as long as each label (the label itself excluded).
    as_long = np.sum(scores[:, None, :] >= own[:, :, None], axis=2) - 1  # [N, 2]
    longer = np.sum(scores[:, None, :] > own[:, :, None], axis=2)
    found = as_long <= 1
    pair_right = np.all(found, axis=1)
    return {
        "pair_accuracy": float(np.mean(pair_right)),
        "pair_error": float(1.0 - np.mean(pair_right)),
        "any_accuracy": float(np.mean(np.any(found, axis=1))),
        "digit_error": float(1.0 - np.mean(found)),
        "ties": int(np.sum(np.any(as_long > longer, axis=1))),
        "examples": int(len(scores)),
    }


def training_budget(workdir, data_dir=None):
    """What the run spent, from its own files: images, wall time, the stop.

    `data_dir` (TFDS) gives the training split's size for runs that set no
    `steps_per_epoch`.

    Returns:
        A dict with `epochs` (logged epochs), `training_images` (steps times
        batch size, from the last logged epoch's step count when known),
        `wall_seconds` (the run clock at the last logged epoch),
        `train_images_per_second` (median over epochs) and, when the run had
        a target accuracy, `time_to_target` (its `time_to_target.json`).
    """
    with open(os.path.join(workdir, "config.json")) as file:
        config = json.load(file)
    rows = []
    log_path = os.path.join(workdir, "training_log.csv")
    if os.path.exists(log_path):
        with open(log_path, newline="") as file:
            rows = list(csv.DictReader(file))
    budget = {"epochs": len(rows)}
    if rows:
        from capsnet_tf.data.samples import run_train_examples

        steps = config.get("steps_per_epoch")
        per_epoch = (
            steps * config["batch_size"] if steps else run_train_examples(config, data_dir)
        )
        budget["training_images"] = int(per_epoch * len(rows))
        budget["wall_seconds"] = float(rows[-1]["wall_seconds"])
        rates = [float(row["train_images_per_second"]) for row in rows]
        budget["train_images_per_second"] = float(np.median(rates))
    target_path = os.path.join(workdir, "time_to_target.json")
    if os.path.exists(target_path):
        with open(target_path) as file:
            budget["time_to_target"] = json.load(file)
    return budget


# How large each transformation of an affNIST-style image is, from its parameters.
_TRANSFORMATION_SIZES = {
    "shift": lambda p: np.maximum(np.abs(p["translate_y"]), np.abs(p["translate_x"])),
    "rotation": lambda p: np.abs(p["rotation"]),
    "shear": lambda p: np.abs(p["shear"]),
    "scale": lambda p: (np.asarray(p["scale_y"]) + np.asarray(p["scale_x"])) / 2,
}


def _transformation_sizes(correct, parameters, names):
    """`{name: [N] sizes}` for `names` of `_TRANSFORMATION_SIZES`, checked against `correct`."""
    sizes = {name: np.asarray(_TRANSFORMATION_SIZES[name](parameters)) for name in names}
    if any(len(size) != len(correct) for size in sizes.values()):
        raise ValueError(
            "`correct` and `parameters` must describe the same examples. Received: "
            f"{len(correct)} scores, {len(next(iter(sizes.values())))} transformations"
        )
    return sizes


def affnist_breakdown(correct, parameters, trained_shift=6):
    """Accuracy on the affNIST-style set split by how far each transformation leaves training.

    Expanded MNIST trains on digits shifted by at most `trained_shift`
    pixels and nothing else, so a score splits along two questions: was the
    digit moved further than training ever moved one (`max(|translate_y|,
    |translate_x|) > trained_shift`), and was it rotated by more than 10
    degrees (half of affNIST's range).

    Args:
        correct: bool `[N]`, whether example `k` was classified right.
        parameters: `affnist_parameters`' dict for the same `N` examples.
        trained_shift: the run's `--shift`.

    Returns:
        `{group: {"accuracy": float or None, "examples": int}}` for the groups
        `shift_within_training`, `shift_beyond_training`, `rotation_up_to_10`,
        `rotation_beyond_10` (accuracy None for an empty group).
    """
    correct = np.asarray(correct, bool)
    sizes = _transformation_sizes(correct, parameters, ("shift", "rotation"))
    groups = {
        "shift_within_training": sizes["shift"] <= trained_shift,
        "shift_beyond_training": sizes["shift"] > trained_shift,
        "rotation_up_to_10": sizes["rotation"] <= 10.0,
        "rotation_beyond_10": sizes["rotation"] > 10.0,
    }
    return {
        name: {
            "accuracy": float(correct[mask].mean()) if mask.any() else None,
            "examples": int(mask.sum()),
        }
        for name, mask in groups.items()
    }


# Bin edges of `affnist_by_transformation`, per transformation: the digit's
# shift (max(|translate_y|, |translate_x|), px; training's 6 px is an edge),
# |rotation| (degrees), |shear| and scale (the mean of the two axes'), over
# the generator's ranges. Bins are right-closed, the first one closed.
AFFNIST_CURVE_EDGES = {
    "shift": (0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 20.0),
    "rotation": (0.0, 5.0, 10.0, 15.0, 20.0),
    "shear": (0.0, 0.05, 0.1, 0.15, 0.2),
    "scale": (0.8, 0.9, 1.0, 1.1, 1.2),
}


def affnist_by_transformation(correct, parameters, edges=None):
    """Accuracy on the affNIST-style set in bins of each transformation's size.

    Where `affnist_breakdown` asks two yes/no questions, these curves show
    how accuracy falls as each transformation grows, so two models can be
    compared along each (the paper's claim is that capsules degrade less).

    Args:
        correct: bool `[N]`, whether example `k` was classified right.
        parameters: `affnist_parameters`' dict for the same `N` examples.
        edges: `{name: increasing bin edges}` for names among `shift`,
            `rotation`, `shear`, `scale` (None: `AFFNIST_CURVE_EDGES`).

    Returns:
        `{name: {"edges": [...], "accuracy": [float or None per bin],
        "examples": [int per bin]}}`; a value outside the edges counts in
        no bin.
    """
    correct = np.asarray(correct, bool)
    edges = edges or AFFNIST_CURVE_EDGES
    sizes = _transformation_sizes(correct, parameters, tuple(edges))
    curves = {}
    for name, bin_edges in edges.items():
        bin_edges = np.asarray(bin_edges, np.float64)
        # Right-closed bins (a, b], the first [a, b]: index 0 .. len(edges) - 2.
        index = np.searchsorted(bin_edges, sizes[name], side="left") - 1
        index[sizes[name] == bin_edges[0]] = 0
        inside = (index >= 0) & (index < len(bin_edges) - 1)
        examples = np.bincount(index[inside], minlength=len(bin_edges) - 1)
        right = np.bincount(index[inside], weights=correct[inside], minlength=len(bin_edges) - 1)
        curves[name] = {
            "edges": [float(edge) for edge in bin_edges],
            "accuracy": [
                float(r / n) if n else None for r, n in zip(right, examples, strict=True)
            ],
            "examples": [int(n) for n in examples],
        }
    return curves


def _load(workdir, checkpoint, dataset, protocol, flagfile, precision):
    """The run's model and config; a run on another data set than `dataset` is refused.

    The model computes in `precision`: `"trained"` (the mixed precision the
    run trained and chose its stop in) or `"float32"`.
    """
    from capsnet_tf.config import PRECISION_POLICIES
    from capsnet_tf.workdir import load_trained_model

    if precision not in ("trained", "float32"):
        raise ValueError(
            f'`precision` must be "trained" or "float32". Received: precision={precision!r}'
        )
    previous = keras.config.dtype_policy()
    if precision == "trained":
        keras.config.set_dtype_policy(PRECISION_POLICIES[_trained_precision(workdir)])
    try:
        model, config = load_trained_model(workdir, checkpoint=checkpoint)
    finally:
        keras.config.set_dtype_policy(previous)
    if config.dataset != dataset:
        raise ValueError(
            f"{workdir} trained on {config.dataset!r}; the {protocol} protocol needs a run on "
            f"{dataset} (experiments/{flagfile})."
        )
    return model, config


def _trained_precision(workdir):
    """What the run computed in: its resolved `--mixed_precision` ("float32", "bfloat16", ...)."""
    with open(os.path.join(workdir, "config.json")) as file:
        saved = json.load(file)
    return saved.get("mixed_precision_resolved", saved.get("mixed_precision", "float32"))


def _describe(model, config, workdir, data_dir):
    """The run's facts beside its scores: model, parameters, precisions, budget."""
    return {
        "model": config.model,
        "parameters": int(model.count_params()),
        "dataset": config.dataset,
        # What an `auto` request resolved to on the training machine.
        "mixed_precision": _trained_precision(workdir),
        # The precision the scores below were computed in (`precision`).
        "scored_in": keras.backend.standardize_dtype(model.compute_dtype),
        "seed": config.seed,
        **training_budget(workdir, data_dir),
    }


def evaluate_affnist_protocol(
    workdir, copies=32, batch_size=250, seed=0, checkpoint="latest", data_dir=None,
    affnist_path=None, progress=True, take=None, precision="trained",
):
    """Section 5.2's scores of an expanded-MNIST run: expanded MNIST, affNIST, centred.

    Args:
        workdir: a work directory of an `expanded_mnist` run (CapsNet or CNN).
        copies: affNIST-style transformations of each MNIST test digit
            (affNIST: 32, i.e. 320,000 images).
        batch_size: evaluation batch size.
        seed: seed of the affNIST-style transformations (the same for every
            model compared).
        checkpoint: `"latest"` (the model at the run's stop) or `"best"`.
        data_dir: TFDS data directory.
        affnist_path: the real affNIST test data instead of the generated set.
        progress: show progress bars.
        take: score only the first `take` examples of each set (smoke tests).
        precision: `"trained"` (default): the model computes in the precision
            it trained in, in which its stop at the target accuracy was
            measured; `"float32"`.

    Returns:
        A dict: the run (`model`, `parameters`, the training budget,
        `scored_in`), and `test_accuracy` / `test_examples` (the expanded MNIST test set, each
        digit at the run's fixed random offset), `affnist_accuracy` /
        `affnist_examples`, `centred_accuracy` / `centred_examples` (the
        untransformed digits centred on the 40x40 canvas), `affnist_source`,
        the paper's numbers and, for the generated set, `affnist_breakdown`
        and `affnist_by_transformation` (see those functions).
    """
    from capsnet_tf.data.affnist import (
        affnist_parameters,
        make_affnist_dataset,
        make_expanded_mnist_dataset,
    )

    model, config = _load(
        workdir, checkpoint, "expanded_mnist", "affNIST", "paper_affnist.flags", precision
    )
    result = _describe(model, config, workdir, data_dir)
    sets = {
        "test": make_expanded_mnist_dataset(
            "test", batch_size, training=False, seed=config.seed, pad=6, max_shift=config.shift,
            data_dir=data_dir, reconstruction=False, take=take,
        ),
        "centred": make_expanded_mnist_dataset(
            "test", batch_size, training=False, seed=config.seed, pad=6, max_shift=0,
            data_dir=data_dir, reconstruction=False, take=take,
        ),
        "affnist": make_affnist_dataset(
            batch_size, seed=seed, data_dir=data_dir, path=affnist_path, reconstruction=False,
            copies=1 if affnist_path else copies, take=take,
        ),
    }
    correct = {}
    for name, (dataset, spec) in sets.items():
        examples = min(take or spec.num_examples, spec.num_examples)
        if progress:
            print(f"{name}: {examples:,} images")
        # reconstruction=False: batches of ({"image"}, {"length": labels}).
        scores, labels = class_scores(model, config.model, dataset, examples, progress)
        result[f"{name}_accuracy"] = single_label_accuracy(scores, labels)
        result[f"{name}_examples"] = int(len(labels))
        correct[name] = np.argmax(scores, axis=-1) == labels
    if not affnist_path:  # the generated set knows each example's transformation
        parameters = affnist_parameters(seed, copies, data_dir, take)
        result["affnist_breakdown"] = affnist_breakdown(
            correct["affnist"], parameters, config.shift
        )
        result["affnist_by_transformation"] = affnist_by_transformation(
            correct["affnist"], parameters
        )
    result["affnist_source"] = (
        "affNIST test data" if affnist_path
        else f"generated from the MNIST test split, {copies} transformations per digit, "
        f"seed {seed} (rotation within 20 degrees, shear within 0.2, scale 0.8-1.2 per "
        "axis, translation keeping the digit inside the 40x40 frame)"
    )
    result["paper"] = PAPER_NUMBERS["affnist"]
    return result


def evaluate_multimnist_protocol(
    workdir, pairs_per_image=10, batch_size=250, checkpoint="latest", data_dir=None,
    progress=True, take=None, precision="trained",
):
    """Section 6's scores of a MultiMNIST run on `10,000 * pairs_per_image` seeded test pairs.

    The pairs are `make_multimnist_dataset`'s test set with the run's seed
    and shift; `take` keeps the first `take` pairs (smoke tests).

    Returns:
        A dict: the run (`model`, `parameters`, the training budget), the
        scores of `multimnist_scores` on the test pairs (`test_examples`
        pairs) and the paper's numbers.
    """
    from capsnet_tf.data.multimnist import make_multimnist_dataset

    model, config = _load(
        workdir, checkpoint, "multi_mnist", "MultiMNIST", "paper_multi_mnist.flags", precision
    )
    result = _describe(model, config, workdir, data_dir)
    dataset, spec = make_multimnist_dataset(
        "test", batch_size, training=False, seed=config.seed, max_shift=config.shift,
        test_pairs_per_image=pairs_per_image, data_dir=data_dir, reconstruction=False,
        take=take,
    )
    examples = min(take or spec.num_examples, spec.num_examples)
    if progress:
        print(f"test pairs: {examples:,}")
    scores, labels = class_scores(model, config.model, dataset, examples, progress)
    scored = multimnist_scores(scores, labels)
    result.update({f"test_{name}": value for name, value in scored.items()})
    result["test_examples"] = scored["examples"]
    result["paper"] = PAPER_NUMBERS["multi_mnist"]
    return result
