r"""Draws test error against wall-clock time from the CSV logs of training runs.

Usage, from the repository root:

    python experiments/plot_curves.py \
        --run="fast recipe, seed 0=benchmarks/convergence/fast_seed0/training_log.csv" \
        --run="official recipe=benchmarks/convergence/official/training_log.csv" \
        --output=docs/figures/error_against_time.png
    python experiments/plot_curves.py --x_axis=epoch --run=... \
        --output=docs/figures/error_against_epoch.png

Each `--run` is `LABEL=PATH` (a `training_log.csv` that
`experiments/mnist.py` wrote, with its `wall_seconds` column). The
paper's and CapsNet-Keras's test errors (0.25 and 0.34 percent) are drawn
as reference lines.
"""

import os
import sys

from absl import app, flags

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))  # the repository, when not installed

_RUNS = flags.DEFINE_multi_string(
    "run", None, "LABEL=PATH of a run's training_log.csv; repeat for several runs."
)
_OUTPUT = flags.DEFINE_string(
    "output", "docs/figures/error_against_time.png", "The PNG file to write."
)
_X_AXIS = flags.DEFINE_enum(
    "x_axis", "hours", ["hours", "epoch"],
    "Wall-clock hours, or epochs (for runs whose clocks are not speed figures).",
)
_TITLE = flags.DEFINE_string("title", None, "The figure's title (default: a generic one).")
flags.mark_flag_as_required("run")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    from capsnet_tf.figures import labelled_path, plot_error_against_time, read_training_log

    try:
        runs = [labelled_path(text, "run") for text in _RUNS.value]
    except ValueError as error:
        raise app.UsageError(str(error)) from error
    curves = [(label, read_training_log(path)) for label, path in runs]
    try:
        path = plot_error_against_time(curves, _OUTPUT.value, title=_TITLE.value,
                                       x_axis=_X_AXIS.value)
    except ValueError as error:
        sys.exit(f"error: {error}")
    print(path)


if __name__ == "__main__":
    app.run(main)
