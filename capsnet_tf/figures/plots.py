"""One PNG per function: reconstructions (the paper's Figure 3), perturbations
(Figure 4), MultiMNIST separations (Figure 5), training curves, the confusion
matrix, routing couplings, test error against wall-clock time and the
affNIST-style accuracy against the size of each transformation.
"""

import math

import matplotlib.colors
import matplotlib.patches
import matplotlib.ticker
import numpy as np

from capsnet_tf.figures.style import (
    _RIGHT,
    _WRONG,
    DPI,
    PERTURBATION_VALUES,
    _figure,
    _save,
    _show,
)
from capsnet_tf.mosaics import grid_mosaic, two_colour

__all__ = [
    "REFERENCE_ERRORS",
    "error_curve",
    "plot_affnist_by_transformation",
    "plot_error_against_time",
    "test_accuracy_column",
    "plot_confusion_matrix",
    "plot_multimnist_separations",
    "plot_perturbations",
    "plot_reconstructions",
    "plot_routing",
    "plot_training_curves",
]


def plot_reconstructions(
    images,
    labels,
    reconstructions,
    predictions,
    path,
    wrong=None,
    columns=8,
    dpi=DPI,
    title="CapsNet reconstructions",
    class_names=None,
):
    """Inputs over their reconstructions, plus a row of misclassified examples.

    Args:
        images: `[n, H, W, C]` test inputs (n <= 2 * columns are drawn).
        labels: `[n]` true classes.
        reconstructions: `[n, H, W, C]`, from the predicted (longest) capsule.
        predictions: `[n]` predicted classes.
        path: PNG file to write.
        wrong: optional `(images, labels, reconstructions, predictions)` of
            misclassified examples for the last pair of rows (up to
            `columns`); an empty or missing one is said in the figure.
        columns: images per row.
        dpi: resolution; the PNG is `FIGURE_SIZES["reconstructions"] * dpi`.
        title: the figure's title.
        class_names: names of the classes for the titles (default: numbers).

    Returns:
        `path`.
    """

    blocks = _reconstruction_blocks(
        images, labels, reconstructions, predictions, wrong, columns
    )
    figure = _figure("reconstructions")
    grid = figure.add_gridspec(
        2 * len(blocks), columns, left=0.13, right=0.88, top=0.86, bottom=0.03,
        hspace=0.45, wspace=0.08,
    )
    drawn = None
    for block_index, block in enumerate(blocks):
        last = _draw_reconstruction_block(figure, grid, 2 * block_index, block, columns,
                                          class_names)
        drawn = drawn if last is None else last
        figure.text(
            0.02, 1.0 - (0.14 + 0.83 * (block_index + 0.5) / len(blocks)), block[0],
            rotation=90, va="center", ha="center", fontsize=11, weight="bold",
        )
    figure.suptitle(title, fontsize=12, y=0.985)
    figure.text(
        0.5, 0.925, "each pair of rows: test inputs over the decoder's reconstructions "
        "from the predicted (longest) class capsule; titles: true and predicted class",
        ha="center", fontsize=9,
    )
    figure.legend(
        handles=[
            matplotlib.patches.Patch(color=_RIGHT, label="correct"),
            matplotlib.patches.Patch(color=_WRONG, label="misclassified"),
        ],
        loc="upper left", bbox_to_anchor=(0.885, 0.84), fontsize=8, frameon=False,
    )
    if drawn is not None:
        bar = figure.add_axes([0.91, 0.1, 0.015, 0.6])
        figure.colorbar(drawn, cax=bar, label="pixel intensity")
    return _save(figure, path, dpi)



def _reconstruction_blocks(images, labels, reconstructions, predictions, wrong, columns):
    """The pairs of rows of `plot_reconstructions`: `(kind, images, labels, reconstructions,
    predictions)`, up to two of test images and one of misclassified ones (all None: none)."""
    blocks = []
    count = min(len(images), 2 * columns)
    for start in range(0, count, columns):
        stop = min(start + columns, count)
        blocks.append((
            f"test images {start + 1}-{stop}",
            images[start:stop], labels[start:stop],
            reconstructions[start:stop], predictions[start:stop],
        ))
    if wrong is not None and len(wrong[0]):
        blocks.append(("misclassified", *(array[:columns] for array in wrong)))
    else:
        blocks.append(("misclassified", None, None, None, None))
    return blocks


def _draw_reconstruction_block(figure, grid, row, block, columns, class_names):
    """Draws one block of `_reconstruction_blocks` into rows `row` and `row + 1` of `grid`.

    Returns:
        The last image drawn (for the colour bar), or None.
    """

    def named(class_id):
        return class_names[int(class_id)] if class_names else str(int(class_id))

    _, block_images, block_labels, block_recons, block_preds = block
    if block_images is None:
        axis = figure.add_subplot(grid[row:row + 2, :])
        axis.axis("off")
        axis.text(0.5, 0.5, "no misclassified examples among the evaluated test images",
                  ha="center", va="center", fontsize=11)
        return None
    drawn = None
    for column in range(columns):
        top = figure.add_subplot(grid[row, column])
        bottom = figure.add_subplot(grid[row + 1, column])
        if column >= len(block_images):
            top.axis("off")
            bottom.axis("off")
            continue
        drawn = _show(top, block_images[column])
        _show(bottom, block_recons[column])
        correct = int(block_labels[column]) == int(block_preds[column])
        # Class names may be long: one line each for the true and the predicted.
        separator = "\n" if class_names else ", "
        top.set_title(
            f"true {named(block_labels[column])}{separator}"
            f"pred {named(block_preds[column])}",
            fontsize=7 if class_names else 8, color=_RIGHT if correct else _WRONG,
        )
        if column == 0:
            top.set_ylabel("input", fontsize=9)
            bottom.set_ylabel("reconstruction", fontsize=9)
    return drawn


def plot_multimnist_separations(
    images, labels, reconstructions, predictions, path, columns=8, dpi=DPI, title=None
):
    """The paper's Figure 5: MultiMNIST inputs and their two-colour separations.

    Args:
        images: `[n, H, W, 1]` overlapping-digit inputs (the first
            `2 * columns` are drawn, in two blocks of two rows).
        labels: `[n, 2]` the two true classes.
        reconstructions: `[n, 2, H, W, 1]`: the decoder's reconstructions
            from the longest and the second-longest class capsule.
        predictions: `[n, 2]` those two classes (longest first).
        path: PNG file to write.
        columns: examples per row.
        dpi: resolution; the PNG is `FIGURE_SIZES["multimnist"] * dpi`.
        title: the figure's title.

    Returns:
        `path`.
    """
    count = min(len(images), 2 * columns)
    figure = _figure("multimnist")
    rows = 2 * math.ceil(count / columns)
    grid = figure.add_gridspec(
        max(rows, 2), columns, left=0.08, right=0.84, top=0.84, bottom=0.03,
        hspace=0.5, wspace=0.08,
    )
    for index in range(count):
        row, column = 2 * (index // columns), index % columns
        top = figure.add_subplot(grid[row, column])
        bottom = figure.add_subplot(grid[row + 1, column])
        _show(top, images[index])
        bottom.imshow(two_colour(reconstructions[index, 0], reconstructions[index, 1]),
                      interpolation="nearest")
        bottom.set_xticks([])
        bottom.set_yticks([])
        true = sorted(int(label) for label in labels[index])
        predicted = [int(label) for label in predictions[index]]
        correct = true == sorted(predicted)
        top.set_title(f"L: {true[0]}, {true[1]}", fontsize=8,
                      color=_RIGHT if correct else _WRONG)
        bottom.set_title(f"R: {predicted[0]}, {predicted[1]}", fontsize=8,
                         color=_RIGHT if correct else _WRONG)
        if column == 0:
            top.set_ylabel("input", fontsize=9)
            bottom.set_ylabel("separation", fontsize=9)
    figure.suptitle(title or "CapsNet on MultiMNIST: each digit reconstructed from its own "
                    "capsule", fontsize=12, y=0.985)
    figure.text(
        0.5, 0.905, "L: true labels; R: the two longest class capsules, each reconstructed "
        "by the decoder alone and drawn in its own colour over black (yellow: both)",
        ha="center", fontsize=9,
    )
    figure.legend(
        handles=[
            matplotlib.patches.Patch(color="red", label="longest capsule"),
            matplotlib.patches.Patch(color="lime", label="second longest"),
            matplotlib.patches.Patch(color="yellow", label="both"),
            matplotlib.patches.Patch(color=_WRONG, label="labels text: wrong pair"),
        ],
        loc="upper left", bbox_to_anchor=(0.845, 0.8), fontsize=8, frameon=False,
    )
    return _save(figure, path, dpi)



def plot_perturbations(
    grid,
    path,
    image=None,
    label=None,
    class_id=None,
    values=PERTURBATION_VALUES,
    dpi=DPI,
    model_name="CapsNet",
):
    """The 16 x 11 grid of the paper's Figure 4 for one digit.

    Args:
        grid: `[dim, num_values, H, W, C]` from `perturbation_grid`.
        path: PNG file to write.
        image: optional input image `[H, W, C]`, drawn beside the grid.
        label: its true class (or classes), for the title.
        class_id: the class whose capsule was perturbed.
        values: the perturbation of each column.
        dpi: resolution; the PNG is `FIGURE_SIZES["perturbations"] * dpi`.
        model_name: names the model in the title (e.g. `"CapsNet, 1 epoch"`).

    Returns:
        `path`.
    """
    grid = np.asarray(grid)
    rows, columns, height, width = grid.shape[:4]
    gap = 2
    figure = _figure("perturbations")
    axis = figure.add_axes([0.19, 0.07, 0.68, 0.8])
    cmap = matplotlib.colormaps["gray"].with_extremes(bad="white")
    drawn = axis.imshow(
        grid_mosaic(grid, gap), cmap=cmap, vmin=0.0, vmax=1.0, interpolation="nearest"
    )
    axis.set_xticks([column * (width + gap) + width / 2 - 0.5 for column in range(columns)])
    axis.set_xticklabels([f"{value:+.2f}" for value in values], fontsize=8)
    axis.set_yticks([row * (height + gap) + height / 2 - 0.5 for row in range(rows)])
    axis.set_yticklabels([str(row + 1) for row in range(rows)], fontsize=8)
    axis.tick_params(length=0)
    for side in axis.spines.values():
        side.set_visible(False)
    axis.set_xlabel("value added to the dimension")
    axis.set_ylabel("dimension of the class capsule")
    middle = list(np.round(values, 6)).index(0.0) if 0.0 in np.round(values, 6) else None
    if middle is not None:
        axis.add_patch(matplotlib.patches.Rectangle(
            (middle * (width + gap) - 1.5, -1.5), width + 2, rows * (height + gap) - gap + 2,
            fill=False, edgecolor="tab:orange", linewidth=1.5,
        ))
    if image is not None:
        inset = figure.add_axes([0.02, 0.7, 0.12, 0.1])
        _show(inset, image)
        inset.set_title("input", fontsize=9)
    digit = "" if label is None else f"a test image of a {int(label)}: "
    figure.suptitle(
        f"{model_name}: perturbing the class-{class_id} capsule ({digit}predicted "
        f"{class_id})\n"
        "each row: one of its dimensions, moved from -0.25 to +0.25; the decoder "
        "redraws the digit\n(orange: unperturbed reconstruction)",
        fontsize=10,
    )
    bar = figure.add_axes([0.9, 0.25, 0.02, 0.45])
    figure.colorbar(drawn, cax=bar, label="pixel intensity")
    return _save(figure, path, dpi)



def plot_training_curves(log, path, rates=None, reconstruction_weight=None, dpi=DPI):
    """Loss terms, train/test accuracy and learning rate over the epochs.

    Args:
        log: `read_training_log`'s dict (columns `epoch`, `loss`,
            `length_loss`, `reconstruction_loss`, `length_accuracy` and the
            `val_` versions; missing ones are left out).
        path: PNG file to write.
        rates: learning rate at the end of each epoch (`learning_rates`), or
            None to leave that panel empty.
        reconstruction_weight: the weight of the reconstruction loss in the
            total, to draw the weighted term on the same scale.
        dpi: resolution; the PNG is `FIGURE_SIZES["training_curves"] * dpi`.

    Returns:
        `path`.
    """
    epochs = np.asarray(log["epoch"]) + 1 if log else np.array([])
    figure = _figure("training_curves")
    loss_axis, accuracy_axis, rate_axis = figure.subplots(1, 3)
    figure.subplots_adjust(left=0.06, right=0.98, top=0.85, bottom=0.28, wspace=0.3)
    style = {"marker": "o", "markersize": 4}
    terms = [("loss", "total loss", "tab:blue"), ("length_loss", "margin loss", "tab:orange")]
    weight = reconstruction_weight if reconstruction_weight else 1.0
    recon_label = (
        f"{reconstruction_weight:g} x reconstruction loss" if reconstruction_weight
        else "reconstruction loss"
    )
    terms.append(("reconstruction_loss", recon_label, "tab:green"))
    for key, name, colour in terms:
        scale = weight if key == "reconstruction_loss" else 1.0
        if key in log:
            loss_axis.plot(
                epochs, scale * log[key], color=colour, label=f"{name} (train)", **style
            )
        if f"val_{key}" in log:
            loss_axis.plot(epochs, scale * log[f"val_{key}"], color=colour, linestyle="--",
                           label=f"{name} (test)", **style)
    loss_axis.set_yscale("log")
    loss_axis.set(title="Loss terms", xlabel="epoch", ylabel="loss (log scale)")
    # Models without a decoder log plain "accuracy" (a single output).
    prefix = "length_" if "length_accuracy" in log else ""
    for key, name, colour in (
        (f"{prefix}accuracy", "train", "tab:blue"), (f"val_{prefix}accuracy", "test", "tab:red")
    ):
        if key in log:
            accuracy_axis.plot(epochs, 100 * log[key], color=colour, label=name,
                               linestyle="--" if name == "test" else "-", **style)
    accuracy_axis.set(title="Accuracy", xlabel="epoch", ylabel="accuracy (%)")
    if rates is not None and len(rates):
        rate_axis.plot(epochs, rates, color="tab:purple", label="Adam learning rate", **style)
        rate_axis.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
    else:
        rate_axis.text(0.5, 0.5, "learning rate unknown\n(no config.json)", ha="center",
                       va="center", transform=rate_axis.transAxes)
    rate_axis.set(title="Learning rate at the end of each epoch", xlabel="epoch",
                  ylabel="learning rate")
    for axis in (loss_axis, accuracy_axis, rate_axis):
        if len(epochs):
            axis.set_xticks(epochs if len(epochs) <= 12 else axis.get_xticks())
            axis.set_xlim(epochs.min() - 0.5, epochs.max() + 0.5)
        axis.grid(alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            # Below the axes, where it hides no point.
            axis.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2,
                        frameon=False)
    figure.suptitle(
        "Training curves (train: mean over the epoch, solid; test: end of the epoch, dashed)"
        if len(epochs) else "Training curves (the log has no epochs yet)",
        fontsize=12,
    )
    return _save(figure, path, dpi)



def plot_confusion_matrix(matrix, path, class_names=None, dpi=DPI, title=None):
    """The confusion matrix with counts in the cells and a log colour scale.

    Args:
        matrix: `[classes, classes]` counts, row = true class.
        path: PNG file to write.
        class_names: tick labels (default 0, 1, ...).
        dpi: resolution; the PNG is `FIGURE_SIZES["confusion_matrix"] * dpi`.
        title: figure title (default: number of images and accuracy).

    Returns:
        `path`.
    """
    matrix = np.asarray(matrix)
    classes = len(matrix)
    names = class_names or [str(index) for index in range(classes)]
    total = int(matrix.sum())
    accuracy = 100.0 * np.trace(matrix) / max(total, 1)
    figure = _figure("confusion_matrix")
    axis = figure.add_axes([0.1, 0.1, 0.72, 0.78])
    shown = np.ma.masked_equal(matrix, 0)
    drawn = axis.imshow(
        shown, cmap="viridis", norm=matplotlib.colors.LogNorm(vmin=1, vmax=max(matrix.max(), 2))
    )
    for row in range(classes):
        for column in range(classes):
            if matrix[row, column]:
                bright = matrix[row, column] > math.sqrt(max(matrix.max(), 1))
                axis.text(column, row, str(matrix[row, column]), ha="center", va="center",
                          fontsize=8, color="black" if bright else "white")
    axis.set_facecolor("white")
    axis.set_xticks(range(classes), names)
    axis.set_yticks(range(classes), names)
    axis.set_xlabel("predicted class")
    axis.set_ylabel("true class")
    bar = figure.add_axes([0.85, 0.1, 0.03, 0.78])
    ticks = [tick for tick in (1, 3, 10, 30, 100, 300, 1000, 3000, 10000)
             if tick <= max(matrix.max(), 2)]
    colour_bar = figure.colorbar(
        drawn, cax=bar, label="number of test images (log scale; blank: 0)", ticks=ticks
    )
    colour_bar.ax.set_yticklabels([str(tick) for tick in ticks])
    colour_bar.ax.minorticks_off()
    axis.set_title(
        title or f"Confusion matrix on {total} test images (accuracy {accuracy:.2f}%)"
    )
    return _save(figure, path, dpi)



def plot_routing(routing, path, image=None, label=None, class_id=None, dpi=DPI):
    """Coupling coefficients to one class over the primary capsule grid, per iteration.

    The couplings `c_ij` of the primary capsules at each grid position to
    class `class_id` are averaged over the capsule types (32 for MNIST);
    beside them, the input and the mean length of the primary capsules at
    each position (where there is evidence to route).

    Args:
        routing: `routing_couplings`' dict.
        path: PNG file to write.
        image: the input image `[H, W, C]`.
        label: its true class (or classes), for the title.
        class_id: the class to draw (default: the predicted one).
        dpi: resolution; the PNG is `FIGURE_SIZES["routing"] * dpi`.

    Returns:
        `path`.
    """
    class_id = routing["prediction"] if class_id is None else class_id
    couplings = routing["couplings"][..., class_id].mean(axis=1)  # [iterations, rows, cols]
    iterations = len(couplings)
    types = routing["couplings"].shape[1]
    classes = routing["couplings"].shape[-1]
    figure = _figure("routing")
    grid = figure.add_gridspec(
        1, iterations + 2, left=0.03, right=0.9, top=0.74, bottom=0.14, wspace=0.5
    )
    axis = figure.add_subplot(grid[0, 0])
    if image is not None:
        _show(axis, image)
        if label is not None:
            label = ", ".join(str(int(value)) for value in np.ravel(label))
        axis.set_title("input" + ("" if label is None else f" (true {label})"), fontsize=10)
    else:
        axis.axis("off")
    axis = figure.add_subplot(grid[0, 1])
    activity = axis.imshow(routing["primary_lengths"].mean(axis=0), cmap="magma", vmin=0)
    axis.set_title("primary capsule length\n(mean over the types)", fontsize=10)
    axis.set(xlabel="column", ylabel="row")
    figure.colorbar(activity, ax=axis, fraction=0.046, pad=0.04)
    # Diverging colours around the uniform coupling 1/classes (white): red cells
    # send more than a uniform share of their votes to the class, blue less.
    uniform = 1.0 / classes
    spread = max(float(np.abs(couplings - uniform).max()), 1e-3)
    norm = matplotlib.colors.Normalize(vmin=uniform - spread, vmax=uniform + spread)
    drawn = None
    for iteration in range(iterations):
        axis = figure.add_subplot(grid[0, iteration + 2])
        drawn = axis.imshow(couplings[iteration], cmap="RdBu_r", norm=norm)
        axis.set_title(f"iteration {iteration + 1}", fontsize=10)
        axis.set(xlabel="column", ylabel="row" if iteration == 0 else None)
    bar = figure.add_axes([0.92, 0.14, 0.012, 0.6])
    figure.colorbar(drawn, cax=bar, label=f"coupling to class {class_id}\n(white: uniform, "
                    f"1/{classes})")
    figure.suptitle(
        f"Routing to the predicted class {class_id} (its capsule's length "
        f"{routing['lengths'][class_id]:.2f}): coupling coefficients c_ij of the primary "
        f"capsules, averaged over the {types} capsule types at each grid position\n"
        f"(iteration 1 is uniform, 1/{classes}; later iterations move votes towards the classes "
        "they agree with: red more, blue less than uniform)",
        fontsize=10,
    )
    return _save(figure, path, dpi)


# Published MNIST test errors (%) drawn as reference lines.
REFERENCE_ERRORS = {
    "paper, 3 routing iterations (0.25%)": 0.25,
    "CapsNet-Keras, 50 epochs (0.34%)": 0.34,
}


def test_accuracy_column(log):
    """The column of a CSV log holding the test accuracy of every epoch.

    `test_<accuracy>` when the run validated on a held-out split (the test
    set was then evaluated beside it), else `val_<accuracy>` (the official
    runs, whose validation data are the test set). None when neither exists.
    """
    for prefix in ("test_", "val_"):
        for name in ("length_accuracy", "accuracy"):
            if prefix + name in log:
                return prefix + name
    return None


# The x axes `plot_error_against_time` draws: (log column, axis label).
ERROR_X_AXES = {
    "hours": ("wall_seconds", "wall-clock time since the command started (hours)"),
    "epoch": ("epoch", "epoch"),
}


def error_curve(label, log, x_axis="hours"):
    """`(x, test error in %)` of one run's log, as `plot_error_against_time` draws it.

    `x_axis="hours"` takes `wall_seconds` / 3600 (the run's clock at the end
    of each epoch), `"epoch"` the 1-based epoch (the log's `epoch` column is
    0-based, as Keras's `CSVLogger` writes it).

    Raises:
        ValueError: an unknown `x_axis`, or a log without that column or
            without a test accuracy column.
    """
    if x_axis not in ERROR_X_AXES:
        raise ValueError(f"`x_axis` must be one of {sorted(ERROR_X_AXES)}. Received: {x_axis!r}")
    x_column = ERROR_X_AXES[x_axis][0]
    column = test_accuracy_column(log)
    if column is None or x_column not in log:
        raise ValueError(
            f"The log of {label!r} needs a `{x_column}` and a test accuracy column. "
            f"Received: columns {sorted(log)}"
        )
    x = np.asarray(log[x_column], dtype=np.float64)
    x = x / 3600.0 if x_axis == "hours" else x + 1.0
    return x, 100.0 * (1.0 - np.asarray(log[column], dtype=np.float64))


def plot_error_against_time(curves, path, references=None, dpi=DPI, title=None,
                            x_axis="hours"):
    """Test error against wall-clock time (or epochs) of one or more runs, with reference lines.

    Args:
        curves: `[(label, log), ...]`, each `log` a `read_training_log` dict
            with a `wall_seconds` column (the run's clock at the end of each
            epoch; an `epoch` column for `x_axis="epoch"`) and a test accuracy
            (`test_accuracy_column`).
        path: PNG file to write.
        references: `{label: error in %}` drawn as horizontal lines (None:
            `REFERENCE_ERRORS`).
        dpi: resolution; the PNG is `FIGURE_SIZES["error_against_time"] * dpi`.
        title: the figure's title (None: a default).
        x_axis: `"hours"` (wall clock) or `"epoch"`; see `error_curve`. Epochs
            compare runs whose clocks are not speed figures (shared cores).

    Returns:
        `path`.

    Raises:
        ValueError: see `error_curve`.
    """
    references = REFERENCE_ERRORS if references is None else references
    points = [(label, *error_curve(label, log, x_axis)) for label, log in curves]
    figure = _figure("error_against_time")
    axis = figure.subplots()
    figure.subplots_adjust(left=0.1, right=0.97, top=0.9, bottom=0.12)
    for label, x, error in points:
        axis.plot(x, error, marker="o", markersize=4, label=label)
    for index, (label, error) in enumerate(references.items()):
        axis.axhline(error, color="0.4", linestyle=("--", ":", "-.")[index % 3], linewidth=1,
                     label=label)
    axis.set_yscale("log")
    # Plain numbers on the log axis (0.3, 0.5, 1), minor ticks included:
    # matplotlib's default writes the minor ones as 6x10^-1.
    axis.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    axis.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    axis.set(xlabel=ERROR_X_AXES[x_axis][1], ylabel="MNIST test error (%, log scale)")
    axis.grid(alpha=0.3, which="both")
    axis.legend(fontsize=9)
    default = ("Test error against wall-clock time" if x_axis == "hours"
               else "Test error after each epoch")
    axis.set_title(title or f"{default} (whole 10,000-image test set)")
    return _save(figure, path, dpi)


# Panels of `plot_affnist_by_transformation`: (curve name, x-axis label).
_AFFNIST_PANELS = (
    ("shift", "shift of the digit, max(|dy|, |dx|) (px)"),
    ("rotation", "|rotation| (degrees)"),
    ("shear", "|shear|"),
    ("scale", "scale (mean of the two axes)"),
)


def plot_affnist_by_transformation(results, path, trained_shift=6, dpi=DPI, title=None):
    """affNIST-style accuracy against the size of each transformation, one line per model.

    Args:
        results: `[(label, results), ...]`, each `results` a dict that
            `capsnet_tf.paper.evaluate_affnist_protocol` returned (or its
            `results.json`), with `affnist_by_transformation`.
        path: PNG file to write.
        trained_shift: the training shift (px), shaded beyond it on the shift
            panel: what expanded MNIST never showed a model.
        dpi: resolution; the PNG is `FIGURE_SIZES["affnist_by_transformation"] * dpi`.
        title: the figure's title (None: one naming the number of images and
            the CPU of the first result).

    Returns:
        `path`.

    Raises:
        ValueError: a result without `affnist_by_transformation`.
    """
    for label, result in results:
        if "affnist_by_transformation" not in result:
            raise ValueError(
                f"{label!r} has no `affnist_by_transformation` (scored on the real affNIST, "
                "or by an older paper_eval.py). Received keys: "
                f"{sorted(result)}"
            )
    figure = _figure("affnist_by_transformation")
    axes = figure.subplots(1, len(_AFFNIST_PANELS), sharey=True)
    figure.subplots_adjust(left=0.06, right=0.99, top=0.86, bottom=0.3, wspace=0.08)
    for axis, (name, xlabel) in zip(axes, _AFFNIST_PANELS, strict=True):
        for label, result in results:
            curve = result["affnist_by_transformation"][name]
            edges = np.asarray(curve["edges"])
            centres = (edges[:-1] + edges[1:]) / 2
            accuracy = np.array([np.nan if a is None else 100 * a for a in curve["accuracy"]])
            axis.plot(centres, accuracy, marker="o", markersize=4,
                      label=f"{label} ({100 * result['affnist_accuracy']:.2f}% overall)")
        if name == "shift":
            axis.axvspan(trained_shift, edges[-1], color="0.9", zorder=0,
                         label=f"beyond training's {trained_shift} px")
        axis.set_xlabel(xlabel, fontsize=9)
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("affNIST-style accuracy (%)")
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=9)
    first = results[0][1]
    default = (
        "affNIST-style accuracy against each transformation's size "
        f"({first.get('affnist_examples', 0):,} images; {first.get('cpu', 'CPU not recorded')})"
    )
    figure.suptitle(title or default, fontsize=11)
    return _save(figure, path, dpi)
