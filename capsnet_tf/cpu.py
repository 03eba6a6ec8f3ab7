"""What the CPU can do, as far as the choice of a kernel depends on it.

The fastest form of a computation differs between the kinds of x86 CPU this
project has been measured on: Intel Xeons with AMX (tile matrix units that run
bfloat16 matmuls at two to three times the AVX-512 rate), AMD EPYC Zen 4
(AVX-512 BF16, no AMX) and AMD EPYC Zen 1 and Zen 2 (AVX2 only: bfloat16 is
converted to float32 for every product, so mixed bfloat16 is slower than
float32).
`capsnet_tf.kernels`, which picks the layers' forms, asks here; no layer does.
"""

import functools
import os

__all__ = [
    "MATMUL_INSTRUCTION_SETS", "accelerated", "bfloat16_unit", "choose_precision",
    "family_and_model", "has_amx", "instruction_sets", "model_name", "onednn_enabled",
    "usable_cores", "vector_unit",
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


# oneDNN's own cap on the instructions it uses (`ONEDNN_MAX_CPU_ISA`, or
# `DNNL_MAX_CPU_ISA`), as the most capable unit of `vector_unit` it leaves:
# a value starting with the key (the longest that matches).
_ISA_CAPS = (
    ("AVX10_1_512_AMX", "amx"),
    ("AVX512_CORE_AMX", "amx"),
    ("AVX10_1_512", "avx512_bf16"),
    ("AVX512_CORE_FP16", "avx512_bf16"),
    ("AVX512_CORE_BF16", "avx512_bf16"),
    ("AVX512_CORE", "avx512"),
    ("AVX2", "avx2"),
    ("AVX", "other"),
    ("SSE41", "other"),
)
_UNITS = ("other", "avx2", "avx512", "avx512_bf16", "amx")


def _isa_cap():
    """The unit oneDNN is capped at by its environment variable; None where it is not."""
    value = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "")
    value = value.strip().upper()
    for prefix, unit in _ISA_CAPS:
        if value.startswith(prefix):
            return unit
    return None


def vector_unit():
    """The widest matmul hardware oneDNN may use here.

    `"amx"` (AMX bfloat16 tiles), `"avx512_bf16"` (AVX-512 with bfloat16
    dot products), `"avx512"`, `"avx2"` (with FMA) or `"other"`: from the
    CPU's flags, lowered to `ONEDNN_MAX_CPU_ISA` where that variable caps
    oneDNN (so a process told to run AVX2 kernels is treated as an AVX2 CPU).
    """
    flags = _cpu_flags()
    if "amx_bf16" in flags:
        unit = "amx"
    elif "avx512_bf16" in flags:
        unit = "avx512_bf16"
    elif "avx512f" in flags:
        unit = "avx512"
    elif "avx2" in flags and "fma" in flags:
        unit = "avx2"
    else:
        unit = "other"
    cap = _isa_cap()
    if cap is not None and _UNITS.index(cap) < _UNITS.index(unit):
        return cap
    return unit


def has_amx():
    """Whether oneDNN may use AMX bfloat16 tiles here (`vector_unit() == "amx"`)."""
    return vector_unit() == "amx"


def bfloat16_unit():
    """The CPU's bfloat16 matmul hardware: `"amx"`, `"avx512_bf16"` or `None`.

    `None` means oneDNN converts bfloat16 operands to float32 and multiplies
    in float32, so mixed bfloat16 saves memory traffic but no arithmetic: on
    an AVX2-only AMD EPYC it trained at 0.67x of float32 (docs/performance.md;
    plain AVX-512 without BF16 was not measured).
    """
    unit = vector_unit()
    return unit if unit in ("amx", "avx512_bf16") else None


def onednn_enabled():
    """Whether TensorFlow runs its oneDNN CPU kernels in this process.

    TensorFlow decides once, when it is first imported, from
    `TF_ENABLE_ONEDNN_OPTS` and the CPU (the experiment scripts set the
    variable to 1 unless it is set; docs/layers.md). None where TensorFlow
    does not say (the answer comes from a private module of TensorFlow 2.x).
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
    """Whether TensorFlow sees a GPU or a TPU, where the CPU's kernels are not the ones used.

    The one place the library asks (`capsnet_tf.kernels.device_kind`, the
    memory estimate, the precision warning).
    """
    import tensorflow as tf

    return bool(tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("TPU"))


def choose_precision(cpu_flags=None, gpu_compute_capabilities=(), tpu=False):
    """What `--mixed_precision=auto` trains in on this hardware, and why.

    Mixed bfloat16 where the hardware multiplies bfloat16 natively: TPUs,
    NVIDIA GPUs of compute capability 8.0 or more (Ampere and later), CPUs
    with AMX or AVX-512 BF16. Mixed float16 on GPUs of compute capability
    7.x (Volta, Turing: float16 tensor cores, no bfloat16); Keras wraps the
    optimizer in a `LossScaleOptimizer` under that policy. float32 elsewhere:
    on an AVX2-only CPU oneDNN converts bfloat16 to float32 for every
    product, and mixed bfloat16 trained at 0.67-0.69x of float32 on AMD EPYC
    (docs/performance.md); GPUs before 7.0 have no tensor cores, and some
    (6.1) compute float16 far slower than float32.

    Args:
        cpu_flags: the CPU's flags as `/proc/cpuinfo` names them
            (`"amx_bf16"`, `"avx512_bf16"`, ...); None: this CPU's.
        gpu_compute_capabilities: `(major, minor)` of each GPU that trains
            (None for one whose capability is unknown); empty: the CPU trains.
            Several GPUs train in one policy, chosen for the oldest.
        tpu: whether the run trains on TPUs.

    Returns:
        `(precision, reason)`: a `--mixed_precision` value other than
        `"auto"` (`"bfloat16"`, `"float16"` or `"float32"`) and a short
        clause saying why.

    Example:

    >>> choose_precision({"avx2", "amx_bf16"})
    ('bfloat16', 'the CPU multiplies bfloat16 natively with AMX')
    >>> choose_precision({"avx2", "fma"})[0]
    'float32'
    >>> choose_precision({"avx2"}, gpu_compute_capabilities=[(7, 5)])[0]
    'float16'
    """
    if tpu:
        return "bfloat16", "TPUs multiply bfloat16 natively"
    capabilities = list(gpu_compute_capabilities)
    if capabilities:
        if any(capability is None for capability in capabilities):
            return "float32", "a GPU of unknown compute capability"
        oldest = min(tuple(capability) for capability in capabilities)
        name = f"GPU compute capability {oldest[0]}.{oldest[1]}"
        if oldest >= (8, 0):
            return "bfloat16", f"{name} multiplies bfloat16 natively"
        if oldest >= (7, 0):
            return "float16", (
                f"{name} has float16 tensor cores but no bfloat16; Keras scales the loss"
            )
        return "float32", f"{name} has no tensor cores"
    flags = _cpu_flags() if cpu_flags is None else frozenset(cpu_flags)
    if "amx_bf16" in flags:
        return "bfloat16", "the CPU multiplies bfloat16 natively with AMX"
    if "avx512_bf16" in flags:
        return "bfloat16", "the CPU multiplies bfloat16 natively with AVX-512 BF16"
    return "float32", (
        "the CPU has no bfloat16 arithmetic, neither AMX nor AVX-512 BF16, so mixed "
        "bfloat16 would train slower than float32"
    )
