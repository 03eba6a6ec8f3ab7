r"""Trains and evaluates CapsNet on MNIST (or Fashion-MNIST) with `model.fit`.

Usage, from the repository root or from `experiments/`:

    python experiments/mnist.py --flagfile=mnist.flags
    python experiments/mnist.py --flagfile=mnist.flags --epochs=1 --workdir=/tmp/capsnet

Your own images, a folder with one sub-folder per class (`--image_folder`
replaces the flagfile's `--dataset`), or any prepared TFDS image data set:

    python experiments/mnist.py --flagfile=mnist.flags --image_folder=PATH --workdir=W
    python experiments/mnist.py --flagfile=mnist.flags --dataset=kmnist --workdir=W

Before the model is built the estimated peak memory of a training step is
logged; a configuration that cannot fit stops with what it needs, what there
is, and the options that bring it down (`capsnet_tf.memory`).

A `--flagfile` path that does not exist relative to the current directory is
looked up next to this script, so `--flagfile=mnist.flags` works from both
places. Flags after the flagfile override it. The work directory receives
`config.json`, the best and latest checkpoints, TensorBoard logs, a CSV log and
`results.json`; rerunning the same command resumes an interrupted run.
"""

import time

_START_TIME = time.time()  # the run's clock (time to --target_accuracy) starts here

import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import errno  # noqa: E402
import logging as std_logging  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402

# TensorFlow's C++ log lines, as Abseil writes them: "I0000 00:00:1796540418.568715
# 5827 port.cc:153] ...". Hidden at start-up: INFO and WARNING lines, Abseil's
# note that they precede absl::InitializeLog, and the CPU-feature note's second
# line; errors only where they say that CUDA is absent (see `_hidden_at_start`).
_CPP_LOG_LINE = re.compile(r"([IWEF])\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [^ \]]+:\d+\] ")
_CPP_START_NOTES = (
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "To enable the following instructions:",
)
# CUDA's absence, reported as an error by the CUDA build of TensorFlow (the
# `tensorflow` package) on a machine with no NVIDIA driver.
_NO_CUDA_ERRORS = ("failed call to cuInit", "Unable to register cu")


def _hidden_at_start(line, nvidia_driver=None):
    """Whether a console line is TensorFlow C++ start-up noise, hidden without --verbosity.

    Kept: everything Python writes, C++ errors and fatal lines, except the
    cuInit failure of a machine without an NVIDIA driver (`nvidia_driver`;
    None: look for `/proc/driver/nvidia`).
    """
    text = line.strip()
    if text.startswith(_CPP_START_NOTES):
        return True
    match = _CPP_LOG_LINE.match(text)
    if match is None:
        return False
    if match.group(1) in "IW":
        return True
    if nvidia_driver is None:
        nvidia_driver = os.path.exists("/proc/driver/nvidia")
    return match.group(1) == "E" and not nvidia_driver and any(
        error in text for error in _NO_CUDA_ERRORS
    )


@contextlib.contextmanager
def _quiet_start():
    """Hides TensorFlow's C++ start-up lines (`_hidden_at_start`) while it loads.

    They are written to file descriptor 2 by C++ static initialisers as the
    shared libraries load, before TensorFlow reads TF_CPP_MIN_LOG_LEVEL, so
    no setting made from Python reaches them. While this is active fd 2 is a
    pipe; a thread forwards every other line to the real stderr as it comes.
    The block came twice: `libtensorflow_framework.so.2` writes it, then
    `tensorflow/python/profiler/internal/_pywrap_profiler_plugin.so`
    (imported by `import tensorflow`), which links its own copies of the
    same TSL and Abseil code, writes it again in the same process.
    """
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to filter (closed by whoever started the script)
        yield
        return
    read_end, write_end = os.pipe()
    with contextlib.suppress(OSError, AttributeError):  # room for a chatty start (Linux)
        import fcntl

        fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 1 << 20)
    os.dup2(write_end, 2)
    os.close(write_end)
    forward_to = os.dup(saved)  # here, not in the thread: `saved` may be closed first

    def forward():
        with os.fdopen(read_end, "rb") as lines, os.fdopen(forward_to, "wb", 0) as out:
            for line in lines:
                if not _hidden_at_start(line.decode(errors="replace")):
                    out.write(line)

    thread = threading.Thread(target=forward, name="quiet-start", daemon=True)
    thread.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # the pipe's last write end closes: the thread ends
        os.close(saved)
        thread.join(timeout=10)


# A readable console by default: TensorFlow's C++ start-up lines and its later
# INFO and WARNING lines (XLA service banners) stay hidden unless --verbosity
# (or a TF_CPP_* logging variable) is given; errors still show. Set before
# TensorFlow is first imported.
_QUIET = (
    __name__ == "__main__"
    and not any(arg.startswith(("--verbosity", "-v=", "--v=")) for arg in sys.argv[1:])
    and not any(name in os.environ for name in ("TF_CPP_MAX_VLOG_LEVEL", "TF_CPP_VMODULE"))
)
if _QUIET:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TensorFlow turns its oneDNN CPU kernels on by itself only on CPUs with AVX-512
# VNNI, AVX-512 BF16 or AMX; on AVX2-only CPUs they train CapsNet about 1.4x
# faster (docs/performance.md). `import capsnet_tf` no longer asks for them, so
# this script does, before TensorFlow loads; TF_ENABLE_ONEDNN_OPTS=0 still wins.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

from absl import app, flags, logging  # noqa: E402

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))  # the repository, when not installed

with _quiet_start() if _QUIET and "tensorflow" not in sys.modules else contextlib.nullcontext():
    from capsnet_tf.config import ExperimentConfig  # noqa: E402

    if _QUIET:  # CUDA's start (cuInit) as well, which the first device query makes
        import tensorflow as tf

        tf.config.list_physical_devices("GPU")

_WORKDIR = flags.DEFINE_string(
    "workdir", "/tmp/capsnet_mnist", "Directory for the configuration, checkpoints and logs."
)
_OVERWRITE = flags.DEFINE_bool(
    "overwrite", False, "Replace a run with a different model configuration in --workdir."
)


def _define_option_flags():
    """One absl flag per `ExperimentConfig` field, from the field's own definition.

    Name (or the field's `flag`), default, help, bounds and choices all come
    from `capsnet_tf.config`, so an option is defined in one place.
    """
    holders = {}
    for field in dataclasses.fields(ExperimentConfig):
        meta = field.metadata
        name, default, help_text = meta["flag"] or field.name, field.default, meta["help"]
        kind = meta["kind"] or {bool: "bool", int: "integer", float: "float"}.get(
            type(default), "string"
        )
        bounds = {"lower_bound": meta["lower"], "upper_bound": meta["upper"]}
        if meta["choices"] is not None:
            holder = flags.DEFINE_enum(
                name, str(default), [str(choice) for choice in meta["choices"]], help_text
            )
        elif kind == "bool":
            holder = flags.DEFINE_bool(name, default, help_text)
        elif kind == "integer":
            holder = flags.DEFINE_integer(name, default, help_text, **bounds)
        elif kind == "float":
            holder = flags.DEFINE_float(name, default, help_text, **bounds)
        elif kind == "list":
            holder = flags.DEFINE_list(name, default, help_text)
        else:
            holder = flags.DEFINE_string(name, default, help_text)
        holders[field.name] = holder
    return holders


_OPTION_FLAGS = _define_option_flags()


def config_from_flags():
    """The `ExperimentConfig` of the parsed flags."""
    values = {}
    for field in dataclasses.fields(ExperimentConfig):
        value = _OPTION_FLAGS[field.name].value
        choices = field.metadata["choices"]
        if choices is not None:  # enum flags are strings; the field may hold ints
            value = next(choice for choice in choices if str(choice) == value)
        if field.metadata["kind"] == "list" and value is not None:
            value = tuple(value)
        values[field.name] = value
    return ExperimentConfig(**values)


def resolve_flagfiles(argv, search_dir=_HERE):
    """Expands `--flagfile=NAME` arguments, nested ones included, in place.

    NAME is looked up in the current directory, then next to the flagfile
    that names it (for nested flagfiles), then in `search_dir` (this
    script's folder), so `--flagfile=multi_mnist.flags`, which itself starts
    with `--flagfile=mnist.flags`, works from the repository root and from
    `experiments/`. Each flagfile's flags take its place in the argument
    list, so later flags override earlier ones as absl's own flagfiles do.
    A flagfile that cannot be found is left as it is for absl to report.
    """
    return _expand_flagfiles(argv, [search_dir], depth=0)


def _expand_flagfiles(argv, search_dirs, depth):
    if depth > 10:
        raise app.UsageError("Flagfiles include each other more than 10 levels deep.")
    expanded = []
    for argument in argv:
        prefix = next(
            (p for p in ("--flagfile=", "-flagfile=") if argument.startswith(p)), None
        )
        if prefix is None:
            expanded.append(argument)
            continue
        name = argument[len(prefix):]
        candidates = [name] + [os.path.join(folder, name) for folder in search_dirs]
        path = next((c for c in candidates if os.path.isfile(c)), None)
        if path is None:
            expanded.append(argument)
            continue
        with open(path) as file:
            lines = [line.strip() for line in file]
        flags_in_file = [
            line for line in lines if line and not line.startswith(("#", "//"))
        ]
        folder = os.path.dirname(os.path.abspath(path))
        expanded += _expand_flagfiles(flags_in_file, [folder] + search_dirs, depth + 1)
    return expanded


def _own_info_only(record):
    """Keeps warnings and errors, and INFO records logged by this project's files."""
    import capsnet_tf

    own = (_HERE, os.path.dirname(os.path.abspath(capsnet_tf.__file__)))
    return record.levelno >= std_logging.WARNING or record.pathname.startswith(own)


def option_flag(field, setting=None):
    """A configuration field as this script's flag: `--batch_size`, `--stem_layers=1 or 2`,
    `--noreconstruction` (`setting` False)."""
    if setting is False:
        return f"--no{field}"
    return f"--{field}" if setting is None else f"--{field}={setting}"


def configuration_summary(config, workdir, precision=None):
    """One short paragraph: the options that differ from the defaults, and where the rest is.

    `precision`: `training.resolve_precision(config)`'s `(precision, reason)`,
    shown on a line of its own; None leaves the line out.
    """
    defaults = ExperimentConfig()
    changed = [
        f"{field.metadata['flag'] or field.name}={getattr(config, field.name)}"
        for field in dataclasses.fields(config)
        if getattr(config, field.name) != getattr(defaults, field.name)
    ]
    data = f"the images of {config.image_folder}" if config.image_folder else config.dataset
    lines = [
        f"Training {config.model} on {data} for {config.epochs} epoch(s) in {workdir}",
        f"  options changed from the defaults: {', '.join(changed) or 'none'}",
    ]
    if precision is not None:
        resolved, reason = precision
        policy = "float32" if resolved == "float32" else f"mixed {resolved}"
        lines.append(f"  precision: {policy} ({reason})")
    lines.append(f"  (all options: {os.path.join(workdir, 'config.json')})")
    return "\n".join(lines)


def main(argv):
    if len(argv) > 1:
        sys.exit(
            f"error: unexpected argument(s) {' '.join(argv[1:])!r}: this script takes flags "
            "only, written --name=value (boolean flags: --name or --noname). Remove the "
            "extra argument(s); pass --helpshort to see the flags."
        )
    from capsnet_tf.callbacks import CheckpointWriteError, TrainingInterrupted
    from capsnet_tf.data import DatasetNotFoundError
    from capsnet_tf.extras import MissingDependencyError
    from capsnet_tf.memory import InsufficientMemoryError
    from capsnet_tf.runlock import WorkdirBusyError
    from capsnet_tf.training import (
        resolve_precision,
        train_and_evaluate,
        train_ensemble,
    )
    from capsnet_tf.workdir import IncompatibleWorkdirError

    if not flags.FLAGS["verbosity"].present:
        # Other libraries' INFO lines (TFDS's "Load dataset info ...") only
        # with --verbosity=0 (absl's own flag) or higher; this project's own
        # INFO lines (a resumed run, the replicas in sync) always show.
        logging.get_absl_logger().addFilter(_own_info_only)
    config = config_from_flags()
    print(configuration_summary(config, _WORKDIR.value, resolve_precision(config)))
    logging.debug("Configuration:\n%s", config.to_json())
    try:
        if config.num_trials > 1:
            results = train_ensemble(config, _WORKDIR.value, overwrite=_OVERWRITE.value)
        else:
            results = train_and_evaluate(
                config, _WORKDIR.value, overwrite=_OVERWRITE.value, start_time=_START_TIME
            )
    except TrainingInterrupted as stop:
        print(stop, file=sys.stderr)
        sys.exit(stop.exit_code)
    except KeyboardInterrupt:  # outside the training steps (start-up, final evaluation)
        print("Interrupted outside the training steps; every file written is complete. The "
              "same command continues the run from its last backup.", file=sys.stderr)
        sys.exit(130)
    except InsufficientMemoryError as error:  # the options that help, as this script's flags
        sys.exit(f"error: {error.describe(option_flag)}")
    except (
        CheckpointWriteError, DatasetNotFoundError, IncompatibleWorkdirError,
        MissingDependencyError, WorkdirBusyError, ValueError,
    ) as error:
        sys.exit(f"error: {error}")
    except OSError as error:  # a full disk outside the checkpoints (logs, results)
        if error.errno not in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            raise
        sys.exit(
            f"error: Could not write {error.filename or 'a file'} in {_WORKDIR.value}: "
            f"{error.strerror}. Free some space and run the same command again to continue."
        )
    print(
        f"Test accuracy: {100 * results['test_accuracy']:.2f}%  "
        f"test error: {100 * results['test_error']:.2f}%  "
        f"(work directory: {_WORKDIR.value})"
    )
    if results.get("final_epoch_test_accuracy") is not None:
        print(f"Final epoch's test accuracy: {100 * results['final_epoch_test_accuracy']:.2f}%")
    if "time_to_target" in results:
        hit = results["time_to_target"]
        print(
            f"Time to {100 * hit['target_accuracy']:.2f}%: {hit['seconds']:.0f} s "
            f"(epoch {hit['epoch']}, step {hit['global_step']})"
        )
    for name, value in sorted(results.items()):
        shown = ("test_accuracy", "final_epoch_test_accuracy")
        if name.endswith("_accuracy") and name not in shown and value is not None:
            print(f"{name}: {100 * value:.2f}%")
    if "test_metrics" in results and "length_accuracy_any" in results["test_metrics"]:
        print(
            "At least one of the two digits right: "
            f"{100 * results['test_metrics']['length_accuracy_any']:.2f}%"
        )


if __name__ == "__main__":
    app.run(main, argv=resolve_flagfiles(sys.argv))
