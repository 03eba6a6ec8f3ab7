"""What the CPU can do, as far as the choice of a kernel depends on it.

The fastest form of a computation differs between the kinds of x86 CPU this
project has been measured on: Intel Xeons with AMX (tile matrix units that run
bfloat16 matmuls at two to three times the AVX-512 rate), AMD EPYC Zen 4
(AVX-512 BF16, no AMX) and AMD EPYC Zen 1 and Zen 2 (AVX2 only: bfloat16 is
converted to float32 for every product, so mixed bfloat16 is slower than
float32).
Layers that pick a form by CPU ask here, once.
"""

import functools
import os

__all__ = [
    "MATMUL_INSTRUCTION_SETS", "accelerated", "bfloat16_unit", "family_and_model", "has_amx",
    "instruction_sets", "model_name", "onednn_enabled",
]

# The instruction sets that decide matmul and convolution speed, in the
# order the benchmark reports them.
MATMUL_INSTRUCTION_SETS = (
    "avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8", "amx_tile",
)


@functools.cache
def _cpuinfo_field(name):
    """The first `name : value` of Linux's `/proc/cpuinfo`; "" where there is none.

    The key must match whole: "model" is not "model name".
    """
    try:
        with open("/proc/cpuinfo") as file:
            for line in file:
                key, colon, value = line.partition(":")
                if colon and key.strip() == name:
                    return value.strip()
    except OSError:
        pass
    return ""


def _cpu_flags():
    return frozenset(_cpuinfo_field("flags").split())


def model_name():
    """The CPU's `model name` from `/proc/cpuinfo` (e.g. "AMD EPYC"); "" where unknown."""
    return _cpuinfo_field("model name")


def family_and_model():
    """The CPU's `(cpu family, model)` numbers from `/proc/cpuinfo`; None where unknown.

    Virtual machines often report only "AMD EPYC" as the model name, which
    covers generations as far apart as Zen 1 (family 23, model 1), Zen 2
    (23, 49) and Zen 4 (25, 17): only these numbers tell them apart in a
    benchmark's record.
    """
    family, model = _cpuinfo_field("cpu family"), _cpuinfo_field("model")
    if not (family.isdigit() and model.isdigit()):
        return None
    return int(family), int(model)


def instruction_sets():
    """`MATMUL_INSTRUCTION_SETS` the CPU reports (Linux `/proc/cpuinfo`; elsewhere none)."""
    flags = _cpu_flags()
    return [name for name in MATMUL_INSTRUCTION_SETS if name in flags]


def has_amx():
    """Whether the CPU has AMX bfloat16 tiles (`amx_bf16`), which oneDNN's matmul uses."""
    return "amx_bf16" in _cpu_flags()


def bfloat16_unit():
    """The CPU's bfloat16 matmul hardware: `"amx"`, `"avx512_bf16"` or `None`.

    `None` means oneDNN converts bfloat16 operands to float32 and multiplies
    in float32, so mixed bfloat16 saves memory traffic but no arithmetic: on
    an AVX2-only AMD EPYC it trained at 0.67x of float32 (docs/performance.md;
    plain AVX-512 without BF16 was not measured).
    """
    if has_amx():
        return "amx"
    if "avx512_bf16" in _cpu_flags():
        return "avx512_bf16"
    return None


def onednn_enabled():
    """Whether TensorFlow runs its oneDNN CPU kernels in this process.

    TensorFlow decides once, when it starts, from `TF_ENABLE_ONEDNN_OPTS` and
    the CPU (capsnet_tf sets the variable to 1 unless it is set; see
    `capsnet_tf/__init__.py`). None where TensorFlow does not say (the
    answer comes from a private module of TensorFlow 2.x).
    """
    try:
        from tensorflow.python.util import _pywrap_util_port
    except ImportError:
        return None
    return bool(_pywrap_util_port.IsMklEnabled())


def usable_cores():
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1


def accelerated():
    """Whether TensorFlow sees a GPU or a TPU, where the CPU's kernels are not the ones used."""
    import tensorflow as tf

    return bool(tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("TPU"))
