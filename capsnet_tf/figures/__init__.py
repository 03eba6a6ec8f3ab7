"""Figures of a trained CapsNet: reconstructions, perturbations, curves, routing.

Free of flags, so that a notebook can call them too:

- `arrays`: functions returning arrays (`predict`, `perturbation_grid`,
  `confusion_matrix`), through the one adapter of a trained CapsNet
  (`capsnet_tf.trained`); it also imports what moved below the figures
  (`load_test_images` from `capsnet_tf.data.samples`, `reconstruction_mosaic`
  and `two_colour` from `capsnet_tf.mosaics`); this package exports
  `routing_couplings` from `capsnet_tf.routing` beside the figures;
- `history`: a run's CSV log and learning rates (`read_training_log`,
  `learning_rates`), and figure scripts' `LABEL=PATH` arguments (`labelled_path`);
- `plots`: functions writing one PNG each with matplotlib
  (`plot_reconstructions`, `plot_perturbations`, `plot_multimnist_separations`,
  `plot_training_curves`, `plot_confusion_matrix`, `plot_routing`,
  `plot_error_against_time`, `plot_affnist_by_transformation`);
- `report`: `write_figures`, which makes all of them for a work directory of
  `capsnet_tf.training.train_and_evaluate` (what `experiments/visualize.py`
  calls);
- `style`: the fixed sizes (`FIGURE_SIZES`, `DPI`) and drawing helpers.

The TensorBoard callback `ReconstructionImages` lives with the callbacks
(`capsnet_tf.callbacks.images`).

Reference:
    Sabour et al., 2017, arXiv:1710.09829, figures 3 (reconstructions), 4
    (dimension perturbations) and 5 (MultiMNIST separations).
"""

from capsnet_tf.data.samples import load_test_images
from capsnet_tf.figures.arrays import confusion_matrix, perturbation_grid, predict
from capsnet_tf.figures.history import labelled_path, learning_rates, read_training_log
from capsnet_tf.figures.plots import (
    plot_affnist_by_transformation,
    plot_confusion_matrix,
    plot_error_against_time,
    plot_multimnist_separations,
    plot_perturbations,
    plot_reconstructions,
    plot_routing,
    plot_training_curves,
)
from capsnet_tf.figures.report import write_figures
from capsnet_tf.figures.style import (
    DPI,
    FIGURE_NAMES,
    FIGURE_SIZES,
    PERTURBATION_VALUES,
    RECONSTRUCTION_POOL,
)
from capsnet_tf.mosaics import reconstruction_mosaic, two_colour
from capsnet_tf.routing import routing_couplings

__all__ = [
    "DPI",
    "FIGURE_NAMES",
    "FIGURE_SIZES",
    "PERTURBATION_VALUES",
    "RECONSTRUCTION_POOL",
    "confusion_matrix",
    "labelled_path",
    "learning_rates",
    "load_test_images",
    "perturbation_grid",
    "plot_affnist_by_transformation",
    "plot_confusion_matrix",
    "plot_error_against_time",
    "plot_multimnist_separations",
    "plot_perturbations",
    "plot_reconstructions",
    "plot_routing",
    "plot_training_curves",
    "predict",
    "read_training_log",
    "reconstruction_mosaic",
    "routing_couplings",
    "two_colour",
    "write_figures",
]
