"""Distribution (issue 6): strategy options, replicas agreeing, two workers on 127.0.0.1.

Strategies that need TensorFlow not yet started (several CPU devices,
MultiWorkerMirroredStrategy) run in subprocesses: this file itself, run as
`python -m tests.test_distribute mirrored OUT.npz`, or experiments/mnist.py.
"""

import json
import os
import socket
import subprocess
import sys
import time
import types

import numpy as np
import pytest

from tests.conftest import REPO_ROOT

SCRIPT = os.path.join(REPO_ROOT, "experiments", "mnist.py")
TINY_RUN = [
    "--train_examples=64",
    "--eval_examples=32",
    "--batch_size=16",
    "--steps_per_epoch=2",
    "--epochs=1",
    "--verbose=2",
    "--seed=5",
]
WORKERS_TF_CONFIG = {
    "cluster": {"worker": ["host1:12345", "host2:12345"]},
    "task": {"type": "worker", "index": 0},
}


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _environment(**extra):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **extra)
    env.pop("TF_CONFIG", None)
    env.update(extra)
    return env


def _wait_all(processes, timeout):
    """Waits for every process; kills them all in any case; returns the return codes."""
    deadline = time.monotonic() + timeout
    try:
        return [
            process.wait(timeout=max(1.0, deadline - time.monotonic())) for process in processes
        ]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()


def _read_h5_weights(path):
    import h5py

    arrays = {}
    with h5py.File(path, "r") as file:
        file.visititems(
            lambda name, item: arrays.__setitem__(name, item[()])
            if isinstance(item, h5py.Dataset) else None
        )
    return arrays


# --- options and their errors (no devices needed) ---


def test_invalid_combinations_raise_clear_value_errors():
    from capsnet_tf.distribute import validate_strategy_options

    cases = [
        (("bogus",), {}, "strategy` must be one of default, mirrored, multi_worker, tpu"),
        (("default",), {"devices": ["/gpu:0"]}, "'mirrored' only.*use strategy='mirrored'"),
        (("multi_worker",), {"devices": ["/gpu:0"], "environ": {}}, "CUDA_VISIBLE_DEVICES"),
        (("mirrored",), {"tpu": "grpc://1.2.3.4:8470"}, "`tpu` applies to strategy='tpu' only"),
        (("mirrored",), {"devices": ["/tpu:0"]}, "local CPU or GPU device names.*'/tpu:0'"),
        (("mirrored",), {"devices": ["gpu0"]}, "local CPU or GPU device names.*'gpu0'"),
        (("mirrored",), {"devices": ["/job:worker/gpu:0"]}, "local devices only"),
        (("mirrored",), {"devices": ["/gpu:0", "/GPU:0"]}, "lists a device twice"),
        (("mirrored",), {"devices": []}, "at least one device"),
        (("multi_worker",), {"environ": {}}, "TF_CONFIG environment variable, which is not set"),
        (("multi_worker",), {"environ": {"TF_CONFIG": "{cluster"}}, "TF_CONFIG is not valid JSON"),
        (
            ("multi_worker",),
            {"environ": {"TF_CONFIG": json.dumps({"task": {"type": "worker", "index": 0}})}},
            'must have a "cluster"',
        ),
        (
            ("multi_worker",),
            {"environ": {"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1", "b:2"]}})}},
            'must have a "task"',
        ),
        (
            ("multi_worker",),
            {"environ": {"TF_CONFIG": json.dumps(
                {"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 2}}
            )}},
            "not in its cluster",
        ),
        (
            ("multi_worker",),
            {"environ": {"TF_CONFIG": json.dumps(
                {"cluster": {"worker": ["a:1"], "ps": ["c:3"]},
                 "task": {"type": "worker", "index": 0}}
            )}},
            "only \"chief\" and \"worker\" tasks",
        ),
    ]
    for args, kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            validate_strategy_options(*args, **kwargs)


def test_valid_options_are_normalised():
    from capsnet_tf.distribute import read_tf_config, validate_strategy_options

    assert validate_strategy_options("default") is None
    assert validate_strategy_options("mirrored", ["/GPU:1", "gpu:0", "/device:CPU:0"]) == (
        "/gpu:1", "/gpu:0", "/cpu:0",
    )
    assert validate_strategy_options("mirrored", "/cpu:0,/cpu:1") == ("/cpu:0", "/cpu:1")
    assert validate_strategy_options("tpu", tpu="local") is None
    environ = {"TF_CONFIG": json.dumps(WORKERS_TF_CONFIG)}
    assert validate_strategy_options("multi_worker", environ=environ) is None
    with_chief = {
        "cluster": {"chief": ["host0:1"], "worker": ["host1:2"]},
        "task": {"type": "chief", "index": 0},
    }
    assert read_tf_config({"TF_CONFIG": json.dumps(with_chief)}) == with_chief


def _fake_strategy(cluster, task_type, task_id):
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), task_type=task_type, task_id=task_id
    )
    return types.SimpleNamespace(cluster_resolver=resolver)


def test_only_the_chief_writes_the_shared_workdir():
    from capsnet_tf.distribute import is_chief, worker_workdir

    workers = {"worker": ["a:1", "b:2"]}
    with_chief = {"chief": ["c:0"], "worker": ["a:1", "b:2"]}
    assert is_chief(types.SimpleNamespace(cluster_resolver=None))
    assert is_chief(_fake_strategy(workers, "worker", 0))
    assert not is_chief(_fake_strategy(workers, "worker", 1))
    assert is_chief(_fake_strategy(with_chief, "chief", 0))
    assert not is_chief(_fake_strategy(with_chief, "worker", 0))
    assert worker_workdir("/runs/a", _fake_strategy(workers, "worker", 0)) == "/runs/a"
    assert worker_workdir("/runs/a", _fake_strategy(with_chief, "worker", 0)) == os.path.join(
        "/runs/a", "workers", "worker_0"
    )


def test_local_strategies_in_process(caplog):
    import tensorflow as tf

    from capsnet_tf.distribute import make_strategy

    tf.zeros(1)  # TensorFlow has started with its one CPU device
    assert make_strategy("default") is tf.distribute.get_strategy()
    if not tf.config.list_physical_devices("GPU"):
        with caplog.at_level("WARNING"):
            mirrored = make_strategy("mirrored")
        assert isinstance(mirrored, tf.distribute.MirroredStrategy)
        assert mirrored.num_replicas_in_sync == 1
        assert "found no GPU" in caplog.text and "1 replica(s) on the CPU" in caplog.text
        with pytest.raises(ValueError, match="/gpu:0 do not exist on this machine.*/cpu:0"):
            make_strategy("mirrored", ["/gpu:0"])
    if len(tf.config.list_logical_devices("CPU")) == 1:
        with pytest.raises(ValueError, match="already initialised its devices"):
            make_strategy("mirrored", ["/cpu:0", "/cpu:1"])


def test_unreachable_tpu_is_a_clear_error_not_a_hang():
    from capsnet_tf.distribute import make_strategy

    port = _free_port()  # closed again: nothing listens there
    start = time.monotonic()
    address = f"grpc://127.0.0.1:{port}"
    with pytest.raises(ValueError, match=f"could not reach a TPU at '{address}'.*--tpu"):
        make_strategy("tpu", tpu=address)
    assert time.monotonic() - start < 30


def test_bad_combinations_stop_before_anything_is_written(tmp_path, monkeypatch):
    from capsnet_tf.config import ExperimentConfig
    from capsnet_tf.training import train_and_evaluate

    monkeypatch.delenv("TF_CONFIG", raising=False)
    for config, message in (
        (ExperimentConfig(strategy="default", devices=("/gpu:0",)), "devices"),
        (ExperimentConfig(strategy="multi_worker"), "TF_CONFIG"),
        (ExperimentConfig(strategy="tpu", devices=("/cpu:0",)), "devices"),
    ):
        workdir = tmp_path / config.strategy
        with pytest.raises(ValueError, match=message):
            train_and_evaluate(config, str(workdir))
        assert not workdir.exists()


@pytest.mark.large
def test_script_flags_reach_the_configuration(tmp_path, monkeypatch):
    from absl.testing import flagsaver

    from tests.test_mnist_experiment import load_script

    script = load_script()
    monkeypatch.delenv("TF_CONFIG", raising=False)
    workdir = tmp_path / "run"
    with flagsaver.flagsaver(workdir=str(workdir), strategy="default", devices=["/gpu:0"]):
        with pytest.raises(SystemExit, match="error: `devices` applies to strategy='mirrored'"):
            script.main(["mnist"])
    with flagsaver.flagsaver(workdir=str(workdir), strategy="multi_worker"):
        with pytest.raises(SystemExit, match="TF_CONFIG"):
            script.main(["mnist"])
    port = _free_port()
    with flagsaver.flagsaver(workdir=str(workdir), strategy="tpu", tpu=f"grpc://127.0.0.1:{port}"):
        with pytest.raises(SystemExit, match="could not reach a TPU"):
            script.main(["mnist"])
    assert not workdir.exists()
    result = subprocess.run(
        [sys.executable, SCRIPT, "--strategy=gpus", f"--workdir={workdir}"],
        capture_output=True, text=True, timeout=120, env=_environment(),
    )
    assert result.returncode != 0 and "--strategy=gpus" in result.stderr
    assert "default|mirrored|multi_worker|tpu" in result.stderr


# --- replicas and workers agreeing (subprocesses) ---


def _mirrored_steps(output_path):
    """Run in a fresh process: one SGD step on 2 CPU replicas and on 1, and Adam steps.

    Without `prepare_model` the 2-replica run would train on the pipeline's
    second shuffle (Keras reads a batch to build the model, then restarts).
    """
    from capsnet_tf.distribute import make_strategy, prepare_model

    two = make_strategy("mirrored", ["/cpu:0", "/cpu:1"])  # before TensorFlow starts
    import keras
    import tensorflow as tf

    from capsnet_tf.config import ExperimentConfig
    from capsnet_tf.data.pipeline import make_dataset
    from capsnet_tf.training import build_model, compile_model

    config = ExperimentConfig(
        primary_capsule_types=2, batch_size=8, learning_rate=0.01, decay_steps=1,
        decay_rate=0.5, minimum_learning_rate=1e-6,
    )

    def training_data(half=False):
        # A fresh pipeline each time, shuffled and shifted: its first pass is
        # the same for every run, so the runs must all train on that one.
        data, _ = make_dataset("mnist", "train", 8, training=True, shift=2, seed=3, take=64)
        return data.unbatch().take(4).batch(4) if half else data

    keras.utils.set_random_seed(0)
    initial = build_model(config, (28, 28, 1), 10).get_weights()

    def train(strategy, half, steps, sgd):
        with strategy.scope():
            model = compile_model(build_model(config, (28, 28, 1), 10), config)
            if sgd:  # the same losses and weights, with a step proportional to the gradient
                compile_config = model.get_compile_config()
                compile_config["optimizer"] = keras.optimizers.serialize(
                    keras.optimizers.SGD(learning_rate=100.0)
                )
                model.compile_from_config(compile_config)
        model.set_weights(initial)
        data = training_data(half)
        prepare_model(model, strategy, data.element_spec)  # as train_and_evaluate does
        history = model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0)
        return {
            "weights": model.get_weights(),
            "loss": history.history["loss"][-1],
            "iterations": int(model.optimizer.iterations.numpy()),
            "learning_rate": float(np.asarray(model.optimizer.learning_rate)),
            "replicas": strategy.num_replicas_in_sync,
        }

    one = tf.distribute.get_strategy()
    runs = {
        "sgd_two": train(two, False, 1, sgd=True),
        "sgd_one": train(one, False, 1, sgd=True),
        "sgd_half": train(one, True, 1, sgd=True),
        "adam_two": train(two, False, 3, sgd=False),
    }
    arrays = {f"initial/{i}": w for i, w in enumerate(initial)}
    summary = {}
    for name, run in runs.items():
        arrays.update({f"{name}/{i}": w for i, w in enumerate(run.pop("weights"))})
        summary[name] = run
    arrays["summary"] = np.array(json.dumps(summary))
    np.savez(output_path, **arrays)


def _run_module(mode, output_path, timeout):
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.test_distribute", mode, str(output_path)],
        cwd=REPO_ROOT, env=_environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, output[-4000:]


@pytest.mark.large
def test_one_step_on_two_replicas_equals_one_step_on_the_global_batch(tfds_data_dir, tmp_path):
    output = tmp_path / "mirrored.npz"
    _run_module("mirrored", output, timeout=400)
    data = np.load(output)
    summary = json.loads(str(data["summary"]))
    count = sum(1 for key in data.files if key.startswith("initial/"))

    def delta(run):
        return [
            data[f"{run}/{i}"].astype(np.float64) - data[f"initial/{i}"] for i in range(count)
        ]

    def same_step(a, b):
        # Each tensor's update within 0.1% of its largest change (float32 sums differ in order).
        return all(
            np.max(np.abs(x - y)) <= 1e-3 * np.max(np.abs(y)) + 1e-7 for x, y in zip(a, b)
        )

    assert summary["sgd_two"]["replicas"] == 2 and summary["sgd_one"]["replicas"] == 1
    two, one, half = delta("sgd_two"), delta("sgd_one"), delta("sgd_half")
    assert all(np.max(np.abs(d)) > 0 for d in one[:6])  # the step moved the weights
    # The per-example losses are averaged over the global batch of 8: the same
    # update as on one replica; not the sum over replicas (twice the step), and
    # not one replica's half of the batch.
    assert same_step(two, one)
    assert not same_step([2 * d for d in one], one)
    assert not same_step(half, one)
    assert summary["sgd_two"]["loss"] == pytest.approx(summary["sgd_one"]["loss"], rel=1e-5)
    # compile_model's Adam and schedule: 3 global steps are 3 optimizer iterations
    # (not 6), and the learning rate is the schedule's at step 3.
    adam = summary["adam_two"]
    assert adam["iterations"] == 3
    assert adam["learning_rate"] == pytest.approx(0.01 * 0.5**3, rel=1e-5)
    assert np.isfinite(adam["loss"])


@pytest.mark.large
def test_two_workers_on_localhost_agree_with_one_process(tfds_data_dir, tmp_path):
    """Two MultiWorkerMirroredStrategy workers train the real CapsNet a few steps."""
    ports = [_free_port(), _free_port()]
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    workdir = tmp_path / "two_workers"
    # The reference: one process with the same global batch, run meanwhile.
    single = tmp_path / "one_process"
    logs = [tmp_path / name for name in ("worker_0.log", "worker_1.log", "one_process.log")]
    commands = [
        (["--strategy=multi_worker", f"--workdir={workdir}"], {"TF_CONFIG": json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": index}}
        )})
        for index in range(2)
    ] + [(["--strategy=default", f"--workdir={single}"], {})]
    processes = []
    try:
        for (flags, env), log_path in zip(commands, logs):
            with open(log_path, "w") as log:
                processes.append(subprocess.Popen(
                    [sys.executable, SCRIPT, *flags, *TINY_RUN],
                    cwd=REPO_ROOT, env=_environment(**env), stdout=log, stderr=subprocess.STDOUT,
                ))
        codes = _wait_all(processes, timeout=400)
    finally:
        for process in processes:  # also when starting one of them failed
            if process.poll() is None:
                process.kill()
                process.wait()
    for code, log in zip(codes, logs):
        assert code == 0, log.read_text()[-4000:]
    assert "2 replica(s) in sync" in logs[0].read_text()
    assert "worker 0 (chief)" in logs[0].read_text()
    assert "worker 1 (not chief)" in logs[1].read_text()

    # The chief wrote the work directory, the other worker its own copy.
    worker_dir = workdir / "workers" / "worker_1"
    chief_results = json.loads((workdir / "results.json").read_text())
    worker_results = json.loads((worker_dir / "results.json").read_text())
    assert json.loads((workdir / "config.json").read_text())["strategy"] == "multi_worker"
    assert chief_results["epochs_run_this_call"] == 1
    chief_weights = _read_h5_weights(workdir / "checkpoints" / "latest.weights.h5")
    worker_weights = _read_h5_weights(worker_dir / "checkpoints" / "latest.weights.h5")
    assert chief_weights.keys() == worker_weights.keys() and len(chief_weights) >= 12
    for name, value in chief_weights.items():
        np.testing.assert_array_equal(value, worker_weights[name], err_msg=name)
    for name, values in chief_results["history"].items():
        if not name.startswith("train_") and name != "wall_seconds":  # not the timings
            np.testing.assert_allclose(values, worker_results["history"][name], err_msg=name)
    assert worker_results["test_accuracy"] == chief_results["test_accuracy"]

    # One process with the same global batch: the same losses and weights, so
    # each worker took its own half of every batch and the losses were averaged
    # over the global batch.
    single_results = json.loads((single / "results.json").read_text())
    for name in ("loss", "length_accuracy", "val_loss", "val_length_accuracy"):
        np.testing.assert_allclose(
            chief_results["history"][name], single_results["history"][name], rtol=1e-4,
            err_msg=name,
        )
    assert chief_results["test_accuracy"] == single_results["test_accuracy"]
    single_weights = _read_h5_weights(single / "checkpoints" / "latest.weights.h5")
    for name, value in chief_weights.items():
        np.testing.assert_allclose(value, single_weights[name], rtol=1e-3, atol=1e-5, err_msg=name)
    assert not (workdir / "workers" / "worker_0").exists()


if __name__ == "__main__":
    if sys.argv[1] == "mirrored":
        _mirrored_steps(sys.argv[2])
    else:
        raise SystemExit(f"unknown mode {sys.argv[1]!r}")
