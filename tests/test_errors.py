"""Bad input gets a clear answer: one test per row of the README's error table.

Each case runs the real script in a subprocess and checks that it exits with a
non-zero status and a short message naming the problem, prints no Python
traceback, and leaves the files already in the work (or export) directory
as they were. Flag errors are found before TensorFlow is imported, so they
take a second or two each.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import REPO_ROOT

MNIST = os.path.join(REPO_ROOT, "experiments", "mnist.py")
EXPORT = os.path.join(REPO_ROOT, "experiments", "export.py")
PREDICT = os.path.join(REPO_ROOT, "experiments", "predict.py")
# A tiny but real training run: 2 steps per epoch, 2 primary capsule types.
TINY = [
    "--train_examples=16", "--batch_size=8", "--eval_examples=8", "--primary_capsule_types=2",
    "--backup_every_steps=1", "--verbose=2",
]


def run(script, args, cwd=REPO_ROOT, env=None, timeout=300):
    return subprocess.run(
        [sys.executable, script, *args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=timeout,
    )


def snapshot(directory):
    """`{relative path: sha256}` of every file under `directory`.

    Not the training lock's `.lock`: it records who last opened the
    directory for training, the refused run included (`capsnet_tf.runlock`).
    """
    hashes = {}
    for root, _, names in os.walk(directory):
        for name in names:
            if name == ".lock" and root == str(directory):
                continue
            path = os.path.join(root, name)
            with open(path, "rb") as file:
                hashes[os.path.relpath(path, directory)] = hashlib.sha256(file.read()).hexdigest()
    return hashes


def error_paragraph(stderr):
    """The error message at the end of stderr: from `error:` or absl's `FATAL` on."""
    start = stderr.rfind("error:")
    assert start >= 0, f"no error message in:\n{stderr[-3000:]}"
    fatal = stderr.rfind("FATAL Flags parsing error:")
    if fatal >= 0 and fatal + len("FATAL Flags parsing ") == start:
        start = fatal
    return stderr[start:].strip()


def assert_clear_error(result, *words):
    """Non-zero exit, no traceback, and a one-paragraph message holding all `words`."""
    assert result.returncode != 0, result.stdout[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    message = error_paragraph(result.stderr)
    assert "\n\n" not in message and message.count("\n") <= 1, message
    for word in words:
        assert word in message, f"{word!r} not in:\n{message}"
    return message


def assert_unchanged(before, directory, exact=True):
    after = snapshot(directory)
    if exact:
        assert after == before
    else:  # files may have been added (e.g. TensorBoard event files), none changed
        assert {name: after.get(name) for name in before} == before


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A work directory as a finished run leaves it, of a small 28x28 CapsNet."""
    import keras

    from tests.test_export import make_workdir, mnist_sized_model

    keras.utils.set_random_seed(0)
    path = str(tmp_path_factory.mktemp("errors") / "run")
    make_workdir(path, mnist_sized_model(name="capsnet"))
    return path


@pytest.fixture()
def workdir(finished_run, tmp_path):
    path = str(tmp_path / "run")
    shutil.copytree(finished_run, path)
    return path


FLAG_ERRORS = {
    "unknown flag": (["--no_such_flag=1"], ["Unknown command line flag 'no_such_flag'"]),
    "negative batch size": (["--batch_size=-4"], ["--batch_size=-4", "not a positive integer"]),
    "zero routing iterations": (
        ["--routing_iterations=0"], ["--routing_iterations=0", "not a positive integer"]
    ),
    # --dataset takes any TFDS name too (test_image_folder_errors.py: one not prepared).
    "unknown dataset": (["--dataset=Image Net!"], ["dataset", "or a TFDS data set name"]),
    "unknown strategy": (["--strategy=warp_drive"], ["--strategy=warp_drive", "should be one of"]),
    "not a number": (["--epochs=three"], ["--epochs=three", "invalid literal"]),
    "missing flagfile": (
        ["--flagfile=no_such.flags"], ["Unable to open flagfile", "no_such.flags"]
    ),
    "unexpected argument": (["--epochs=1", "3"], ["unexpected argument", "'3'", "--name=value"]),
    "zero learning rate": (["--learning_rate=0"], ["learning_rate", "must be > 0"]),
}


# One case in the default tier; each is a script run of a few seconds.
QUICK_FLAG_ERRORS = ("unknown flag",)


@pytest.mark.parametrize("case", [
    pytest.param(case, marks=() if case in QUICK_FLAG_ERRORS else pytest.mark.large)
    for case in sorted(FLAG_ERRORS)
])
def test_bad_flags_are_refused_before_anything_is_touched(case, workdir):
    args, words = FLAG_ERRORS[case]
    before = snapshot(workdir)
    result = run(MNIST, [*args, f"--workdir={workdir}"])
    message = assert_clear_error(result, *words)
    assert "Pass --helpshort" in message or message.startswith("error:")
    assert_unchanged(before, workdir)


@pytest.mark.large
def test_work_directory_of_another_model_is_refused_unless_overwrite(tfds_data_dir, workdir):
    before = snapshot(workdir)
    # The saved run has 32 primary capsule types; this asks for 2.
    result = run(MNIST, [f"--workdir={workdir}", *TINY, "--epochs=1"])
    assert_clear_error(
        result, "holds a run with a different model", "primary_capsule_types: saved 32, "
        "requested 2", "--overwrite",
    )
    assert_unchanged(before, workdir)

    result = run(MNIST, [f"--workdir={workdir}", *TINY, "--epochs=1", "--overwrite"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.load(open(os.path.join(workdir, "config.json")))["primary_capsule_types"] == 2


@pytest.mark.large
def test_missing_tfds_data_set_names_the_directory(workdir, tmp_path):
    before = snapshot(workdir)
    empty = tmp_path / "empty_tfds"
    empty.mkdir()
    env = dict(os.environ, TFDS_DATA_DIR=str(empty))
    same_model = [arg for arg in TINY if not arg.startswith("--primary_capsule_types")]
    result = run(MNIST, [f"--workdir={workdir}", *same_model], env=env)
    assert_clear_error(result, "'mnist' was not found", str(empty), "TFDS_DATA_DIR")
    assert_unchanged(before, workdir)


@pytest.mark.large
def test_export_directory_holding_a_model_is_refused(workdir, tmp_path):
    version = tmp_path / "serving" / "1"
    version.mkdir(parents=True)
    (version / "saved_model.pb").write_bytes(b"a model")
    before = snapshot(tmp_path / "serving")
    result = run(EXPORT, [f"--workdir={workdir}", f"--export_dir={tmp_path / 'serving'}"])
    assert_clear_error(result, str(version), "already holds a SavedModel", "--overwrite")
    assert_unchanged(before, tmp_path / "serving")


@pytest.mark.large
def test_truncated_checkpoint_is_named_by_export(workdir, tmp_path):
    best = os.path.join(workdir, "checkpoints", "best.weights.h5")
    with open(best, "r+b") as file:
        file.truncate(4096)
    before = snapshot(workdir)
    result = run(EXPORT, [f"--workdir={workdir}", f"--export_dir={tmp_path / 'serving'}"])
    assert_clear_error(result, best, "truncated or corrupted", "--checkpoint=latest")
    assert_unchanged(before, workdir)
    assert not os.path.exists(tmp_path / "serving" / "1")


@pytest.mark.large
def test_export_of_a_directory_that_is_not_a_run(tmp_path):
    result = run(EXPORT, [f"--workdir={tmp_path / 'nothing'}",
                          f"--export_dir={tmp_path / 'serving'}"])
    assert_clear_error(result, "config.json does not exist", "work directory")


@pytest.mark.large
def test_predict_refuses_images_of_the_wrong_size(tmp_path):
    import keras
    from PIL import Image

    from capsnet_tf.export import export_saved_model
    from tests.test_model import small_model

    keras.utils.set_random_seed(0)
    export_saved_model(small_model(image_shape=(28, 28, 1)), str(tmp_path / "serving"),
                       verify=False)
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(tmp_path / "cifar.png")
    np.save(tmp_path / "wrong.npy", np.zeros((5, 28, 27), np.uint8))
    for name, words in (
        ("cifar.png", ["cifar.png: image is 32x32", "expected a 28x28 grayscale image"]),
        ("wrong.npy", ["wrong.npy: array of shape [5, 28, 27]", "[N, 28, 28]"]),
    ):
        before = snapshot(tmp_path / "serving")
        result = run(PREDICT, [f"--model={tmp_path / 'serving'}", name], cwd=tmp_path)
        assert_clear_error(result, *words)
        assert ": class " not in result.stdout
        assert_unchanged(before, tmp_path / "serving")
    result = run(PREDICT, [f"--model={tmp_path / 'nothing'}", "cifar.png"], cwd=tmp_path)
    assert_clear_error(result, "is neither a SavedModel directory", "experiments/export.py")


@pytest.mark.large
def test_divergence_and_unusable_backups_stop_with_a_clear_message(tfds_data_dir, tmp_path):
    """NaN loss: names the step, keeps the last good checkpoint; broken backups: refused."""
    from capsnet_tf.callbacks import load_weights, read_checkpoint_metadata
    from capsnet_tf.config import ExperimentConfig
    from capsnet_tf.training import build_model, compile_model

    workdir = str(tmp_path / "run")
    result = run(MNIST, [f"--workdir={workdir}", *TINY, "--epochs=1"])
    assert result.returncode == 0, result.stderr[-3000:]
    checkpoints = snapshot(os.path.join(workdir, "checkpoints"))
    good = read_checkpoint_metadata(os.path.join(workdir, "backup", "training_state.weights.h5"))
    assert (good["epoch"], good["global_step"]) == (1, 2)

    # A learning rate of 1e30 makes the weights, then the loss, overflow in epoch 2.
    result = run(MNIST, [f"--workdir={workdir}", *TINY, "--epochs=2", "--learning_rate=1e30"])
    assert_clear_error(result, "Training diverged", "epoch 2", "global step", "--learning_rate")
    message = error_paragraph(result.stderr)
    assert snapshot(os.path.join(workdir, "checkpoints")) == checkpoints
    assert not os.path.exists(os.path.join(workdir, "results.json")) or json.load(
        open(os.path.join(workdir, "results.json")))["epochs_run_this_call"] == 1
    state = os.path.join(workdir, "backup", "training_state.weights.h5")
    config = ExperimentConfig(primary_capsule_types=2)
    model = compile_model(build_model(config, (28, 28, 1), 10), config)
    saved = load_weights(model, state, include_optimizer=True)
    assert saved["global_step"] >= 2 and f"global step {saved['global_step']}" in message
    assert all(np.all(np.isfinite(w)) for w in model.get_weights())

    # Every backup broken: refused, nothing changed; moving them away is the advice.
    backup = os.path.join(workdir, "backup")
    for name in os.listdir(backup):
        with open(os.path.join(backup, name), "r+b") as file:
            file.truncate(2048)
    before = snapshot(workdir)
    result = run(MNIST, [f"--workdir={workdir}", *TINY, "--epochs=2", "--learning_rate=1e30"])
    assert_clear_error(result, "every training backup is truncated or corrupted", state,
                       "Move these files away")
    assert_unchanged(before, workdir, exact=False)
