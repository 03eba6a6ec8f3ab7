"""`ExperimentConfig`: every option of a training run, each defined once.

Each field names its default, its help text, and its bounds or choices in
one place (`option(...)`). Everything else is derived from that definition:

- `ExperimentConfig.validate()` checks every bound and choice (plus the few
  rules that relate two fields) and raises `ValueError` naming the field;
- `experiments/mnist.py` defines one absl flag per field (same name, unless
  the field gives another `flag`, e.g. `--min_learning_rate`), with the
  field's help, bounds and choices, and builds the config from the flags;
- the field docs of the class are its `help` texts (`describe_options`).

So adding an option touches one place. Field names are those of the saved
`config.json` files, which keeps earlier work directories readable.
"""

import dataclasses
import json
import re

from capsnet_tf.data.images import parse_image_size
from capsnet_tf.data.pipeline import SHIFT_MODES
from capsnet_tf.data.registry import DATASETS, IMAGE_FOLDER
from capsnet_tf.models.baseline import CNN_MODELS

# Keras's global dtype policy for each `mixed_precision` value but "auto",
# which resolves to one of them for the hardware (`cpu.choose_precision`).
PRECISION_POLICIES = {
    "float32": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}

__all__ = [
    "CAPSNET_FIELDS",
    "MODEL_FIELDS",
    "PRECISION_POLICIES",
    "ExperimentConfig",
    "capsnet_options",
    "describe_options",
    "option",
]

# The data sets a run can train on (affNIST is a test set of expanded_mnist runs).
TRAINABLE_DATASETS = tuple(name for name in DATASETS if name != "affnist")
# The data sets read by `make_dataset`, whose training images can be held out
# (`validation_examples`) or shifted by sub-pixel offsets (`shift_mode`).
_MNIST_STYLE = ("mnist", "fashion_mnist")
# A TFDS name, optionally with a config and a version: "eurosat/rgb:2.0.0".
_TFDS_NAME = re.compile(r"[a-z][a-z0-9_]*(/[A-Za-z0-9_.-]+)?(:[0-9.*]+)?")


def option(default, help, *, choices=None, lower=None, upper=None, flag=None, kind=None):
    """A dataclass field of `ExperimentConfig` with its help, bounds and choices.

    Args:
        default: the default value (None: unset).
        help: one or two sentences for `--help` and the docs.
        choices: the allowed values (an enum flag).
        lower, upper: inclusive bounds of a number.
        flag: the flag's name when it differs from the field's.
        kind: the flag type when the default does not tell it: `"string"`,
            `"integer"`, `"float"`, `"bool"`, `"list"`.

    Returns:
        A `dataclasses.field`.
    """
    metadata = {
        "help": help, "choices": choices, "lower": lower, "upper": upper, "flag": flag,
        "kind": kind,
    }
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass
class ExperimentConfig:
    """Everything that defines a training run; defaults are the official MNIST run.

    Every field's meaning, default and bounds are in its `option(...)`
    definition below (and in `experiments/mnist.py --help`, which is built
    from them); `describe_options()` lists them.
    """

    # === Data ===
    dataset: str = option(
        "mnist",
        "Data set: TFDS mnist / fashion_mnist / cifar10 / smallnorb, or generated from "
        "MNIST: multi_mnist (two overlapping digits, 36x36), expanded_mnist (40x40, "
        "shifted; also evaluated on an affNIST-style test set); or the name of any other "
        "prepared TFDS image-classification data set (an image and a label feature, e.g. "
        "kmnist, cifar100, tf_flowers with --image_size). --image_folder replaces it.",
        kind="string",
    )
    image_folder: str | None = option(
        None,
        "Train on your own images instead of --dataset: a folder with one sub-folder of "
        "JPEG/PNG/BMP/GIF files per class (class names = sub-folder names), or with train/ "
        "and test/ folders of that layout. Without them --test_fraction of each class is "
        "held out as the test set (seeded by --seed). Image size, channels and classes "
        "come from the files.",
        kind="string",
    )
    image_size: tuple | None = option(
        None,
        "Resize every image to this size: one number (square) or height,width, e.g. 64 or "
        "96,128. Default: the images' own size (--image_folder: all must share it).",
        kind="list",
    )
    horizontal_flip: bool = option(
        False,
        "--image_folder and other TFDS data sets: mirror training images left-right at "
        "random (for photographs; not for digits or text).",
    )
    test_fraction: float = option(
        0.2,
        "--image_folder without train/ and test/ folders: the share of each class's images "
        "held out as the test set.",
        lower=0.01,
        upper=0.9,
    )
    data_dir: str | None = option(
        None, "TFDS data directory (default: $TFDS_DATA_DIR or ~/tensorflow_datasets).",
        kind="string",
    )
    shift: int = option(2, "Maximum random shift of training images, pixels.", lower=0)
    shift_mode: str = option(
        "whole_pixels",
        "How --shift translates mnist and fashion_mnist training images: whole_pixels (the "
        "official release: integer offsets, zero fill) or subpixel (real offsets drawn "
        "uniformly from [-shift, shift] on each axis, bilinear interpolation, zero fill, as "
        "the shifts of Keras's ImageDataGenerator in CapsNet-Keras).",
        choices=SHIFT_MODES,
    )
    unshifted_final_epochs: int = option(
        0,
        "Train the last N epochs on unshifted images (the test set's distribution) instead of "
        "shifting them by up to --shift pixels; 0: shift every epoch (the official runs).",
        lower=0,
    )
    train_examples: int | None = option(
        None, "Train on the first N training examples only.", lower=1, kind="integer"
    )
    eval_examples: int | None = option(
        None, "Evaluate on the first N test examples only.", lower=1, kind="integer"
    )
    validation_examples: int | None = option(
        None,
        "mnist/fashion_mnist: hold out the last N training images as a validation split "
        "(never trained on or augmented) that chooses the best checkpoint; the test set is "
        "then evaluated every epoch beside it but selects nothing. Default: none (the "
        "official behaviour: the test set is the validation data).",
        lower=1,
        kind="integer",
    )
    test_pairs_per_image: int = option(
        1, "multi_mnist: test pairs per MNIST test image (the paper used 1000).", lower=1
    )
    affnist_path: str | None = option(
        None,
        "expanded_mnist: real affNIST test data (test.mat or .npz) instead of the generated set.",
        kind="string",
    )
    # === Training ===
    epochs: int = option(1, "Training epochs.", lower=1)
    batch_size: int = option(128, "Batch size.", lower=1)
    steps_per_epoch: int | None = option(
        None, "Stop each epoch after this many steps.", lower=1, kind="integer"
    )
    learning_rate: float = option(1e-3, "Adam's initial (peak) learning rate.", lower=0.0)
    schedule: str = option(
        "exponential",
        "Learning-rate schedule: exponential (official: x --decay_rate every --decay_steps, "
        "floor --min_learning_rate) or cosine (linear warm-up over --warmup_epochs from a "
        "tenth of --learning_rate, then cosine decay to --min_learning_rate at the last epoch).",
        choices=("exponential", "cosine"),
    )
    warmup_epochs: float = option(0.0, "--schedule=cosine: epochs of linear warm-up.", lower=0.0)
    decay_steps: int = option(2000, "Steps per learning-rate decay of --decay_rate.", lower=1)
    decay_rate: float = option(0.96, "Learning-rate decay factor.", lower=0.0, upper=1.0)
    minimum_learning_rate: float = option(
        1e-6, "Floor of the learning rate (the cosine's end).", lower=0.0,
        flag="min_learning_rate",
    )
    ema_momentum: float = option(
        0.0,
        "Evaluate, checkpoint and export an exponential moving average of the weights, "
        "updated every step with this momentum (0.999: about the last 1,000 steps), while "
        "training the weights themselves (Keras's use_ema); 0: the weights as trained (the "
        "official runs).",
        lower=0.0,
        upper=0.99999,
    )
    target_accuracy: float | None = option(
        None,
        "Stop at the first epoch whose held-out accuracy reaches this (e.g. 0.995) and record "
        "the wall-clock time from the command's start (time_to_target.json, results.json): "
        "the test set's accuracy, or with --validation_examples the validation split's (a "
        "stop is a model choice, which the test set never makes).",
        lower=0.0,
        upper=1.0,
        kind="float",
    )
    seed: int = option(0, "Seed of initialisation, shuffling and augmentation.")
    # === Model ===
    model: str = option(
        "capsnet",
        "capsnet; baseline: the paper's Table 1 CNN (no pooling); pooled_cnn: section 5.2's "
        "affNIST comparison CNN (max pooling and dropout, the official conv_model).",
        choices=("capsnet", *CNN_MODELS),
    )
    routing_iterations: int = option(3, "Routing iterations in the class capsules.", lower=1)
    leaky_routing: bool = option(False, "Leaky routing.")
    reconstruction: bool = option(True, "Train the decoder with the reconstruction loss.")
    reconstruction_weight: float = option(
        0.0005, "Weight of the summed squared error.", lower=0.0
    )
    margin_class_reduction: str = option(
        "sum",
        "Margin loss over classes: 'sum' (paper) or 'official' (0.5 x mean).",
        choices=("sum", "official"),
    )
    stem_layers: int = option(
        0,
        "Larger images: 3x3 stride-2 ReLU convolutions before conv1 (0: the paper's model). "
        "Each halves the PrimaryCaps grid, so divides the primary capsules, the votes, the "
        "routing memory and the class-capsule weights by about 4.",
        lower=0,
        upper=4,
    )
    stem_filters: int = option(32, "Filters of each --stem_layers convolution.", lower=1)
    primary_strides: int = option(
        2,
        "Stride of the PrimaryCaps convolution (paper: 2). 3 or 4 give ~2.3x or ~4x fewer "
        "primary capsules, votes and routing memory on large images.",
        lower=1,
    )
    official_primary_scaling: bool = option(
        False, "Divide PrimaryCaps pre-activations by the number of types."
    )
    vote_scaling: str = option(
        "auto",
        "capsule_count: scale the class capsules' votes by classes / 10 x sqrt(1152 / "
        "primary capsules) (at most 1; 1 for MNIST); with thousands of primary capsules the "
        "first optimizer steps otherwise saturate every class capsule (lengths near 1) and "
        "the run stays at chance. none: the paper's votes. "
        "auto: capsule_count for --image_folder and other TFDS data sets, none for the "
        "paper's data sets.",
        choices=("auto", "none", "capsule_count"),
    )
    initializer: str = option("keras", "Weight initialisers.", choices=("keras", "official"))
    padding: str = option(
        "valid", "Padding of both convolutions (CIFAR-10: same).", choices=("valid", "same")
    )
    primary_capsule_types: int = option(
        32, "Capsule maps in PrimaryCaps (CIFAR-10: 64).", lower=1
    )
    num_trials: int = option(
        1, "Train this many models (seeds seed, seed+1, ...) and evaluate their ensemble.",
        lower=1,
    )
    # === Execution ===
    jit_compile: bool = option(
        False,
        "Compile the whole train/eval steps with XLA (for GPUs/TPUs; on CPUs XLA's "
        "convolutions are far slower). The routing is XLA-compiled in training either way.",
    )
    mixed_precision: str = option(
        "float32",
        "Compute precision: float32, mixed bfloat16 or float16, or auto: mixed bfloat16 where "
        "the hardware multiplies bfloat16 natively (AMX, AVX-512 BF16, GPUs of compute "
        "capability 8.0+, TPUs), mixed float16 with loss scaling on GPUs of capability 7.x, "
        "float32 elsewhere (AVX2-only CPUs: bfloat16 trains slower there). config.json "
        "records the precision auto resolved to (mixed_precision_resolved).",
        choices=("auto", *PRECISION_POLICIES),
    )
    verbose: str | int = option(
        "auto",
        "Keras verbosity: 1 progress bar, 2 one line/epoch.",
        choices=("auto", 0, 1, 2),
    )
    backup_every_steps: int | None = option(
        100,
        "Also back up the training state every this many steps inside an epoch (besides every "
        "epoch end), so that a killed run, rerun with the same command, loses at most that many.",
        lower=1,
    )
    strategy: str = option(
        "default",
        "Distribution: default (one device); mirrored (all local GPUs, or --devices; one CPU "
        "replica without either); multi_worker (one process per machine, cluster from "
        "$TF_CONFIG); tpu (--tpu). --batch_size is the global batch, split across replicas.",
        choices=("default", "mirrored", "multi_worker", "tpu"),
    )
    devices: tuple | None = option(
        None,
        "--strategy=mirrored only: devices to train on, e.g. /gpu:0,/gpu:1 (or /cpu:0,/cpu:1 "
        "to split the CPU into logical devices). Default: all local GPUs.",
        kind="list",
    )
    tpu: str | None = option(
        None,
        "--strategy=tpu only: TPU name or grpc://host:port address, or 'local' on a TPU VM "
        "(default: $TPU_NAME or the local TPU).",
        kind="string",
    )

    def __post_init__(self):
        # --image_folder replaces --dataset (a flagfile's --dataset=mnist included).
        if self.image_folder:
            self.dataset = IMAGE_FOLDER
        if self.image_size is not None:
            values = (self.image_size,) if isinstance(self.image_size, (int, str)) else (
                self.image_size
            )
            try:
                self.image_size = tuple(int(value) for value in values)
            except (TypeError, ValueError):
                self.image_size = tuple(values)  # validate() names it

    def validate(self):
        """Raises `ValueError` naming the first invalid field."""
        for field in dataclasses.fields(self):
            _check_field(field, getattr(self, field.name))
        if self.dataset == IMAGE_FOLDER and not self.image_folder:
            raise ValueError("`dataset='image_folder'` needs --image_folder=PATH.")
        if self.dataset not in DATASETS and not _TFDS_NAME.fullmatch(self.dataset or ""):
            raise ValueError(
                f"`dataset` must be one of {', '.join(TRAINABLE_DATASETS)} or a TFDS data set "
                f"name such as kmnist or eurosat/rgb. Received: dataset={self.dataset!r}"
            )
        if self.dataset == "affnist":
            raise ValueError(
                "`dataset='affnist'` is a test set only: train on expanded_mnist, which is "
                "evaluated on affNIST as well."
            )
        if self.image_size is not None:
            parse_image_size(self.image_size)
        if not self.learning_rate > 0:
            raise ValueError(f"`learning_rate` must be > 0. Received: {self.learning_rate}")
        if self.warmup_epochs >= self.epochs:
            raise ValueError(
                "`warmup_epochs` must be less than `epochs`. "
                f"Received: warmup_epochs={self.warmup_epochs}, epochs={self.epochs}"
            )
        if self.unshifted_final_epochs > self.epochs:
            raise ValueError(
                "`unshifted_final_epochs` must be at most `epochs`. Received: "
                f"unshifted_final_epochs={self.unshifted_final_epochs}, epochs={self.epochs}"
            )
        if self.shift_mode != "whole_pixels" and self.dataset not in _MNIST_STYLE:
            raise ValueError(
                "`shift_mode` other than whole_pixels applies to mnist and fashion_mnist only. "
                f"Received: shift_mode={self.shift_mode!r}, dataset={self.dataset!r}"
            )
        if self.target_accuracy is not None and self.target_accuracy == 0:
            raise ValueError("`target_accuracy` must be in (0, 1] (0.995 for 99.5%). Received: 0")
        if self.validation_examples is not None and self.dataset not in _MNIST_STYLE:
            raise ValueError(
                "`validation_examples` holds out training images of mnist or fashion_mnist "
                f"only. Received: dataset={self.dataset!r}"
            )
        if self.num_trials > 1 and self.strategy == "multi_worker":
            raise ValueError(
                "`num_trials` > 1 (an ensemble) cannot run under the multi_worker "
                "strategy: train the members as separate multi-worker runs with "
                "different --seed values instead."
            )
        return self

    def to_json(self):
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)


def _check_field(field, value):
    meta = field.metadata
    name = field.name
    if value is None and field.default is None:
        return
    if meta["choices"] is not None:
        if value not in meta["choices"]:
            allowed = ", ".join(str(choice) for choice in meta["choices"])
            raise ValueError(f"`{name}` must be one of {allowed}. Received: {name}={value!r}")
        return
    integer = isinstance(field.default, int) or meta["kind"] == "integer"
    if isinstance(field.default, bool) or meta["kind"] in ("string", "list"):
        return
    if integer and (not isinstance(value, int) or isinstance(value, bool)):
        raise ValueError(f"`{name}` must be an integer. Received: {name}={value!r}")
    if meta["lower"] == 1 and integer and value < 1:
        raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
    if meta["lower"] is not None and value < meta["lower"]:
        raise ValueError(f"`{name}` must be >= {meta['lower']}. Received: {name}={value!r}")
    if meta["upper"] is not None and value > meta["upper"]:
        raise ValueError(f"`{name}` must be <= {meta['upper']}. Received: {name}={value!r}")


# The fields that are `CapsNet` arguments of the same names: the one mapping
# from a run's options to its model, used to build the model
# (`training.build_model`) and to estimate its memory (`memory`).
CAPSNET_FIELDS = (
    "padding",
    "primary_capsule_types",
    "stem_layers",
    "stem_filters",
    "primary_strides",
    "routing_iterations",
    "leaky_routing",
    "reconstruction",
    "official_primary_scaling",
    "vote_scaling",
    "initializer",
)


# The fields that define the model (its weights' shapes or its function): a work
# directory saved with other values holds another model.
MODEL_FIELDS = ("model", "dataset", "image_folder", "image_size", *CAPSNET_FIELDS)


def capsnet_options(config):
    """`{argument: value}`: the `CapsNet` arguments that an `ExperimentConfig` sets.

    `vote_scaling="auto"` resolves here: the paper's votes for the paper's
    data sets, `"capsule_count"` for an image folder or another TFDS data set.
    """
    options = {name: getattr(config, name) for name in CAPSNET_FIELDS}
    if options["vote_scaling"] == "auto":
        options["vote_scaling"] = "none" if config.dataset in DATASETS else "capsule_count"
    return options


def describe_options():
    """`[(name, default, help), ...]` of every `ExperimentConfig` field, in order."""
    return [
        (field.name, field.default, field.metadata["help"])
        for field in dataclasses.fields(ExperimentConfig)
    ]
