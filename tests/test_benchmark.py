"""experiments/benchmark.py and capsnet_tf.benchmarking: FLOPs, ceiling, a tiny run.

No test here asserts a time: the run checks that every section produces its
numbers and that the derived ratios are the ones the raw times give.
"""

import ast
import json
import os
import platform
import re
import subprocess
import sys

import numpy as np
import pytest

from capsnet_tf import benchmarking, cpu
from tests.conftest import REPO_ROOT

SCRIPT = os.path.join(REPO_ROOT, "experiments", "benchmark.py")


def test_flop_counts_match_the_issue_and_paper():
    forward = benchmarking.model_flops_per_image(3)
    # The issue: about 0.41 GFLOP per image forward, 94% in the PrimaryCaps conv.
    assert 0.40e9 < forward < 0.42e9
    share = benchmarking.primary_conv_flops(1, backward=False) / forward
    assert 0.93 < share < 0.95
    # Issue 17's 1.2026 GFLOP a training image, plus conv1's input gradient (its forward's
    # 20 * 20 positions * 9 * 9 taps * 256 filters multiply-adds), which 3x forward counts.
    conv1_input_gradient = 2 * 20 * 20 * 9 * 9 * 256
    training = benchmarking.training_flops_per_image(3)
    assert round((training - conv1_input_gradient) / 1e9, 4) == 1.2026
    # Each routing iteration adds the weighted sum and the agreement: 2 * 2 i j e.
    assert benchmarking.model_flops_per_image(4) - forward == 2 * 2 * 1152 * 10 * 16


def test_linear_fit_recovers_a_line():
    fit = benchmarking.linear_fit([1, 2, 4, 8], [3.0 + 0.5 * x for x in (1, 2, 4, 8)])
    assert fit["slope"] == pytest.approx(0.5)
    assert fit["intercept"] == pytest.approx(3.0)
    assert fit["largest_relative_deviation"] == pytest.approx(0.0, abs=1e-12)
    bent = benchmarking.linear_fit([1, 2, 3], [1.0, 1.0, 2.0])
    assert bent["largest_relative_deviation"] > 0.1


def test_call_seconds_and_percentile():
    calls = []
    seconds = benchmarking.call_seconds(lambda: calls.append(1), repeats=4, warmup=2)
    assert len(seconds) == 4 and len(calls) == 6 and all(s >= 0 for s in seconds)
    assert benchmarking.percentile([5, 1, 3, 2, 4], 0.5) == 3
    assert benchmarking.percentile([5, 1, 3, 2, 4], 0.9) == 5  # rank round(3.6) = 4
    assert benchmarking.percentile([7.0], 0.9) == 7.0


def test_ceiling_keeps_its_forward_convolution():
    forward_backward, forward = benchmarking.conv_ceilings(1)
    outputs, (input_grad, kernel_grad) = forward_backward()
    np.testing.assert_allclose(outputs.numpy(), forward().numpy(), rtol=1e-5, atol=1e-5)
    assert input_grad.shape == (1, 20, 20, 256) and kernel_grad.shape == (9, 9, 256, 256)
    graph = forward_backward.get_concrete_function().graph
    kinds = {op.type for op in graph.get_operations()}
    assert {"Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter"} <= kinds


@pytest.mark.large
def test_tiny_run_writes_every_section(tmp_path):
    output = tmp_path / "results"
    command = [
        sys.executable, SCRIPT, f"--output_dir={output}", "--batch_size=8",
        "--inference_batch_size=4", "--rounds=2", "--steps=1", "--warmup=1",
        "--scaling_batch_sizes=2,4", "--scaling_iterations=1,3", "--scaling_rounds=1",
        "--memory_batch_sizes=2,4", "--latency_calls=3",
    ]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((output / "benchmark.json").read_text())
    sections = ["train", "inference", "pipeline", "scaling", "memory"]
    assert results["settings"]["sections"] == sections
    train = results["train"]
    for precision in ("float32", "bfloat16"):
        entry = train[precision]
        assert entry["images_per_second"]["n"] == 2
        # The median fraction lies within the per-round extremes the raw rates give.
        rates = [8 / t for t in (entry["step_seconds"]["min"], entry["step_seconds"]["max"])]
        assert entry["images_per_second"]["max"] == pytest.approx(max(rates))
        assert 0 < entry["fraction_of_float32_ceiling"]["median"] < 5
        # The fraction of the matmul rate, round by round, lies between the
        # extremes the raw training and matmul rates allow.
        matmul = train["matmul_gflops"][precision]
        train_gflops = entry["gflops"]
        fraction = entry["fraction_of_matmul_ceiling"]["median"]
        assert train_gflops["min"] / matmul["max"] <= fraction + 1e-9
        assert fraction <= train_gflops["max"] / matmul["min"] + 1e-9
    assert train["matmul_size"] == 2048
    assert train["bfloat16"]["speedup_over_float32"]["median"] > 0
    assert set(results["machine"]["instruction_sets"]) <= {
        "avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8", "amx_tile",
    }
    assert results["machine"]["cpu_model"] == cpu.model_name()
    family_and_model = cpu.family_and_model()  # a tuple, a list once through JSON
    assert results["machine"]["cpu_family_and_model"] == (
        list(family_and_model) if family_and_model else None
    )
    inference = results["inference"]
    assert inference["saved_model"]["images_per_second"]["median"] > 0
    assert set(inference["matmul_gflops"]) == {"float32", "bfloat16"}
    assert inference["saved_model"]["fraction_of_matmul_ceiling"]["median"] > 0
    assert inference["single_image_latency_ms"]["n"] == 3
    assert results["pipeline"]["images_per_second"]["median"] > 0
    assert results["pipeline"]["over_float32_training_rate"] > 0
    scaling = results["scaling"]
    assert set(scaling["step_seconds_by_batch"]) == {"2", "4"}
    assert set(scaling["step_seconds_by_iterations"]) == {"1", "3"}
    assert 0 < scaling["routing_share_of_step"]["median"] < 1
    memory = results["memory"]
    assert [row["batch_size"] for row in memory["runs"]] == [2, 4]
    assert all(row["peak_gib"] >= row["after_build_gib"] > 0.1 for row in memory["runs"])
    table = (output / "benchmark.md").read_text()
    assert "fraction of the float32 ceiling" in table and "speed-up over float32" in table
    assert "inference SavedModel serving_float, fraction of its precision's matmul" in table
    assert "matmul-rate ceiling" in table


def test_instruction_sets_are_the_cpus_own_flags():
    with open("/proc/cpuinfo") as file:
        text = file.read()
    flags = set(text.split("flags", 1)[1].split("\n", 1)[0].split())
    found = cpu.instruction_sets()
    assert found and all(name in flags for name in found)
    assert set(found) <= set(cpu.MATMUL_INSTRUCTION_SETS)
    assert ("avx512f" in found) == ("avx512f" in flags)
    assert cpu.has_amx() == ("amx_bf16" in flags)
    expected_unit = (
        "amx" if "amx_bf16" in flags else "avx512_bf16" if "avx512_bf16" in flags else None
    )
    assert cpu.bfloat16_unit() == expected_unit
    names = [line.split(":", 1)[1].strip() for line in text.splitlines()
             if line.startswith("model name")]
    assert cpu.model_name() == (names[0] if names else "")
    family = re.search(r"^cpu family\s*:\s*(\d+)$", text, re.MULTILINE)
    model = re.search(r"^model\s*:\s*(\d+)$", text, re.MULTILINE)
    expected = (int(family.group(1)), int(model.group(1))) if family and model else None
    assert cpu.family_and_model() == expected


@pytest.mark.parametrize(
    "flags, cap, unit",
    [
        ({"avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16"}, None, "amx"),
        ({"avx2", "fma", "avx512f", "avx512_bf16"}, None, "avx512_bf16"),
        ({"avx2", "fma", "avx512f"}, None, "avx512"),
        ({"avx2", "fma"}, None, "avx2"),
        ({"avx"}, None, "other"),
        ({"avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16"}, "AVX2", "avx2"),
        ({"avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16"}, "avx512_core_bf16",
         "avx512_bf16"),
        ({"avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16"}, "AVX512_CORE_AMX", "amx"),
        ({"avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16"}, "AVX512_CORE", "avx512"),
        ({"avx2", "fma"}, "AVX512_CORE_AMX", "avx2"),  # a cap never raises
        ({"avx2", "fma", "avx512f"}, "ALL", "avx512"),
    ],
)
def test_vector_unit_is_the_flags_lowered_to_onednns_cap(monkeypatch, flags, cap, unit):
    """What oneDNN may run: the CPU's flags, capped by ONEDNN_MAX_CPU_ISA where it is set."""
    monkeypatch.setattr(cpu, "_cpu_flags", lambda: frozenset(flags))
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    if cap is None:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    else:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    assert cpu.vector_unit() == unit
    assert cpu.bfloat16_unit() == (unit if unit in ("amx", "avx512_bf16") else None)
    assert cpu.has_amx() == (unit == "amx")


def test_importing_capsnet_tf_changes_no_environment_variable():
    """The package leaves os.environ alone; oneDNN is the scripts' business (docs/layers.md)."""
    env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    code = ("import os; before = dict(os.environ); import capsnet_tf, capsnet_tf.export; "
            "print(dict(os.environ) == before, 'TF_ENABLE_ONEDNN_OPTS' in os.environ)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO_ROOT, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[-2] == "True False"


@pytest.mark.skipif(platform.machine() != "x86_64", reason="oneDNN's x86 CPU kernels")
@pytest.mark.parametrize("setting, expected", [("1", "True"), ("0", "False")])
@pytest.mark.large
def test_onednn_follows_the_variable_set_before_tensorflow(setting, expected):
    """What the scripts set before TensorFlow loads is what `cpu.onednn_enabled` reports."""
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": setting}
    code = "from capsnet_tf import cpu; print(cpu.onednn_enabled())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO_ROOT, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[-2] == expected


@pytest.mark.parametrize("script", ["benchmark.py", "explore.py", "export.py", "paper_eval.py",
                                    "predict.py", "serving_benchmark.py", "visualize.py"])
def test_scripts_ask_for_onednn_before_tensorflow_loads(script):
    """The default is set at module level, above the first import that loads TensorFlow."""
    tree = ast.parse(open(os.path.join(REPO_ROOT, "experiments", script)).read())
    setting = loads = None
    for node in tree.body:
        text = ast.unparse(node)
        if setting is None and 'setdefault("TF_ENABLE_ONEDNN_OPTS", "1")' in text.replace(
                "'", '"'):
            setting = node.lineno
        if loads is None and isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                name in text for name in ("capsnet_tf", "tensorflow", "keras")):
            loads = node.lineno
    assert setting is not None and (loads is None or setting < loads)


@pytest.mark.large
def test_unknown_section_is_refused(tmp_path):
    done = subprocess.run(
        [sys.executable, SCRIPT, f"--output_dir={tmp_path}", "--sections=train,speed"],
        capture_output=True, text=True, cwd=REPO_ROOT,
    )
    assert done.returncode != 0
    assert "--sections" in done.stderr and "speed" in done.stderr
    assert not os.listdir(tmp_path)
