"""Bad image folders get one clear line each, before any training starts.

Every case runs the real script (`experiments/mnist.py --image_folder=...`)
in a subprocess; they run concurrently (each spends most of its time
importing TensorFlow) and each test checks one: a non-zero exit, no
traceback, a one-line message holding the words that say what is wrong, and
no checkpoint written.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from tests.conftest import REPO_ROOT
from tests.image_folder_helpers import write_folder
from tests.test_errors import assert_clear_error

# A dozen concurrent script runs, each importing TensorFlow: over a minute.
pytestmark = pytest.mark.large

MNIST = os.path.join(REPO_ROOT, "experiments", "mnist.py")
TINY = ["--epochs=1", "--steps_per_epoch=1", "--batch_size=4", "--primary_capsule_types=2"]


def _cases(root):
    """`{case: (args, words, env)}`; makes the folders under `root`."""
    cases = {}
    missing = os.path.join(root, "no_such_folder")
    cases["folder does not exist"] = ([f"--image_folder={missing}"], [missing, "does not exist"])

    single = write_folder(os.path.join(root, "single"), classes=("cat",))
    cases["a single class"] = (
        [f"--image_folder={single}"], ["needs at least 2 class sub-folders", "found 1 (cat)"]
    )

    empty = write_folder(os.path.join(root, "empty"))
    os.makedirs(os.path.join(empty, "dog"))
    cases["an empty class folder"] = (
        [f"--image_folder={empty}"], [os.path.join(empty, "dog"), "holds no image files"]
    )

    broken = write_folder(os.path.join(root, "broken"))
    bad_file = os.path.join(broken, "cross", "notes.png")
    with open(bad_file, "w") as file:
        file.write("not an image at all")
    cases["a file that is not an image"] = (
        [f"--image_folder={broken}"], [bad_file, "is not a readable image"]
    )

    sizes = write_folder(os.path.join(root, "sizes"))
    Image.fromarray(np.zeros((24, 30, 3), np.uint8)).save(os.path.join(sizes, "circle", "z.png"))
    cases["images of different sizes"] = (
        [f"--image_folder={sizes}"], ["differ in size", "30x24", "--image_size"]
    )

    half = os.path.join(root, "half")
    write_folder(os.path.join(half, "train"))
    cases["train/ without test/"] = (
        [f"--image_folder={half}"], ["has a train/ folder but no test/ folder", "give both"]
    )

    large = write_folder(os.path.join(root, "large"), size=128, per_class=2, grayscale_every=0)
    cases["a 128x128 step that cannot fit"] = (
        [f"--image_folder={large}", "--batch_size=128"],
        ["needs about", "GiB", "is available", "--stem_layers", "--batch_size"],
    )
    cases["not a prepared TFDS data set"] = (
        ["--dataset=kmnist"], ["'kmnist' was not found", "tfds build kmnist", "TFDS_DATA_DIR"]
    )
    return cases


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Every case's `(result, workdir)`, run concurrently."""
    root = str(tmp_path_factory.mktemp("folders"))
    cases = _cases(root)
    running = {}
    for name, (args, _) in cases.items():
        workdir = os.path.join(root, "runs", name.replace(" ", "_"))
        running[name] = (subprocess.Popen(
            # The case's own flags come last and override TINY's.
            [sys.executable, MNIST, "--flagfile=mnist.flags", *TINY, *args,
             f"--workdir={workdir}"],
            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ), workdir)
    results = {}
    for name, (process, workdir) in running.items():
        stdout, stderr = process.communicate(timeout=300)
        results[name] = (subprocess.CompletedProcess(process.args, process.returncode, stdout,
                                                     stderr), workdir)
    return cases, results


CASES = (
    "folder does not exist",
    "a single class",
    "an empty class folder",
    "a file that is not an image",
    "images of different sizes",
    "train/ without test/",
    "a 128x128 step that cannot fit",
    "not a prepared TFDS data set",
)


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_refused_with_one_line(case, outcomes):
    cases, results = outcomes
    result, workdir = results[case]
    assert_clear_error(result, *cases[case][1])
    assert not os.path.exists(os.path.join(workdir, "checkpoints"))
    assert "Epoch 1" not in result.stdout
