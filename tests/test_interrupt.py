"""One run per work directory, graceful stops on SIGTERM and Ctrl-C, exact resumes, full disks.

Every test runs `experiments/mnist.py` as a real subprocess on a tiny
configuration (64 training images, batch 8, 2 epochs of 8 steps, 2 primary
capsule types). Signals are sent by the process to itself after a chosen
optimizer step (`tests/signal_at_step.py`), so the step a test checks is the
step the signal arrived at, not wherever a timer happened to fall.
"""

import csv
import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

from capsnet_tf.runlock import LOCK_FILE, WorkdirBusyError, lock_holder, lock_workdir
from tests.conftest import REPO_ROOT

SCRIPT = os.path.join(REPO_ROOT, "experiments", "mnist.py")
HELPER = os.path.join(REPO_ROOT, "tests", "signal_at_step.py")
STEPS = 2 * 64 // 8  # optimizer steps of the whole tiny run
STATE = os.path.join("backup", "training_state.weights.h5")


def tiny_flags(workdir, *extra):
    return [
        f"--workdir={workdir}", "--train_examples=64", "--batch_size=8", "--eval_examples=16",
        "--epochs=2", "--primary_capsule_types=2", "--verbose=2", "--seed=3", *extra,
    ]


def run(arguments, timeout=600, **kwargs):
    return subprocess.run(
        [sys.executable, *arguments], cwd=REPO_ROOT, capture_output=True, text=True,
        timeout=timeout, **kwargs,
    )


def run_with_signal(workdir, step, name, *extra):
    return run([HELPER, str(step), name, *tiny_flags(workdir, *extra)])


def state_metadata(workdir):
    with h5py.File(os.path.join(workdir, STATE), "r") as file:
        return json.loads(file.attrs["capsnet_tf_checkpoint"])


def arrays(path):
    """Every array of an HDF5 weights file, by its path in the file."""
    found = {}
    with h5py.File(path, "r") as file:
        file.visititems(
            lambda name, item: found.__setitem__(name, np.asarray(item))
            if isinstance(item, h5py.Dataset) else None
        )
    return found


def assert_same_arrays(path_a, path_b):
    a, b = arrays(path_a), arrays(path_b)
    assert sorted(a) == sorted(b)
    different = [name for name in a if not np.array_equal(a[name], b[name])]
    assert not different, f"{len(different)} of {len(a)} arrays differ, e.g. {different[:3]}"


def csv_rows(workdir):
    with open(os.path.join(workdir, "training_log.csv")) as file:
        text = file.read()
    assert text.count("epoch,") == 1, "the CSV log has more than one header:\n" + text
    with open(os.path.join(workdir, "training_log.csv")) as file:
        return [row["epoch"] for row in csv.DictReader(file)]


def file_hash(path):
    with open(path, "rb") as file:
        return hashlib.sha256(file.read()).hexdigest()


@pytest.fixture(scope="module")
def uninterrupted(tfds_data_dir, tmp_path_factory):
    """The work directory of the tiny run trained without interruption."""
    workdir = tmp_path_factory.mktemp("uninterrupted") / "run"
    result = run([SCRIPT, *tiny_flags(workdir)])
    assert result.returncode == 0, result.stderr[-3000:]
    assert state_metadata(workdir)["global_step"] == STEPS
    return workdir


@pytest.mark.parametrize(
    "signal_name, exit_code", [("SIGTERM", 143), ("SIGINT", 130)], ids=["sigterm", "ctrl-c"]
)
@pytest.mark.large
def test_signal_mid_epoch_saves_that_step_and_the_resumed_run_ends_bit_identical(
    uninterrupted, tmp_path, signal_name, exit_code
):
    workdir = tmp_path / "run"
    stopped = run_with_signal(workdir, 5, signal_name)
    assert stopped.returncode == exit_code, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr
    # Backups every 100 steps by default: this one was written because of the signal.
    saved = state_metadata(workdir)
    assert (saved["epoch"], saved["step_in_epoch"], saved["global_step"]) == (0, 5, 5)
    assert f"Stopped on {signal_name} at global step 5 (epoch 1, step 5)" in stopped.stderr
    assert "Run the same command again to continue." in stopped.stderr
    assert not (workdir / "results.json").exists()

    resumed = run([SCRIPT, *tiny_flags(workdir)])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "at global step 5" in resumed.stderr
    assert state_metadata(workdir)["global_step"] == STEPS
    assert csv_rows(workdir) == ["0", "1"]
    # The same batches, shifts and optimizer state from step 6 on: the same bits.
    assert_same_arrays(workdir / STATE, uninterrupted / STATE)
    assert_same_arrays(
        workdir / "checkpoints" / "latest.weights.h5",
        uninterrupted / "checkpoints" / "latest.weights.h5",
    )


@pytest.mark.large
def test_sigkill_after_a_backup_resumes_bit_identical(uninterrupted, tmp_path):
    workdir = tmp_path / "run"
    killed = run_with_signal(workdir, 11, "SIGKILL", "--backup_every_steps=3")
    assert killed.returncode == -signal.SIGKILL
    assert state_metadata(workdir)["global_step"] == 9  # the last backup before the kill
    resumed = run([SCRIPT, *tiny_flags(workdir, "--backup_every_steps=3")])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "at global step 9" in resumed.stderr
    assert_same_arrays(workdir / STATE, uninterrupted / STATE)


@pytest.mark.large
def test_second_ctrl_c_exits_at_once_keeping_the_last_backup(tfds_data_dir, tmp_path):
    workdir = tmp_path / "run"
    stopped = run_with_signal(workdir, 11, "SIGINT*2")
    assert stopped.returncode == 130, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr
    assert "received again: stopped at once" in stopped.stderr
    # Nothing was saved at step 11: the backup of the end of epoch 1 stands.
    assert state_metadata(workdir)["global_step"] == 8
    assert not any(name.endswith(".tmp.weights.h5") for name in os.listdir(workdir / "backup"))


@pytest.mark.large
def test_second_run_on_a_busy_work_directory_is_refused_and_changes_nothing(
    tfds_data_dir, tmp_path
):
    workdir = tmp_path / "run"
    first = subprocess.Popen(
        [sys.executable, SCRIPT, *tiny_flags(workdir)], cwd=REPO_ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while (lock_holder(workdir) or {}).get("pid") != first.pid:
            assert first.poll() is None and time.monotonic() < deadline, first.stdout.read()
            time.sleep(0.1)
        first.send_signal(signal.SIGSTOP)  # holds the lock, trains no further
        before = sorted(os.listdir(workdir))
        started = time.monotonic()
        second = run([SCRIPT, *tiny_flags(workdir)], timeout=120)
        assert time.monotonic() - started < 60
        assert second.returncode == 1
        message = [line for line in second.stderr.splitlines() if line.startswith("error:")]
        assert len(message) == 1, second.stderr[-3000:]
        assert f"process {first.pid} on host" in message[0]
        assert str(workdir) in message[0] and "Nothing was changed" in message[0]
        assert sorted(os.listdir(workdir)) == before
        first.send_signal(signal.SIGCONT)
        first.wait(timeout=600)
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGCONT)
            first.kill()
            first.wait()
    assert first.returncode == 0
    assert csv_rows(workdir) == ["0", "1"]


def test_lock_of_a_killed_process_does_not_block(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import time; from capsnet_tf.runlock import lock_workdir\n"
         f"with lock_workdir({str(tmp_path)!r}):\n"
         "    print('locked', flush=True); time.sleep(600)"],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True,
    )
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(WorkdirBusyError, match=f"process {holder.pid} on host"):
        with lock_workdir(tmp_path):
            pass
    holder.kill()
    holder.wait()
    assert (tmp_path / LOCK_FILE).exists()  # the file stays; the kernel released the lock
    with lock_workdir(tmp_path):
        assert lock_holder(tmp_path)["pid"] == os.getpid()


@pytest.mark.large
def test_checkpoint_write_on_a_full_disk_keeps_the_previous_file_and_says_so(
    tfds_data_dir, tmp_path
):
    workdir = tmp_path / "run"
    first = run([SCRIPT, *tiny_flags(workdir, "--epochs=1")])
    assert first.returncode == 0, first.stderr[-3000:]
    latest = workdir / "checkpoints" / "latest.weights.h5"
    state = workdir / STATE
    hashes = {path: file_hash(path) for path in (latest, state)}
    size = os.path.getsize(latest)

    def small_disk():  # files may grow to a tenth of a checkpoint
        resource.setrlimit(resource.RLIMIT_FSIZE, (size // 10, resource.RLIM_INFINITY))

    full = run([SCRIPT, *tiny_flags(workdir)], preexec_fn=small_disk)
    assert full.returncode == 1, full.stderr[-3000:]
    assert "Traceback" not in full.stderr
    message = [line for line in full.stderr.splitlines() if line.startswith("error:")]
    assert len(message) == 1, full.stderr[-3000:]
    assert f"Could not write {latest}" in message[0]
    assert "File too large" in message[0] and "The previous file is intact" in message[0]
    assert {path: file_hash(path) for path in hashes} == hashes
    assert not [name for name in os.listdir(latest.parent) if ".tmp" in name]
