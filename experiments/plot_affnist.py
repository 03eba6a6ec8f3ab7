r"""Draws affNIST-style accuracy against the size of each transformation, one line per model.

Usage, from the repository root, after `experiments/paper_eval.py` has scored
each run:

    python experiments/plot_affnist.py \
        --result="CapsNet=benchmarks/paper/affnist_capsnet/results.json" \
        --result="CNN=benchmarks/paper/affnist_pooled_cnn/results.json" \
        --output=docs/figures/affnist_by_transformation.png

Each `--result` is `LABEL=PATH` of a `results.json` with
`affnist_by_transformation` (the generated affNIST-style set). The title
names the CPU the runs were scored on, from the first result.
"""

import json
import os
import sys

from absl import app, flags

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))  # the repository, when not installed

_RESULTS = flags.DEFINE_multi_string(
    "result", None, "LABEL=PATH of a paper_eval.py results.json; repeat for several models."
)
_OUTPUT = flags.DEFINE_string(
    "output", "docs/figures/affnist_by_transformation.png", "The PNG file to write."
)
flags.mark_flag_as_required("result")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    from capsnet_tf.figures import labelled_path, plot_affnist_by_transformation

    try:
        paths = [labelled_path(text, "result") for text in _RESULTS.value]
    except ValueError as error:
        raise app.UsageError(str(error)) from error
    results = []
    for label, path in paths:
        with open(path) as file:
            results.append((label, json.load(file)))
    try:
        path = plot_affnist_by_transformation(results, _OUTPUT.value)
    except ValueError as error:
        sys.exit(f"error: {error}")
    print(path)


if __name__ == "__main__":
    app.run(main)
