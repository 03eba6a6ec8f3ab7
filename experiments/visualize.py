r"""Draws the figures of a trained CapsNet work directory as PNG files.

Usage, from the repository root or from `experiments/`:

    python experiments/visualize.py --workdir=/tmp/capsnet_mnist
    python experiments/visualize.py --workdir=/tmp/capsnet_mnist --eval_examples=1000 \
        --figures=reconstructions,perturbations --perturbation_digits=3,7

Writes into `--output_dir` (default `WORKDIR/figures/`):

- `reconstructions.png`: test inputs over their reconstructions, true and
  predicted labels, and a row of misclassified examples;
- `perturbations_<digit>.png`: the paper's Figure 4, each of the 16
  dimensions of the predicted class capsule moved from -0.25 to +0.25;
- `training_curves.png`: loss terms, train/test accuracy and the learning
  rate, from `training_log.csv` and `config.json`;
- `confusion_matrix.png`: on the first `--eval_examples` test images;
- `routing.png`: the coupling coefficients of one test image over the 6x6
  primary capsule grid, iteration by iteration (mean over the 32 types).

With `--saved_model=<export_dir>/<version>` (written by experiments/export.py)
the reconstruction, perturbation and confusion figures come from the exported
SavedModel's `serving_float` and `decode` signatures instead of the checkpoint.

Runs headless (matplotlib's Agg backend). The confusion matrix classifies the
whole MNIST test set (about 40 s at 250 images/s on a CPU; `--eval_examples`
limits it); without it, reconstructions and perturbations classify the first
1000 test images only.
- `multimnist.png` (MultiMNIST work directories, instead of the one-digit
  reconstructions, perturbations and confusion matrix): the paper's Figure 5,
  each of the two longest capsules reconstructed alone, in red and green.
"""

import os
import sys
import time

from absl import app, flags

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))  # the repository, when not installed

# oneDNN's CPU kernels on AVX2-only CPUs too, where TensorFlow leaves them off
# (docs/performance.md). Read once, when TensorFlow is first imported; =0 keeps them off.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

_FIGURES = (
    "reconstructions",
    "perturbations",
    "training_curves",
    "confusion_matrix",
    "routing",
    "multimnist",
)

_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Work directory of a finished run (experiments/mnist.py --workdir)."
)
_OUTPUT_DIR = flags.DEFINE_string(
    "output_dir", None, "Directory for the PNG files (default: WORKDIR/figures)."
)
_CHECKPOINT = flags.DEFINE_enum(
    "checkpoint", "best", ["best", "latest"], "Which checkpoint of the work directory to draw."
)
_FIGURES_FLAG = flags.DEFINE_list(
    "figures", list(_FIGURES), f"Comma-separated figures to make, of: {', '.join(_FIGURES)}."
)
_EVAL_EXAMPLES = flags.DEFINE_integer(
    "eval_examples", None,
    "Classify only the first N test images (confusion matrix, misclassified examples); "
    "default: the whole test set, or the first 1000 when no confusion matrix is drawn.",
    lower_bound=1,
)
_RECONSTRUCTION_EXAMPLES = flags.DEFINE_integer(
    "reconstruction_examples", 16, "Test images in the reconstruction grid.",
    lower_bound=1, upper_bound=16,
)
_PERTURBATION_DIGITS = flags.DEFINE_list(
    "perturbation_digits", [str(digit) for digit in range(10)],
    "Digits (classes) that get a perturbation figure each.",
)
_ROUTING_EXAMPLE = flags.DEFINE_integer(
    "routing_example", 0, "Index of the test image whose routing is drawn.", lower_bound=0
)
_DATA_DIR = flags.DEFINE_string(
    "data_dir", None, "TFDS data directory (default: the run's, $TFDS_DATA_DIR or ~/...)."
)
_SAVED_MODEL = flags.DEFINE_string(
    "saved_model", None,
    "Optional SavedModel exported from this run (experiments/export.py: <export_dir>/<version>); "
    "the reconstruction, perturbation and confusion figures then use its serving_float and "
    "decode signatures. Routing and training curves still come from --workdir.",
)
_DPI = flags.DEFINE_integer(
    "dpi", 100, "Resolution of the PNG files, dots per inch.", lower_bound=30, upper_bound=400
)

flags.mark_flag_as_required("workdir")
flags.register_validator(
    "figures", lambda names: bool(names) and set(names) <= set(_FIGURES),
    message=f"--figures must name some of: {', '.join(_FIGURES)}.",
)
flags.register_validator(
    "perturbation_digits", lambda digits: all(digit.isdigit() for digit in digits),
    message="--perturbation_digits must be non-negative integers, e.g. 3,7.",
)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    figures = _FIGURES_FLAG.value
    digits = [int(digit) for digit in _PERTURBATION_DIGITS.value]

    from capsnet_tf.data import DatasetNotFoundError
    from capsnet_tf.figures import write_figures

    start = time.perf_counter()
    try:
        written = write_figures(
            _WORKDIR.value,
            output_dir=_OUTPUT_DIR.value,
            figures=figures,
            checkpoint=_CHECKPOINT.value,
            eval_examples=_EVAL_EXAMPLES.value,
            reconstruction_examples=_RECONSTRUCTION_EXAMPLES.value,
            perturbation_digits=digits,
            routing_example=_ROUTING_EXAMPLE.value,
            data_dir=_DATA_DIR.value,
            dpi=_DPI.value,
            saved_model=_SAVED_MODEL.value,
        )
    except (DatasetNotFoundError, FileNotFoundError, ValueError) as error:
        sys.exit(f"error: {error}")
    for path in written.values():
        print(path)
    print(f"Wrote {len(written)} figures in {time.perf_counter() - start:.1f} s.")


if __name__ == "__main__":
    app.run(main)
