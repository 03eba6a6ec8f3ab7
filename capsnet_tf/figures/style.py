"""Sizes, resolution and drawing helpers shared by every figure.

Every figure has a fixed size in inches (`FIGURE_SIZES`) and is saved at a
given `dpi` without tight cropping, so a PNG is exactly
`FIGURE_SIZES[name] * dpi` pixels. Figures are drawn on matplotlib's Agg
canvas without pyplot: no display is needed, and pyplot's backend (a
notebook's inline plots) is left as it is.
"""

import os

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

__all__ = [
    "DPI",
    "FIGURE_NAMES",
    "FIGURE_SIZES",
    "PERTURBATION_VALUES",
    "RECONSTRUCTION_POOL",
]


DPI = 100


# (width, height) in inches of every figure; the PNG is this times the dpi.
FIGURE_SIZES = {
    "reconstructions": (10.0, 8.0),
    "perturbations": (8.0, 9.5),
    "training_curves": (15.0, 5.0),
    "confusion_matrix": (8.0, 7.0),
    "routing": (15.0, 3.6),
    "multimnist": (12.0, 6.0),
    "error_against_time": (9.0, 5.5),
    "affnist_by_transformation": (15.0, 4.5),
}


FIGURE_NAMES = tuple(FIGURE_SIZES)


# The paper's Figure 4: -0.25 to 0.25 in steps of 0.05 (11 values).
PERTURBATION_VALUES = np.round(np.linspace(-0.25, 0.25, 11), 2)


# Test images classified for the reconstruction and perturbation figures when
# no confusion matrix is asked for (whose whole test set would serve as well).
RECONSTRUCTION_POOL = 1000


_WRONG = "tab:red"


_RIGHT = "black"



def _figure(name):
    """A figure drawn by the Agg canvas directly: headless, and it leaves
    pyplot's backend (a notebook's inline plots) untouched."""
    figure = Figure(figsize=FIGURE_SIZES[name])
    FigureCanvasAgg(figure)
    return figure



def _save(figure, path, dpi):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    figure.savefig(path, dpi=dpi)  # no bbox_inches: the size stays FIGURE_SIZES * dpi
    return path



def _show(axis, image, **kwargs):
    """Draws a [H, W, 1] or [H, W, 3] image on an axis without ticks."""
    image = np.asarray(image)
    if image.ndim == 3 and image.shape[-1] == 1:
        image = image[..., 0]
    drawn = axis.imshow(image, cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest",
                        **kwargs)
    axis.set_xticks([])
    axis.set_yticks([])
    return drawn
