"""`write_figures`: every figure of one training run's work directory (what
`experiments/visualize.py` calls).

For a MultiMNIST work directory (two targets) it draws the paper's Figure 5
(`plot_multimnist_separations`: each of the two longest capsules
reconstructed alone, in red and green over the input) instead of the
one-digit reconstruction, perturbation and confusion figures.
"""

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
    from capsnet_tf.workdir import load_trained_model, read_class_names, read_run_files

    unknown = sorted(set(figures) - set(FIGURE_NAMES))
    if unknown:
        raise ValueError(f"Unknown figures {unknown}; choose from {list(FIGURE_NAMES)}")
    output_dir = output_dir or os.path.join(workdir, "figures")  # made by the first figure
    written = {}
    config, model_config = read_run_files(workdir, require_model=False)
    multi_target = _is_multi_target(model_config, config)
    if multi_target:
        single = {"reconstructions", "perturbations", "confusion_matrix"} & set(figures)
        if single:
            log(f"MultiMNIST work directory: {', '.join(sorted(single))} assume one digit "
                "per image and are skipped; Figure 5 is 'multimnist'.")
        figures = [name for name in figures if name not in single]
    elif "multimnist" in figures:
        figures = [name for name in figures if name != "multimnist"]
    dataset = config.get("dataset", "mnist")
    data_dir = data_dir or config.get("data_dir")
    test_options = {
        "seed": config.get("seed", 0),
        "test_pairs_per_image": config.get("test_pairs_per_image", 1),
        "affnist_path": config.get("affnist_path"),
        "shift": config.get("shift"),
    }
    if config.get("image_folder") or config.get("image_size"):
        test_options.update(
            image_folder=config.get("image_folder"),
            image_size=config.get("image_size"),
            test_fraction=config.get("test_fraction", 0.2),
        )

    log_path = os.path.join(workdir, "training_log.csv")
    history = read_training_log(log_path) if os.path.exists(log_path) else {}
    epochs = len(history.get("epoch", ()))
    model_name = "CapsNet"
    if epochs and config.get("steps_per_epoch"):  # shortened epochs: count steps
        model_name += f" after {epochs * int(config['steps_per_epoch']):,} training steps"
    elif epochs:
        model_name += f" after {epochs} epoch{'s' if epochs != 1 else ''}"
    if "training_curves" in figures:
        if os.path.exists(log_path):
            rates = None
            if history:
                rates = learning_rates(
                    config, history["epoch"], run_train_examples(config, data_dir)
                )
            written["training_curves"] = plot_training_curves(
                history, os.path.join(output_dir, "training_curves.png"), rates,
                config.get("reconstruction_weight") if config.get("reconstruction") else None,
                dpi=dpi,
            )
        else:
            log(f"No {log_path}: training curves skipped.")

    needs_model = {"reconstructions", "perturbations", "confusion_matrix", "routing",
                   "multimnist"}
    if not needs_model & set(figures):
        return written
    model = None
    if saved_model is None or "routing" in figures:
        model, _ = load_trained_model(workdir, checkpoint)
    if saved_model is not None:
        log(f"Reconstructions, perturbations and confusion matrix from {saved_model}.")
        adapter = open_capsnet(saved_model)
    else:
        adapter = KerasCapsNet(model)
    wanted = set(figures)
    if not adapter.reconstruction:
        log("The model has no decoder: reconstruction and perturbation figures skipped.")
        wanted -= {"reconstructions", "perturbations"}
    classify = bool({"confusion_matrix", "reconstructions", "perturbations"} & wanted)
    classified = eval_examples if classify else 0
    if classify and "confusion_matrix" not in wanted and eval_examples is None:
        classified = RECONSTRUCTION_POOL
    count = classified
    if "routing" in wanted and count is not None:
        count = max(count, routing_example + 1)
    if "multimnist" in wanted:
        count = max(count or 0, reconstruction_examples)
    all_images, all_labels = load_test_images(dataset, count, data_dir, **test_options)
    images, labels = all_images[:classified], all_labels[:classified]
    if classify:
        log(f"Classifying {len(images)} test images ...")
        outputs = adapter.predict(images, batch_size=100)
        predictions = outputs["predictions"]
        accuracy = 100.0 * float(np.mean(predictions == labels))
        log(f"Accuracy on these {len(images)} test images: {accuracy:.2f}%")
    name = {"mnist": "MNIST", "fashion_mnist": "Fashion-MNIST"}.get(dataset, dataset)
    if config.get("image_folder"):
        name = os.path.basename(os.path.normpath(config["image_folder"]))
    class_names = read_class_names(workdir, adapter.num_classes)
    if class_names == [str(index) for index in range(adapter.num_classes)]:
        class_names = None  # digits: the figures' own numbering says the same

    if "confusion_matrix" in wanted:
        matrix = confusion_matrix(labels, predictions, adapter.num_classes)
        written["confusion_matrix"] = plot_confusion_matrix(
            matrix, os.path.join(output_dir, "confusion_matrix.png"), dpi=dpi,
            class_names=class_names,
            title=f"Confusion matrix on {len(images)} {name} test images "
            f"(accuracy {accuracy:.2f}%)",
        )
    if "reconstructions" in wanted:
        shown = slice(0, min(reconstruction_examples, 16, len(images)))
        wrong = np.flatnonzero(predictions != labels)
        num_wrong, wrong = len(wrong), wrong[:8]
        written["reconstructions"] = plot_reconstructions(
            images[shown], labels[shown], outputs["reconstruction"][shown], predictions[shown],
            os.path.join(output_dir, "reconstructions.png"),
            wrong=(images[wrong], labels[wrong], outputs["reconstruction"][wrong],
                   predictions[wrong]),
            dpi=dpi,
            class_names=class_names,
            title=f"{model_name}: reconstructions of {name} test images\n({num_wrong} of the "
            f"{len(images)} evaluated misclassified; the first {len(wrong)} shown)",
        )
    if "perturbations" in wanted:
        for digit in perturbation_digits:
            index = _pick(labels, predictions, digit)
            if index is None:
                log(f"No test image of digit {digit} among the {len(images)} evaluated.")
                continue
            class_id = int(predictions[index])
            grid = perturbation_grid(adapter, outputs["capsules"][index], class_id)
            written[f"perturbations_{digit}"] = plot_perturbations(
                grid, os.path.join(output_dir, f"perturbations_{digit}.png"),
                image=images[index], label=labels[index], class_id=class_id, dpi=dpi,
                model_name=model_name,
            )
    if "multimnist" in wanted:
        shown = min(reconstruction_examples, 16, len(all_images))
        outputs = adapter.predict(all_images[:shown], batch_size=100)
        predicted_pairs = np.argsort(-outputs["length"], axis=-1)[:, :2]
        correct = np.mean([
            sorted(pair) == sorted(labels_pair)
            for pair, labels_pair in zip(predicted_pairs, all_labels[:shown])
        ])
        written["multimnist"] = plot_multimnist_separations(
            all_images[:shown], all_labels[:shown], outputs["reconstruction"],
            predicted_pairs, os.path.join(output_dir, "multimnist.png"), dpi=dpi,
            title=f"{model_name} on MultiMNIST: each digit reconstructed from its own "
            f"capsule ({100 * correct:.0f}% of these {shown} pairs right)",
        )
    if "routing" in wanted:
        if routing_example >= len(all_images):
            raise ValueError(
                f"routing_example={routing_example}, but the test set has only "
                f"{len(all_images)} images."
            )
        routing = routing_couplings(model, all_images[routing_example])
        written["routing"] = plot_routing(
            routing, os.path.join(output_dir, "routing.png"),
            image=all_images[routing_example], label=all_labels[routing_example], dpi=dpi,
        )
    return written
