"""`write_figures`: every figure of one training run's work directory (what
`experiments/visualize.py` calls).

`write_figures` is the driver: it reads the run (`_read_run`), opens the
model (`_open_models`), classifies the test images the figures need once
(`_classify`), and calls one `_draw_<figure>` function per figure.

For a MultiMNIST work directory (two targets) it draws the paper's Figure 5
(`plot_multimnist_separations`: each of the two longest capsules
reconstructed alone, in red and green over the input) instead of the
one-digit reconstruction, perturbation and confusion figures.
"""

import dataclasses
import os

import numpy as np

from capsnet_tf.data.samples import load_test_images, run_train_examples
from capsnet_tf.figures.arrays import confusion_matrix, perturbation_grid
from capsnet_tf.figures.history import learning_rates, read_training_log
from capsnet_tf.figures.plots import (
    plot_confusion_matrix,
    plot_multimnist_separations,
    plot_perturbations,
    plot_reconstructions,
    plot_routing,
    plot_training_curves,
)
from capsnet_tf.figures.style import DPI, FIGURE_NAMES, RECONSTRUCTION_POOL
from capsnet_tf.routing import routing_couplings
from capsnet_tf.trained import KerasCapsNet, open_capsnet

__all__ = [
    "write_figures",
]

# The figures drawn from the model (all but the training curves).
_NEEDS_MODEL = {"reconstructions", "perturbations", "confusion_matrix", "routing", "multimnist"}
# The figures drawn for one digit per image (not for MultiMNIST).
_ONE_DIGIT = {"reconstructions", "perturbations", "confusion_matrix"}


@dataclasses.dataclass
class _Run:
    """What the figures of one work directory share."""

    config: dict
    multi_target: bool
    dataset: str
    data_dir: str
    test_options: dict
    log_path: str
    history: dict
    model_name: str
    data_name: str
    output_dir: str
    dpi: int


@dataclasses.dataclass
class _Tested:
    """The test images the figures use and, when classified, the model's outputs.

    `images` and `labels` are the first of `all_images` and `all_labels`:
    those classified (the confusion matrix, the reconstruction and
    perturbation figures); `outputs`, `predictions` and `accuracy` are theirs.
    """

    all_images: np.ndarray
    all_labels: np.ndarray
    images: np.ndarray
    labels: np.ndarray
    outputs: dict = None
    predictions: np.ndarray = None
    accuracy: float = None


def _is_multi_target(model_config, config):
    """True for a model that reconstructs several digits per image (MultiMNIST)."""
    targets = model_config.get("num_targets") or model_config.get("targets") or 1
    return targets > 1 or "multi" in str(config.get("dataset", "")).lower()


def _pick(labels, predictions, digit):
    """Index of the first correctly classified test image of `digit` (or any of it)."""
    candidates = np.flatnonzero(labels == digit)
    correct = candidates[predictions[candidates] == digit]
    if len(correct):
        return int(correct[0])
    return int(candidates[0]) if len(candidates) else None


def _test_options(config):
    """The `load_test_images` options that give a run's own test images."""
    options = {
        "seed": config.get("seed", 0),
        "test_pairs_per_image": config.get("test_pairs_per_image", 1),
        "affnist_path": config.get("affnist_path"),
        "shift": config.get("shift"),
    }
    if config.get("image_folder") or config.get("image_size"):
        options.update(
            image_folder=config.get("image_folder"),
            image_size=config.get("image_size"),
            test_fraction=config.get("test_fraction", 0.2),
        )
    return options


def _model_name(history, config):
    """`"CapsNet after 3 epochs"` (or `after 1,200 training steps` for shortened epochs)."""
    epochs = len(history.get("epoch", ()))
    if epochs and config.get("steps_per_epoch"):  # shortened epochs: count steps
        return f"CapsNet after {epochs * int(config['steps_per_epoch']):,} training steps"
    if epochs:
        return f"CapsNet after {epochs} epoch{'s' if epochs != 1 else ''}"
    return "CapsNet"


def _data_name(config, dataset):
    """The test set's name in titles: `MNIST`, `Fashion-MNIST`, the image folder's name."""
    if config.get("image_folder"):
        return os.path.basename(os.path.normpath(config["image_folder"]))
    return {"mnist": "MNIST", "fashion_mnist": "Fashion-MNIST"}.get(dataset, dataset)


def _read_run(workdir, output_dir, data_dir, dpi):
    """The `_Run` of a work directory: its configuration, log and names.

    Raises:
        FileNotFoundError: no `config.json` (named).
    """
    from capsnet_tf.workdir import read_run_files

    config, model_config = read_run_files(workdir, require_model=False)
    dataset = config.get("dataset", "mnist")
    log_path = os.path.join(workdir, "training_log.csv")
    history = read_training_log(log_path) if os.path.exists(log_path) else {}
    return _Run(
        config=config,
        multi_target=_is_multi_target(model_config, config),
        dataset=dataset,
        data_dir=data_dir or config.get("data_dir"),
        test_options=_test_options(config),
        log_path=log_path,
        history=history,
        model_name=_model_name(history, config),
        data_name=_data_name(config, dataset),
        output_dir=output_dir or os.path.join(workdir, "figures"),  # made by the first figure
        dpi=dpi,
    )


def _applicable(figures, multi_target, log):
    """`figures` without those the run's kind of data set has no use for."""
    if multi_target:
        single = _ONE_DIGIT & set(figures)
        if single:
            log(f"MultiMNIST work directory: {', '.join(sorted(single))} assume one digit "
                "per image and are skipped; Figure 5 is 'multimnist'.")
        return [name for name in figures if name not in single]
    return [name for name in figures if name != "multimnist"]


def _open_models(workdir, checkpoint, saved_model, figures, log):
    """`(checkpoint model or None, TrainedCapsNet)`: the model the figures draw.

    The checkpoint is loaded unless a SavedModel replaces it and no routing
    figure (which the export cannot draw) is wanted.
    """
    from capsnet_tf.workdir import load_trained_model

    model = None
    if saved_model is None or "routing" in figures:
        model, _ = load_trained_model(workdir, checkpoint)
    if saved_model is None:
        return model, KerasCapsNet(model)
    log(f"Reconstructions, perturbations and confusion matrix from {saved_model}.")
    return model, open_capsnet(saved_model)


def _classify(run, capsnet, wanted, eval_examples, reconstruction_examples, routing_example,
              log):
    """Loads the test images the `wanted` figures need; classifies those they use.

    See `write_figures` for how many: `eval_examples` classified (the whole
    test set for a confusion matrix, else `RECONSTRUCTION_POOL`), at least
    `routing_example + 1` and `reconstruction_examples` (MultiMNIST) loaded.
    """
    classify = bool(_ONE_DIGIT & wanted)
    classified = eval_examples if classify else 0
    if classify and "confusion_matrix" not in wanted and eval_examples is None:
        classified = RECONSTRUCTION_POOL
    count = classified
    if "routing" in wanted and count is not None:
        count = max(count, routing_example + 1)
    if "multimnist" in wanted:
        count = max(count or 0, reconstruction_examples)
    all_images, all_labels = load_test_images(run.dataset, count, run.data_dir,
                                              **run.test_options)
    tested = _Tested(all_images, all_labels, all_images[:classified], all_labels[:classified])
    if classify:
        log(f"Classifying {len(tested.images)} test images ...")
        tested.outputs = capsnet.predict(tested.images, batch_size=100)
        tested.predictions = tested.outputs["predictions"]
        tested.accuracy = 100.0 * float(np.mean(tested.predictions == tested.labels))
        log(f"Accuracy on these {len(tested.images)} test images: {tested.accuracy:.2f}%")
    return tested


def _draw_training_curves(run, log):
    """`{"training_curves": path}` from the CSV log and the schedule; `{}` without a log."""
    if not os.path.exists(run.log_path):
        log(f"No {run.log_path}: training curves skipped.")
        return {}
    config, rates = run.config, None
    if run.history:
        rates = learning_rates(
            config, run.history["epoch"], run_train_examples(config, run.data_dir)
        )
    return {"training_curves": plot_training_curves(
        run.history, os.path.join(run.output_dir, "training_curves.png"), rates,
        config.get("reconstruction_weight") if config.get("reconstruction") else None,
        dpi=run.dpi,
    )}


def _draw_confusion_matrix(run, tested, num_classes, class_names):
    """`confusion_matrix.png` of the classified test images."""
    matrix = confusion_matrix(tested.labels, tested.predictions, num_classes)
    return plot_confusion_matrix(
        matrix, os.path.join(run.output_dir, "confusion_matrix.png"), dpi=run.dpi,
        class_names=class_names,
        title=f"Confusion matrix on {len(tested.images)} {run.data_name} test images "
        f"(accuracy {tested.accuracy:.2f}%)",
    )


def _draw_reconstructions(run, tested, reconstruction_examples, class_names):
    """`reconstructions.png`: the first test images and up to 8 misclassified ones."""
    images, labels, predictions = tested.images, tested.labels, tested.predictions
    reconstructions = tested.outputs["reconstruction"]
    shown = slice(0, min(reconstruction_examples, 16, len(images)))
    wrong = np.flatnonzero(predictions != labels)
    num_wrong, wrong = len(wrong), wrong[:8]
    return plot_reconstructions(
        images[shown], labels[shown], reconstructions[shown], predictions[shown],
        os.path.join(run.output_dir, "reconstructions.png"),
        wrong=(images[wrong], labels[wrong], reconstructions[wrong], predictions[wrong]),
        dpi=run.dpi,
        class_names=class_names,
        title=f"{run.model_name}: reconstructions of {run.data_name} test images\n"
        f"({num_wrong} of the {len(images)} evaluated misclassified; the first "
        f"{len(wrong)} shown)",
    )


def _draw_perturbations(run, capsnet, tested, digits, log):
    """`{"perturbations_<digit>": path}`: Figure 4 for each digit found among the tested."""
    written = {}
    for digit in digits:
        index = _pick(tested.labels, tested.predictions, digit)
        if index is None:
            log(f"No test image of digit {digit} among the {len(tested.images)} evaluated.")
            continue
        class_id = int(tested.predictions[index])
        grid = perturbation_grid(capsnet, tested.outputs["capsules"][index], class_id)
        written[f"perturbations_{digit}"] = plot_perturbations(
            grid, os.path.join(run.output_dir, f"perturbations_{digit}.png"),
            image=tested.images[index], label=tested.labels[index], class_id=class_id,
            dpi=run.dpi, model_name=run.model_name,
        )
    return written


def _draw_multimnist(run, capsnet, tested, reconstruction_examples):
    """`multimnist.png`: Figure 5, each of the two longest capsules reconstructed alone."""
    shown = min(reconstruction_examples, 16, len(tested.all_images))
    images, labels = tested.all_images[:shown], tested.all_labels[:shown]
    outputs = capsnet.predict(images, batch_size=100)
    predicted_pairs = np.argsort(-outputs["length"], axis=-1)[:, :2]
    correct = np.mean([
        sorted(pair) == sorted(labels_pair) for pair, labels_pair in zip(predicted_pairs, labels)
    ])
    return plot_multimnist_separations(
        images, labels, outputs["reconstruction"],
        predicted_pairs, os.path.join(run.output_dir, "multimnist.png"), dpi=run.dpi,
        title=f"{run.model_name} on MultiMNIST: each digit reconstructed from its own "
        f"capsule ({100 * correct:.0f}% of these {shown} pairs right)",
    )


def _draw_routing(run, model, tested, routing_example):
    """`routing.png`: the couplings of test image `routing_example` (the checkpoint's)."""
    if routing_example >= len(tested.all_images):
        raise ValueError(
            f"routing_example={routing_example}, but the test set has only "
            f"{len(tested.all_images)} images."
        )
    image = tested.all_images[routing_example]
    return plot_routing(
        routing_couplings(model, image), os.path.join(run.output_dir, "routing.png"),
        image=image, label=tested.all_labels[routing_example], dpi=run.dpi,
    )


def _draw_model_figures(run, workdir, model, capsnet, wanted, eval_examples,
                        reconstruction_examples, perturbation_digits, routing_example, log):
    """`{name: path}` of the `wanted` figures drawn from the model, in this order."""
    from capsnet_tf.workdir import read_class_names

    if not capsnet.reconstruction:
        log("The model has no decoder: reconstruction and perturbation figures skipped.")
        wanted = wanted - {"reconstructions", "perturbations"}
    tested = _classify(run, capsnet, wanted, eval_examples, reconstruction_examples,
                       routing_example, log)
    class_names = read_class_names(workdir, capsnet.num_classes)
    if class_names == [str(index) for index in range(capsnet.num_classes)]:
        class_names = None  # digits: the figures' own numbering says the same
    written = {}
    if "confusion_matrix" in wanted:
        written["confusion_matrix"] = _draw_confusion_matrix(
            run, tested, capsnet.num_classes, class_names
        )
    if "reconstructions" in wanted:
        written["reconstructions"] = _draw_reconstructions(
            run, tested, reconstruction_examples, class_names
        )
    if "perturbations" in wanted:
        written.update(_draw_perturbations(run, capsnet, tested, perturbation_digits, log))
    if "multimnist" in wanted:
        written["multimnist"] = _draw_multimnist(run, capsnet, tested, reconstruction_examples)
    if "routing" in wanted:
        written["routing"] = _draw_routing(run, model, tested, routing_example)
    return written


def write_figures(
    workdir,
    output_dir=None,
    figures=FIGURE_NAMES,
    checkpoint="best",
    eval_examples=None,
    reconstruction_examples=16,
    perturbation_digits=tuple(range(10)),
    routing_example=0,
    data_dir=None,
    dpi=DPI,
    saved_model=None,
    log=print,
):
    """Writes the figures of a trained work directory as PNG files.

    Args:
        workdir: a directory written by `capsnet_tf.training.train_and_evaluate`.
        output_dir: where the PNGs go (default `workdir/figures`).
        figures: which of `FIGURE_NAMES` to make.
        checkpoint: `"best"` or `"latest"`.
        eval_examples: test images classified for the confusion matrix and
            searched for misclassified examples (None: the whole test set
            with a confusion matrix; without one, the reconstruction and
            perturbation figures use at most the first `RECONSTRUCTION_POOL`
            images unless `eval_examples` is given).
        reconstruction_examples: test images in the reconstruction grid
            (at most 16; misclassified ones are added).
        perturbation_digits: one `perturbations_<digit>.png` per digit, made
            from the first correctly classified test image of that digit.
        routing_example: index of the test image whose routing is drawn.
        data_dir: TFDS data directory.
        dpi: resolution of every PNG.
        saved_model: optional path of a SavedModel exported from this run
            (`capsnet_tf.export`); the reconstruction, perturbation and
            confusion figures then use its `serving_float` and `decode`
            signatures instead of the checkpoint. The routing figure always
            needs the checkpoint (the export has no couplings).
        log: function called with progress messages.

    Returns:
        Dict `{figure name: path}` of the files written
        (`"perturbations_3"` etc. for the digits).

    Raises:
        FileNotFoundError: not a finished work directory.
        ValueError: unknown figure names, or a SavedModel without the
            `serving_float` and `decode` signatures.

    Example:

    >>> write_figures("/tmp/capsnet_mnist", eval_examples=1000,  # doctest: +SKIP
    ...               perturbation_digits=[3, 7])
    {'training_curves': '/tmp/capsnet_mnist/figures/training_curves.png', ...}
    """
    unknown = sorted(set(figures) - set(FIGURE_NAMES))
    if unknown:
        raise ValueError(f"Unknown figures {unknown}; choose from {list(FIGURE_NAMES)}")
    run = _read_run(workdir, output_dir, data_dir, dpi)
    figures = _applicable(figures, run.multi_target, log)
    written = {}
    if "training_curves" in figures:
        written.update(_draw_training_curves(run, log))
    if not _NEEDS_MODEL & set(figures):
        return written
    model, capsnet = _open_models(workdir, checkpoint, saved_model, figures, log)
    written.update(_draw_model_figures(
        run, workdir, model, capsnet, set(figures), eval_examples, reconstruction_examples,
        perturbation_digits, routing_example, log,
    ))
    return written
