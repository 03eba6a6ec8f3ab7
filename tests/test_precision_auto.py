"""--mixed_precision=auto: the precision the hardware computes fastest, recorded in config.json."""

import json
import os

import pytest
from absl import flags
from absl.testing import flagsaver

from capsnet_tf import cpu, training
from capsnet_tf.config import ExperimentConfig
from capsnet_tf.workdir import check_workdir, load_trained_model
from tests.test_mnist_experiment import load_script

AVX2 = {"sse4_2", "avx", "avx2", "fma"}
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512_vnni"}


@pytest.mark.parametrize(
    "cpu_flags, gpus, tpu, expected, words",
    [
        # CPUs: bfloat16 only with bfloat16 arithmetic.
        (AVX2 | {"amx_bf16", "amx_tile", "avx512_bf16"}, (), False, "bfloat16", "AMX"),
        (AVX512 | {"avx512_bf16"}, (), False, "bfloat16", "AVX-512 BF16"),
        (AVX512, (), False, "float32", "no bfloat16 arithmetic"),
        (AVX2, (), False, "float32", "no bfloat16 arithmetic"),
        (set(), (), False, "float32", "no bfloat16 arithmetic"),
        # GPUs decide over the CPU, the oldest of several.
        (AVX2, [(8, 0)], False, "bfloat16", "capability 8.0"),
        (AVX2, [(9, 0), (9, 0)], False, "bfloat16", "capability 9.0"),
        (AVX2, [(7, 5)], False, "float16", "scales the loss"),
        (AVX2, [(7, 0)], False, "float16", "capability 7.0"),
        (AVX2 | {"amx_bf16"}, [(6, 1)], False, "float32", "no tensor cores"),
        (AVX2, [(8, 6), (7, 5)], False, "float16", "capability 7.5"),
        (AVX2 | {"amx_bf16"}, [None], False, "float32", "unknown compute capability"),
        # TPUs: bfloat16 whatever the host.
        (AVX2, (), True, "bfloat16", "TPU"),
    ],
)
def test_auto_resolves_by_hardware(cpu_flags, gpus, tpu, expected, words):
    precision, reason = cpu.choose_precision(cpu_flags, gpus, tpu=tpu)
    assert precision == expected and words in reason, (precision, reason)


def test_auto_reads_this_cpu_without_flags(monkeypatch):
    monkeypatch.setattr(cpu, "_cpu_flags", lambda: frozenset(AVX2))
    assert cpu.choose_precision()[0] == "float32"
    monkeypatch.setattr(cpu, "_cpu_flags", lambda: frozenset(AVX2 | {"avx512_bf16"}))
    assert cpu.choose_precision()[0] == "bfloat16"


def test_resolve_precision_of_a_config(monkeypatch):
    monkeypatch.setattr(cpu, "_cpu_flags", lambda: frozenset(AVX2))
    monkeypatch.setattr(training, "_gpu_compute_capabilities", lambda devices: [(8, 0)])
    # Asked for: kept, whatever the hardware.
    assert training.resolve_precision(ExperimentConfig(mixed_precision="bfloat16")) == (
        "bfloat16", "--mixed_precision=bfloat16")
    assert training.resolve_precision(ExperimentConfig())[0] == "float32"
    # auto: the GPU, the CPU where --devices names CPUs only, the TPUs of --strategy=tpu.
    assert training.resolve_precision(ExperimentConfig(mixed_precision="auto")) == (
        "bfloat16", "--mixed_precision=auto; GPU compute capability 8.0 multiplies bfloat16 "
        "natively")
    tpu = ExperimentConfig(mixed_precision="auto", strategy="tpu")
    assert training.resolve_precision(tpu)[0] == "bfloat16"
    monkeypatch.undo()  # the real GPU query, which --devices of CPUs only skips
    monkeypatch.setattr(cpu, "_cpu_flags", lambda: frozenset(AVX2))
    assert training._gpu_compute_capabilities(("/cpu:0", "/CPU:1")) == ()
    cpus = ExperimentConfig(mixed_precision="auto", strategy="mirrored",
                            devices=("/cpu:0", "/cpu:1"))
    assert training.resolve_precision(cpus)[0] == "float32"


@pytest.mark.parametrize("cpu_flags, policy", [(AVX2, "float32"),
                                               (AVX2 | {"amx_bf16"}, "mixed_bfloat16")])
def test_auto_sets_the_policy_without_the_slow_bfloat16_warning(monkeypatch, cpu_flags, policy):
    import warnings

    import keras

    monkeypatch.setattr(cpu, "_cpu_flags", lambda: frozenset(cpu_flags))
    monkeypatch.setattr(training, "_gpu_compute_capabilities", lambda devices: ())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        precision, reason = training._set_precision(ExperimentConfig(mixed_precision="auto"))
    assert keras.config.dtype_policy().name == policy
    assert reason.startswith("--mixed_precision=auto; ")


def test_auto_is_a_valid_choice_and_others_are_not():
    ExperimentConfig(mixed_precision="auto").validate()
    with pytest.raises(ValueError, match="mixed_precision.*auto"):
        ExperimentConfig(mixed_precision="bf16").validate()


def test_config_json_records_asked_and_resolved_and_old_files_still_load(tmp_path):
    config = ExperimentConfig(mixed_precision="auto")
    record = json.loads(training._config_record(config, "float32", "why"))
    assert record["mixed_precision"] == "auto"
    assert record["mixed_precision_resolved"] == "float32"
    assert record["mixed_precision_reason"] == "why"
    # Every other key is a field, as before; a reader that keeps the fields it knows
    # (load_trained_model) rebuilds the config from the new file and from an old one.
    assert json.loads(config.to_json()) == {
        key: value for key, value in record.items() if not key.startswith("mixed_precision_")
    } | {"mixed_precision": "auto"}
    fields = set(ExperimentConfig.__dataclass_fields__)
    assert ExperimentConfig(**{k: v for k, v in record.items() if k in fields}) == config
    old = json.loads(ExperimentConfig(mixed_precision="bfloat16").to_json())
    (tmp_path / "config.json").write_text(json.dumps(old))
    check_workdir(str(tmp_path), config, overwrite=False)  # the same model: resumes


def _fast_recipe_flags(workdir, epochs=1):
    """mnist_fast.flags as the command line gives them, cut to a few steps."""
    script = load_script()
    return script.resolve_flagfiles([
        "--flagfile=mnist_fast.flags", f"--workdir={workdir}", f"--epochs={epochs}",
        "--unshifted_final_epochs=0", "--steps_per_epoch=2", "--batch_size=8",
        "--train_examples=64", "--eval_examples=16", "--verbose=0",
    ])


@pytest.mark.large
def test_fast_recipe_on_an_avx2_cpu_records_float32(tfds_data_dir, tmp_path, monkeypatch, capsys):
    """A short mnist_fast.flags run on an AVX2-only CPU (its flags stand in for one) trains
    in float32; config.json says what was asked and what it resolved to, and an earlier
    work directory whose config.json has neither resumes and loads."""
    script = load_script()
    monkeypatch.setattr(cpu, "_cpu_flags", lambda: frozenset(AVX2))
    monkeypatch.setattr(training, "_gpu_compute_capabilities", lambda devices: ())
    workdir = str(tmp_path / "run")
    with flagsaver.flagsaver():
        flags.FLAGS(["mnist", *_fast_recipe_flags(workdir)])
        assert flags.FLAGS.mixed_precision == "auto"  # the recipe's default
        script.main(["mnist"])
    summary = capsys.readouterr().out
    assert "precision: float32 (--mixed_precision=auto; the CPU has no bfloat16" in summary
    path = os.path.join(workdir, "config.json")
    saved = json.load(open(path))
    assert saved["mixed_precision"] == "auto"
    assert saved["mixed_precision_resolved"] == "float32"
    assert "no bfloat16 arithmetic" in saved["mixed_precision_reason"]
    assert load_trained_model(workdir)[1].mixed_precision == "auto"

    # A work directory of an earlier version: no resolved precision, bfloat16 asked.
    for name in ("mixed_precision_resolved", "mixed_precision_reason"):
        del saved[name]
    saved["mixed_precision"] = "bfloat16"
    with open(path, "w") as file:
        json.dump(saved, file)
    check_workdir(workdir, ExperimentConfig(mixed_precision="auto"), overwrite=False)
    assert load_trained_model(workdir)[1].mixed_precision == "bfloat16"
    with flagsaver.flagsaver():
        flags.FLAGS(["mnist", *_fast_recipe_flags(workdir, epochs=2)])
        script.main(["mnist"])  # resumes: epoch 2 only
    results = json.load(open(os.path.join(workdir, "results.json")))
    assert results["epochs_run_this_call"] == 1
    assert json.load(open(path))["mixed_precision_resolved"] == "float32"
