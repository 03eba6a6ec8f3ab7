r"""Scores a trained run by the paper's protocol beyond MNIST and writes the evidence.

Usage, from the repository root:

    # Section 5.2: an expanded-MNIST run (experiments/paper_affnist.flags,
    # CapsNet or --model=pooled_cnn) on expanded MNIST, 320,000 affNIST-style
    # images (32 per MNIST test digit) and the centred control.
    python experiments/paper_eval.py --workdir=RUN --output_dir=benchmarks/paper/NAME

    # Section 6: a MultiMNIST run (experiments/paper_multi_mnist.flags) on
    # 100,000 seeded test pairs (10 per MNIST test digit), the paper's metric.
    python experiments/paper_eval.py --workdir=RUN --output_dir=benchmarks/paper/NAME

The protocol follows the run's data set. `--output_dir` receives
`results.json` (every score with the number of examples it was computed on,
the model, its parameter count, the training budget and the CPU) and copies
of the run's `config.json`, `training_log.csv` and `time_to_target.json`:
small text files, never weights.
"""

import json
import os
import shutil
import sys
import time

from absl import app, flags

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))  # the repository, when not installed

# oneDNN's CPU kernels on AVX2-only CPUs too, where TensorFlow leaves them off
# (docs/performance.md). Read once, when TensorFlow is first imported; =0 keeps them off.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Training work directory of an expanded_mnist or multi_mnist run.",
    required=True,
)
_OUTPUT_DIR = flags.DEFINE_string(
    "output_dir", None, "Where results.json and the run's logs go (e.g. benchmarks/paper/NAME).",
    required=True,
)
_COPIES = flags.DEFINE_integer(
    "copies", 32, "affNIST-style transformations of each MNIST test digit (affNIST: 32).",
    lower_bound=1,
)
_AFFNIST_SEED = flags.DEFINE_integer(
    "affnist_seed", 0, "Seed of the affNIST-style set: keep it equal for models compared."
)
_AFFNIST_PATH = flags.DEFINE_string(
    "affnist_path", None, "The real affNIST test data (test.mat or .npz) instead."
)
_PAIRS_PER_IMAGE = flags.DEFINE_integer(
    "pairs_per_image", 10, "MultiMNIST test pairs per MNIST test digit.", lower_bound=1
)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 250, "Evaluation batch size.", lower_bound=1)
_TAKE = flags.DEFINE_integer(
    "take", None, "Score only the first N examples of each set (smoke runs; the protocol: all).",
    lower_bound=1,
)
_PRECISION = flags.DEFINE_enum(
    "precision", "trained", ["trained", "float32"],
    "trained: score in the precision the run trained in, in which its stop was measured; "
    "float32.",
)
_CHECKPOINT = flags.DEFINE_enum(
    "checkpoint", "latest", ["latest", "best"],
    "latest: the model at the run's stop (the protocol's); best: its best epoch.",
)

_RUN_FILES = ("config.json", "training_log.csv", "time_to_target.json")


def main(argv):
    del argv
    from capsnet_tf import cpu, paper
    from capsnet_tf.workdir import read_run_files

    saved, _ = read_run_files(_WORKDIR.value)
    start = time.time()
    if saved["dataset"] == "expanded_mnist":
        result = paper.evaluate_affnist_protocol(
            _WORKDIR.value, copies=_COPIES.value, batch_size=_BATCH_SIZE.value,
            seed=_AFFNIST_SEED.value, checkpoint=_CHECKPOINT.value,
            affnist_path=_AFFNIST_PATH.value, take=_TAKE.value, precision=_PRECISION.value,
        )
    elif saved["dataset"] == "multi_mnist":
        result = paper.evaluate_multimnist_protocol(
            _WORKDIR.value, pairs_per_image=_PAIRS_PER_IMAGE.value,
            batch_size=_BATCH_SIZE.value, checkpoint=_CHECKPOINT.value, take=_TAKE.value,
            precision=_PRECISION.value,
        )
    else:
        sys.exit(
            f"error: {_WORKDIR.value} trained on {saved['dataset']!r}; the paper's protocols "
            "here are for expanded_mnist (affNIST) and multi_mnist runs."
        )
    result["checkpoint"] = _CHECKPOINT.value
    result["evaluation_seconds"] = round(time.time() - start, 1)
    family_model = cpu.family_and_model()
    result["cpu"] = cpu.model_name() + (
        " (family {}, model {})".format(*family_model) if family_model else ""
    )
    os.makedirs(_OUTPUT_DIR.value, exist_ok=True)
    for name in _RUN_FILES:
        source = os.path.join(_WORKDIR.value, name)
        if os.path.exists(source):
            shutil.copyfile(source, os.path.join(_OUTPUT_DIR.value, name))
    with open(os.path.join(_OUTPUT_DIR.value, "results.json"), "w") as file:
        json.dump(result, file, indent=2, sort_keys=True)
    shown = {k: v for k, v in result.items() if k.endswith(("accuracy", "error", "examples"))}
    print(json.dumps(shown, indent=2, sort_keys=True))
    print(f"Wrote {os.path.join(_OUTPUT_DIR.value, 'results.json')}")


if __name__ == "__main__":
    app.run(main)
