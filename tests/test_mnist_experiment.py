"""End-to-end: experiments/mnist.py on a few steps of the real MNIST copy."""

import functools
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from absl import flags
from absl.testing import flagsaver

from tests.conftest import REPO_ROOT

SCRIPT = os.path.join(REPO_ROOT, "experiments", "mnist.py")
TINY = [
    "--steps_per_epoch=2",
    "--batch_size=8",
    "--eval_examples=16",
    "--train_examples=64",
    "--verbose=2",
]


@functools.cache  # absl flags can be defined once per process
def load_script():
    spec = importlib.util.spec_from_file_location("mnist_experiment", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not flags.FLAGS.is_parsed():
        flags.FLAGS(["mnist"])
    return module


def run_script(args, cwd=REPO_ROOT):
    return subprocess.run(
        [sys.executable, os.path.relpath(SCRIPT, cwd), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_main_writes_config_checkpoints_logs_and_resumes(tfds_data_dir, tmp_path):
    script = load_script()
    workdir = str(tmp_path / "run")
    with flagsaver.flagsaver(
        workdir=workdir, epochs=2, steps_per_epoch=2, batch_size=8, eval_examples=16,
        train_examples=64, verbose="0", seed=3,
    ):
        script.main(["mnist"])
        for name in ("config.json", "results.json", "training_log.csv",
                     "checkpoints/best.weights.h5", "checkpoints/latest.weights.h5"):
            assert os.path.exists(os.path.join(workdir, name)), name
        assert os.listdir(os.path.join(workdir, "logs"))
        config = json.load(open(os.path.join(workdir, "config.json")))
        assert config["epochs"] == 2 and config["seed"] == 3 and config["shift"] == 2
        results = json.load(open(os.path.join(workdir, "results.json")))
        assert results["epochs_run_this_call"] == 2
        assert np.isfinite(results["test_loss"])
        assert 0.0 <= results["test_accuracy"] <= 1.0
        losses = results["history"]["loss"]
        assert all(np.isfinite(losses))
        best_before = os.path.getmtime(os.path.join(workdir, "checkpoints/best.weights.h5"))

        # The same command again finds the run finished: it trains nothing.
        script.main(["mnist"])
        results = json.load(open(os.path.join(workdir, "results.json")))
        assert results["epochs_run_this_call"] == 0
        assert os.path.getmtime(os.path.join(workdir, "checkpoints/best.weights.h5")) == best_before

    # More epochs continue from epoch 2, not from scratch.
    with flagsaver.flagsaver(
        workdir=workdir, epochs=3, steps_per_epoch=2, batch_size=8, eval_examples=16,
        train_examples=64, verbose="0", seed=3,
    ):
        script.main(["mnist"])
    rows = open(os.path.join(workdir, "training_log.csv")).read().strip().splitlines()
    assert [row.split(",")[0] for row in rows[1:]] == ["0", "1", "2"]


def test_incompatible_workdir_is_refused_without_damage(tfds_data_dir, tmp_path):
    script = load_script()
    workdir = tmp_path / "run"
    workdir.mkdir()
    saved = {"dataset": "mnist", "routing_iterations": 1}
    (workdir / "config.json").write_text(json.dumps(saved))
    with flagsaver.flagsaver(workdir=str(workdir), routing_iterations=3):
        with pytest.raises(SystemExit, match="different model.*routing_iterations"):
            script.main(["mnist"])
    assert json.loads((workdir / "config.json").read_text()) == saved


@pytest.mark.large
def test_flagfile_command_from_repository_root_and_experiments(tfds_data_dir, tmp_path):
    for cwd, name in ((REPO_ROOT, "root"), (os.path.join(REPO_ROOT, "experiments"), "exp")):
        workdir = str(tmp_path / name)
        result = run_script(
            ["--flagfile=mnist.flags", "--epochs=1", f"--workdir={workdir}", *TINY], cwd=cwd
        )
        assert result.returncode == 0, result.stderr[-3000:]
        assert "Test accuracy:" in result.stdout and "test error:" in result.stdout
        config = json.load(open(os.path.join(workdir, "config.json")))
        # Values from the flagfile, overridden by the later flags.
        assert config["learning_rate"] == 0.001 and config["decay_steps"] == 2000
        assert config["batch_size"] == 8 and config["initializer"] == "keras"


@pytest.mark.large
def test_bad_flag_values_and_missing_data_exit_with_a_clear_message(tmp_path):
    result = run_script(["--batch_size=-4", f"--workdir={tmp_path}"])
    assert result.returncode != 0 and "batch_size" in result.stderr
    result = run_script(["--flagfile=does_not_exist.flags"])
    assert result.returncode != 0 and "does_not_exist.flags" in result.stderr
    env = dict(os.environ, TFDS_DATA_DIR=str(tmp_path / "empty"))
    result = subprocess.run(
        [sys.executable, SCRIPT, f"--workdir={tmp_path / 'run'}", *TINY],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, env=env,
    )
    assert result.returncode != 0
    assert "'mnist' was not found" in result.stderr and "TFDS_DATA_DIR" in result.stderr
    assert "Traceback" not in result.stderr


def test_load_trained_model_restores_weights_and_reports_bad_files(tfds_data_dir, tmp_path):
    from capsnet_tf.config import ExperimentConfig
    from capsnet_tf.training import train_and_evaluate
    from capsnet_tf.workdir import load_trained_model

    workdir = str(tmp_path / "run")
    config = ExperimentConfig(
        epochs=1, steps_per_epoch=2, batch_size=8, eval_examples=16, train_examples=64, verbose=0
    )
    results = train_and_evaluate(config, workdir)
    model, loaded_config = load_trained_model(workdir)
    assert loaded_config == config
    from capsnet_tf.data import make_dataset
    from capsnet_tf.training import compile_model

    test_data, _ = make_dataset("mnist", "test", 8, training=False, take=16)
    metrics = compile_model(model, config).evaluate(test_data, return_dict=True, verbose=0)
    assert metrics["length_accuracy"] == pytest.approx(results["test_accuracy"])

    best = os.path.join(workdir, "checkpoints", "best.weights.h5")
    with open(best, "r+b") as file:
        file.truncate(1000)
    with pytest.raises(ValueError, match="best.weights.h5"):
        load_trained_model(workdir)
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_trained_model(str(tmp_path / "nothing"))
