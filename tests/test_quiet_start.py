"""experiments/mnist.py starts quietly: no TensorFlow C++ log lines unless --verbosity."""

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT
from tests.test_mnist_experiment import SCRIPT, load_script

# A line of TensorFlow's C++ logging (Abseil's format, a C++ source file named),
# or Abseil's note that precedes the first of them.
_CPP_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [^ \]]+\.(cc|h):\d+\] ", re.M)


def run_script(args):
    """experiments/mnist.py in its own process, as from a terminal (no TF_CPP_* variables)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("TF_CPP")}
    return subprocess.run(
        [sys.executable, SCRIPT, *args], cwd=REPO_ROOT, env=env, capture_output=True,
        text=True, timeout=600,
    )


def cpp_lines(console):
    lines = [match.group(0) for match in _CPP_LINE.finditer(console)]
    return lines + [line for line in console.splitlines() if "absl::InitializeLog" in line]


# Lines seen on the 2-core Xeon without a GPU (TensorFlow 2.21, the CUDA build).
_START_LINES = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1796540418.568715    5827 port.cc:153] oneDNN custom operations are on.",
    "I0000 00:00:1796540418.569123    5827 cudart_stub.cc:31] Could not find cuda drivers on "
    "your machine, GPU will not be used.",
    "W0000 00:00:1796540418.569123    5827 some_file.cc:7] a warning",
    "I1206 07:00:25.524683    5827 cpu_feature_guard.cc:227] This TensorFlow binary is "
    "optimized to use available CPU instructions",
    "To enable the following instructions: AVX2 AVX512F, in other operations, rebuild",
]
_NO_DRIVER_ERROR = (
    "E0000 00:00:1796540424.136436    5827 cuda_platform.cc:52] failed call to cuInit: "
    "INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)"
)


def test_start_up_lines_are_hidden_and_everything_else_kept():
    hidden = load_script()._hidden_at_start
    for line in _START_LINES:
        assert hidden(line + "\n", nvidia_driver=False), line
    # CUDA's absence is noise only where there is no NVIDIA driver.
    assert hidden(_NO_DRIVER_ERROR, nvidia_driver=False)
    assert not hidden(_NO_DRIVER_ERROR, nvidia_driver=True)
    kept = [
        "E0000 00:00:1796540424.136436    5827 op_kernel.cc:1] Something failed",
        "F0000 00:00:1796540424.136436    5827 check.cc:1] Check failed: x",
        "Traceback (most recent call last):",
        "/usr/lib/python3/warnings.py:1: UserWarning: something",
        "Training capsnet on mnist for 1 epoch(s) in /tmp/run",
        "",
    ]
    for line in kept:
        assert not hidden(line, nvidia_driver=False), line


def test_quiet_start_filters_file_descriptor_2(capfd):
    """What C++ writes to fd 2 while TensorFlow loads passes the filter line by line."""
    script = load_script()
    with script._quiet_start():
        os.write(2, ("\n".join(_START_LINES) + "\n").encode())
        os.write(2, b"a line of our own\n")
        os.write(2, _NO_DRIVER_ERROR.replace("failed call to cuInit", "other").encode() + b"\n")
    os.write(2, b"after the start\n")
    kept = _NO_DRIVER_ERROR.replace("failed call to cuInit", "other")
    assert capfd.readouterr().err == f"a line of our own\n{kept}\nafter the start\n"


@pytest.mark.large
def test_tiny_run_console_has_no_cpp_log_lines(tfds_data_dir, tmp_path):
    """What a new user sees from `mnist.flags` on a CPU: the summary and progress, no C++."""
    workdir = str(tmp_path / "run")
    result = run_script(
        ["--flagfile=mnist.flags", f"--workdir={workdir}", "--steps_per_epoch=2",
         "--eval_examples=100", "--train_examples=200"],
    )
    console = result.stdout + result.stderr
    assert result.returncode == 0, console[-3000:]
    assert cpp_lines(console) == [], console[-3000:]
    for words in ("Training capsnet on mnist", "precision: float32 (--mixed_precision=float32)",
                  "Test accuracy:"):
        assert words in result.stdout, result.stdout
    assert json.load(open(os.path.join(workdir, "config.json")))["mixed_precision"] == "float32"


@pytest.mark.large
def test_verbosity_brings_the_cpp_lines_back():
    """--verbosity turns the filter off (--helpshort: TensorFlow loads, nothing trains)."""
    quiet = run_script(["--helpshort"])
    verbose = run_script(["--verbosity=0", "--helpshort"])
    for result in (quiet, verbose):  # absl's help exits with status 1
        assert "--mixed_precision" in result.stdout, result.stderr[-3000:]
    assert cpp_lines(quiet.stdout + quiet.stderr) == [], quiet.stderr[-3000:]
    if not cpp_lines(verbose.stderr):
        pytest.skip("this TensorFlow build logs nothing from C++ as it starts")
