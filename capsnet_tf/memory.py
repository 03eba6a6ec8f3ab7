"""The peak memory of a CapsNet training step, estimated before anything is built.

CapsNet's memory grows with the number of primary capsules, which grows with
the image's area: the votes `u_hat` hold `batch x primary capsules x classes x
16` values, and every routing iteration keeps couplings and agreements of
`batch x primary capsules x classes`. At 128x128 the paper's layers give
56x56x32 = 100,352 primary capsules; a training step there needs tens of GiB.
`estimate_training_memory` counts, from the layer sizes alone, the bytes that
a training step holds at its peak, so that a script can say before building
the model whether a configuration fits (`check_fits`) and which options bring
it down (`MEMORY_OPTIONS`, configuration fields that a script names as its
flags: `InsufficientMemoryError.describe`).

What is counted (float32, 4 bytes a value; the batch's share is per example):

- the weights, their gradients and Adam's two slots (4 copies), plus the
  class-capsule kernel's transposed copy and its gradient (the vote product
  reads the kernel as `[in, 8, classes * 16]`);
- the activations kept for the backward pass and their gradients: each stem
  convolution and `conv1` (2 copies), the input each of them unfolds (im2col:
  `positions x kernel area x input channels`) for its kernel's gradient in
  TensorFlow's CPU convolutions (1), the PrimaryCaps patches where its
  convolution runs as im2col and a matmul (`capsnet_tf.kernels`: CPUs,
  `valid` padding; `positions x 9 x 9 x 256`, saved for the kernel's
  gradient: 1) and their gradient (1: in float32, which this estimate
  counts, the input's gradient is a matmul into patch-sized gradients that
  two fold matmuls sum back, `kernels.col2im`, through one intermediate 0.37
  of the patches' size, counted too; only the bfloat16 form of CPUs with
  AVX-512 BF16 and no AMX, `im2col_backprop_input`, takes a backward
  convolution that makes none), the primary poses (4:
  convolution output, transposed, squashed, gradient), the votes (4: the product's
  output, its output-major transpose, and both gradients), the routing's
  logits, couplings and agreements of every iteration (3, with gradients 6)
  and the decoder's layers (2);
- the input pipeline's in-memory copies (`pipeline_bytes`);
- the copies of the weights and Adam's slots made while the backup is
  written (3 copies of the parameters; measured on top of the step's peak);
- TensorFlow's own resident memory (libraries, kernels, the traced graph,
  the XLA-compiled routing): a constant, `TENSORFLOW_BASELINE_BYTES`, the
  peak resident memory (VmHWM) of a CapsNet too small for its tensors to
  matter (one primary capsule type, batch 1) trained for a few steps, less
  the estimate of those tensors (`benchmarks/memory/measure.py --baseline`).

The counts are what the layers' code materialises, not factors fitted to
one measurement; three were settled by the measurements of
`benchmarks/memory/measure.py` across eleven configurations (one copy of the
patches and of the unfolded inputs, where the executor's order decides
between one and two; the backup's three copies on top of the step). The
estimate against measured peaks (VmHWM), and how it moved with the code, is
in `docs/experiments.md` (results in `benchmarks/memory/`).
All counts are float32; a mixed bfloat16 run holds less.
Accelerators are not covered: there the activations live in device memory.
"""

import dataclasses
import inspect
import math
import os

from capsnet_tf import cpu, kernels
from capsnet_tf.models.grid import capsule_counts

__all__ = [
    "MEMORY_OPTIONS",
    "TENSORFLOW_BASELINE_BYTES",
    "InsufficientMemoryError",
    "MemoryEstimate",
    "available_memory",
    "capsule_counts",
    "check_fits",
    "check_run_memory",
    "estimate_run_memory",
    "estimate_training_memory",
    "field_setting",
    "format_bytes",
    "pipeline_bytes",
]

# TensorFlow 2.21 / Keras 3's own resident memory with CapsNet's graph on CPU:
# the peak of a CapsNet too small for its tensors to matter, less those
# tensors (benchmarks/memory/measure.py --baseline; results.json there).
TENSORFLOW_BASELINE_BYTES = 771 * 2**20

# The configuration fields (`ExperimentConfig`) that shrink a training step,
# in the order worth trying: `(field, the setting that helps or None, why)`.
# A script names them as its flags (`InsufficientMemoryError.describe`).
MEMORY_OPTIONS = (
    ("batch_size", None, "the activations scale with it"),
    ("stem_layers", "1 or 2",
     "each stride-2 stem convolution divides the primary capsules by ~4"),
    ("primary_strides", "3 or 4", "fewer PrimaryCaps positions"),
    ("image_size", None, "resize the images"),
    ("primary_capsule_types", None, "fewer capsules per position"),
    ("reconstruction", False, "no decoder: saves its H*W*C*1024 weights"),
)

_FLOAT = 4


def field_setting(field, setting):
    """A configuration field and the setting that helps: `stem_layers=1 or 2`, `batch_size`."""
    return field if setting is None else f"{field}={setting}"


class InsufficientMemoryError(ValueError):
    """A configuration needs more memory than the machine has.

    Its message names the options of `MEMORY_OPTIONS` as configuration
    fields; `describe(option_name)` says the same naming them otherwise
    (a script: as its flags).

    Args:
        estimate: the `MemoryEstimate` that does not fit.
        available: the bytes available.
        source: where `available` comes from.
    """

    def __init__(self, estimate, available, source):
        self.estimate, self.available, self.source = estimate, available, source
        super().__init__(self.describe())

    def __reduce__(self):
        return type(self), (self.estimate, self.available, self.source)

    def describe(self, option_name=field_setting):
        """The message in one line, each option of `MEMORY_OPTIONS` named by `option_name`.

        Args:
            option_name: `(field, setting) -> text`, e.g. `--stem_layers=1 or 2`
                for a script's flags (`setting` None: any smaller value;
                False: the option off).
        """
        estimate = self.estimate
        options = "; ".join(
            f"{option_name(field, setting)} ({why})" for field, setting, why in MEMORY_OPTIONS
        )
        return (
            f"This configuration needs about {format_bytes(estimate.total)} for a training "
            f"step at batch size {estimate.batch_size} ({estimate.primary_capsules:,} primary "
            f"capsules; votes and routing {format_bytes(_routing_part(estimate))}), but "
            f"{format_bytes(self.available)} is available ({self.source}). Bring it down "
            f"with: {options}."
        )


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """Bytes of a training step at its peak, by part.

    Attributes:
        parts: `{name: bytes}`; their sum is `total`.
        parameters: trainable parameters of the model.
        primary_capsules: number of primary capsules.
        batch_size: the batch the activations are counted for.
    """

    parts: dict
    parameters: int
    primary_capsules: int
    batch_size: int

    @property
    def total(self):
        return sum(self.parts.values())

    def describe(self):
        """One line: the total, then each part."""
        parts = ", ".join(f"{name} {format_bytes(size)}" for name, size in self.parts.items())
        return (
            f"Estimated peak memory of a training step at batch size {self.batch_size}: "
            f"{format_bytes(self.total)} ({self.primary_capsules:,} primary capsules, "
            f"{self.parameters:,} parameters; {parts})"
        )


def format_bytes(size):
    """`1.23 GiB`, `456 MiB`."""
    if size >= 2**30:
        return f"{size / 2**30:.2f} GiB"
    return f"{size / 2**20:.0f} MiB"


def estimate_training_memory(
    image_shape,
    num_classes,
    batch_size,
    *,
    im2col=True,
    data_bytes=0,
    baseline_bytes=TENSORFLOW_BASELINE_BYTES,
    checkpoints=True,
    **capsnet_arguments,
):
    """The peak memory of one CapsNet training step with Adam (see the module).

    Args:
        image_shape: `(height, width, channels)`.
        num_classes: class capsules.
        batch_size: examples per step.
        im2col: count PrimaryCaps' forms on a CPU (True), where
            `capsnet_tf.kernels` runs a `valid` convolution as im2col and
            one matmul, which materialises its patches; on an accelerator
            (False), where it stays a convolution; or on this machine
            (None).
        data_bytes: the input pipeline's memory (`pipeline_bytes`).
        baseline_bytes: TensorFlow's own resident memory.
        checkpoints: the run writes checkpoints and backups (as
            `experiments/mnist.py` does): count their copies of the weights.
        **capsnet_arguments: any other `CapsNet` arguments (`stem_layers`,
            `primary_strides`, `reconstruction`, ...); the rest take
            `CapsNet`'s own defaults, so the estimate counts the model that
            `CapsNet(image_shape, num_classes, **capsnet_arguments)` builds.

    Returns:
        A `MemoryEstimate`.

    Raises:
        TypeError: an argument that `CapsNet` does not take.
    """
    arguments = _capsnet_arguments(capsnet_arguments)
    stem, conv, grid, primary = capsule_counts(
        image_shape, arguments["stem_layers"], arguments["conv_kernel_size"],
        arguments["primary_capsule_types"], arguments["primary_kernel_size"],
        arguments["primary_strides"], arguments["padding"],
    )
    params, capsule_kernel = _count_parameters(arguments, image_shape, num_classes, stem,
                                               primary)
    per_example = _activation_values(arguments, image_shape, num_classes, stem, conv, grid,
                                     primary, im2col)
    parts = {
        "tensorflow": baseline_bytes,
        "weights_gradients_adam": _FLOAT * (4 * params + 2 * capsule_kernel),
    }
    for name, values in per_example.items():
        if values:
            parts[name] = _FLOAT * values * batch_size
    if checkpoints:
        # Writing the backup copies the weights and both Adam slots out of
        # TensorFlow; measured, the process's peak grows by about that much
        # on top of the step's (the step's freed memory is not all returned
        # to the system, so the copies do not fit into it).
        parts["checkpoint_writing"] = _FLOAT * 3 * params
    if data_bytes:
        parts["input_pipeline"] = int(data_bytes)
    return MemoryEstimate(
        parts=parts, parameters=params, primary_capsules=primary, batch_size=batch_size
    )


def _count_parameters(arguments, image_shape, num_classes, stem, primary):
    """`(parameters, class-capsule kernel's parameters)` of the CapsNet of `arguments`."""
    stem_filters, conv_filters = arguments["stem_filters"], arguments["conv_filters"]
    primary_kernel_size = arguments["primary_kernel_size"]
    primary_capsule_dim, capsule_dim = arguments["primary_capsule_dim"], arguments["capsule_dim"]
    height, width, channels = (int(size) for size in image_shape)
    params = 0
    in_channels = channels
    for _ in stem:
        params += 9 * in_channels * stem_filters + stem_filters
        in_channels = stem_filters
    params += arguments["conv_kernel_size"]**2 * in_channels * conv_filters + conv_filters
    primary_filters = arguments["primary_capsule_types"] * primary_capsule_dim
    params += primary_kernel_size**2 * conv_filters * primary_filters + primary_filters
    capsule_kernel = primary * num_classes * primary_capsule_dim * capsule_dim
    params += capsule_kernel + num_classes * capsule_dim
    if arguments["reconstruction"]:
        units = [num_classes * capsule_dim, *arguments["decoder_units"], height * width * channels]
        params += sum(a * b + b for a, b in zip(units[:-1], units[1:]))
    return params, capsule_kernel


def _activation_values(arguments, image_shape, num_classes, stem, conv, grid, primary, im2col):
    """`{part: values}` a training step holds for one example (see the module docstring)."""
    stem_filters, conv_filters = arguments["stem_filters"], arguments["conv_filters"]
    conv_kernel_size, primary_kernel_size = (
        arguments["conv_kernel_size"], arguments["primary_kernel_size"]
    )
    decoder_units, reconstruction = arguments["decoder_units"], arguments["reconstruction"]
    height, width, channels = (int(size) for size in image_shape)
    pixels = height * width * channels
    stem_values = sum(h * w * stem_filters for h, w in stem)
    conv_values = conv[0] * conv[1] * conv_filters
    patches = grid[0] * grid[1] * primary_kernel_size**2 * conv_filters
    device = None if im2col is None else "cpu" if im2col else "accelerator"
    primary_im2col = kernels.convolution_form(
        "float32", arguments["padding"], kernels="this_machine", device=device
    ) != "conv"  # a training call: the estimate is of training
    # TensorFlow's CPU convolutions unfold their input (im2col) for the
    # kernel's gradient: output positions x kernel area x input channels.
    workspace = 0
    in_channels = channels
    for h, w in stem:
        workspace += h * w * 9 * in_channels
        in_channels = stem_filters
    workspace += conv[0] * conv[1] * conv_kernel_size**2 * in_channels
    votes = primary * num_classes * arguments["capsule_dim"]
    routing = primary * num_classes * arguments["routing_iterations"]
    decoder = sum(decoder_units) + 2 * pixels if reconstruction else 0
    return {
        "convolutions": 2 * (stem_values + conv_values) + pixels,
        "convolution_unfolding": workspace,
        "primary_patches": patches if primary_im2col else 0,
        "primary_patch_gradients": patches if primary_im2col else 0,
        # `_col2im`'s first fold, `[batch * out_w, height, k * channels]`:
        # it and the patch gradients it reads are held at once.
        "primary_patch_fold": (
            grid[1] * conv[0] * primary_kernel_size * conv_filters if primary_im2col else 0
        ),
        "primary_poses": 4 * primary * arguments["primary_capsule_dim"],
        "votes": 4 * votes,
        "routing": 6 * routing,
        "decoder": 2 * decoder,
    }


def _capsnet_arguments(overrides):
    """`CapsNet`'s keyword defaults updated with `overrides` (checked by name)."""
    from capsnet_tf.models.capsnet import CapsNet

    defaults = {
        name: parameter.default
        for name, parameter in inspect.signature(CapsNet.__init__).parameters.items()
        if parameter.default is not inspect.Parameter.empty
    }
    unknown = sorted(set(overrides) - set(defaults))
    if unknown:
        raise TypeError(
            f"Not CapsNet arguments: {', '.join(unknown)}. "
            f"Received: {', '.join(f'{name}={overrides[name]!r}' for name in unknown)}"
        )
    return {**defaults, **overrides}


def pipeline_bytes(num_examples, image_shape, batch_size, shuffle_buffer, cached_bytes=1,
                   shuffled_bytes=1, prefetch_batches=2):
    """Memory of an in-memory input pipeline: the cache, the shuffle buffer, prefetching.

    Args:
        num_examples: examples held in memory (the training split).
        image_shape: `(height, width, channels)` of one stored image.
        batch_size: examples per batch.
        shuffle_buffer: the shuffle buffer's size (capped at `num_examples`).
        cached_bytes, shuffled_bytes: bytes per value of the cached and of the
            shuffled elements (1 for uint8, 4 for float32).
        prefetch_batches: float32 batches waiting in the prefetch buffer.
    """
    values = math.prod(int(size) for size in image_shape)
    return values * (
        num_examples * cached_bytes
        + min(shuffle_buffer, num_examples) * shuffled_bytes
        + prefetch_batches * batch_size * _FLOAT
    )


def available_memory():
    """`(bytes, source)`: what this process may still use.

    `MemAvailable` of `/proc/meminfo`, or the cgroup's limit minus its usage
    when that is lower (a container); None when neither can be read.
    """
    candidates = []
    try:
        with open("/proc/meminfo") as file:
            for line in file:
                if line.startswith("MemAvailable:"):
                    candidates.append((int(line.split()[1]) * 1024, "MemAvailable"))
    except OSError:
        pass
    for limit_path, usage_path in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
         "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            with open(limit_path) as file:
                limit = file.read().strip()
            with open(usage_path) as file:
                usage = int(file.read().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 2**60:
            candidates.append((int(limit) - usage, "the cgroup's memory limit"))
        break
    if not candidates:
        return None, None
    return min(candidates)


def check_fits(estimate, available=None, source="MemAvailable"):
    """Raises `InsufficientMemoryError` (one line) when `estimate` exceeds the available memory.

    Args:
        estimate: a `MemoryEstimate`.
        available: bytes available (None: `available_memory()`).
        source: where `available` comes from, for the message.

    The environment variable `CAPSNET_MEMORY_LIMIT` (bytes, or e.g. `8G`)
    replaces the machine's figure, e.g. to leave room for other processes;
    `CAPSNET_MEMORY_LIMIT=off` skips the check (the estimate errs by up to a
    fifth, and swap may be there).
    """
    override = os.environ.get("CAPSNET_MEMORY_LIMIT", "").strip()
    if override.lower() in ("off", "none"):
        return
    if override:
        available, source = _parse_size(override), "$CAPSNET_MEMORY_LIMIT"
    elif available is None:
        available, source = available_memory()
        if available is None:
            return
    if estimate.total <= available:
        return
    raise InsufficientMemoryError(estimate, available, source)


def estimate_run_memory(config, spec, test_examples=0):
    """The `MemoryEstimate` of a training step of an `ExperimentConfig` on `spec`'s data.

    Counts the CapsNet of `config` for `spec`'s images and classes at
    `config.batch_size`, and the in-memory input pipeline: the uint8
    training and `test_examples` test images and the shuffle buffer (float32
    for the built-in MNIST-style pipelines, which scale before shuffling;
    uint8 for image folders and other TFDS sets). None for the baseline CNN.
    """
    from capsnet_tf.config import capsnet_options
    from capsnet_tf.data.registry import DATASETS

    if config.model != "capsnet":
        return None
    examples = min(config.train_examples or spec.num_examples, spec.num_examples)
    own = config.dataset not in DATASETS
    data = pipeline_bytes(
        examples, spec.image_shape, config.batch_size, 10_000, shuffled_bytes=1 if own else 4
    ) + pipeline_bytes(test_examples, spec.image_shape, config.batch_size, 0)
    return estimate_training_memory(
        spec.image_shape,
        spec.num_classes,
        config.batch_size,
        im2col=None,
        data_bytes=data,
        **capsnet_options(config),
    )


def check_run_memory(config, spec, test_examples=0):
    """Logs the estimated peak memory of a training step; refuses one that cannot fit.

    On CPUs only: with a GPU or TPU the activations are in device memory,
    which this estimate does not cover.

    Returns:
        The `MemoryEstimate` (None for the baseline CNN).

    Raises:
        InsufficientMemoryError: the estimate exceeds the memory available
            (one line: needed, available, the options that help).
    """
    from absl import logging

    estimate = estimate_run_memory(config, spec, test_examples)
    if estimate is None:
        return None
    logging.info("%s", estimate.describe())
    if not cpu.accelerated():
        check_fits(estimate)
    return estimate


def _routing_part(estimate):
    return sum(estimate.parts.get(name, 0) for name in ("votes", "routing"))


def _parse_size(text):
    text = text.strip().upper().rstrip("B").rstrip("I")
    scale = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}.get(text[-1:], 1)
    number = text[:-1] if text[-1:] in "KMGT" else text
    try:
        return int(float(number) * scale)
    except ValueError:
        raise ValueError(
            f"$CAPSNET_MEMORY_LIMIT must be bytes or a size such as 8G. Received: {text!r}"
        ) from None
