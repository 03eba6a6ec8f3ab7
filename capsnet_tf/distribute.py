"""`tf.distribute` strategies for training CapsNet on several devices or machines.

`make_strategy(name, devices, tpu)` turns `ExperimentConfig.strategy`,
`.devices` and `.tpu` into a strategy; `train_and_evaluate` builds and compiles
the model under its scope, and Keras's `model.fit` does the rest:

- `"default"`: no distribution; the default device (a GPU if any).
- `"mirrored"`: `tf.distribute.MirroredStrategy`, synchronous data parallelism
  on the local devices: all local GPUs, or the `devices` listed (e.g.
  `("/gpu:0", "/gpu:1")`). With no GPU and no `devices` it runs ONE replica on
  the CPU (the same arithmetic as `"default"`), and says so in the log.
  Listing several CPUs, `("/cpu:0", "/cpu:1")`, splits the CPU into that many
  logical devices (for testing; it does not make training faster).
- `"multi_worker"`: `tf.distribute.MultiWorkerMirroredStrategy`, one process
  per machine, configured by the `TF_CONFIG` environment variable as
  TensorFlow documents it
  (https://www.tensorflow.org/guide/distributed_training#TF_CONFIG), e.g. on
  the first of two machines::

      TF_CONFIG='{"cluster": {"worker": ["host1:12345", "host2:12345"]},
                  "task": {"type": "worker", "index": 0}}'

  and `"index": 1` on the second. Every worker runs the same command; the
  chief (`"chief"` task, else worker 0) writes the work directory, the others
  write theirs to `worker_workdir(...)`. Each worker uses its local GPUs.
- `"tpu"`: `tf.distribute.TPUStrategy` on the TPU at `tpu` (a name, a
  `grpc://` address, or `"local"` on a TPU VM; None: `$TPU_NAME` or the
  local TPU).

In every case `batch_size` is the global batch: each step splits it evenly
between the replicas, every replica averages its per-example losses and
Keras divides by the number of replicas, so the gradient summed across
replicas is that of the loss averaged over the global batch (exact when the
global batch divides evenly; the last, smaller batch of an epoch may be split
unevenly). The optimizer counts one iteration per global step, so the
learning-rate schedule is in global steps whatever the number of replicas.

The strategy must be made before TensorFlow initialises its devices (before
any tensor is created): `"multi_worker"` needs it to configure collective ops,
and several CPU devices can only be made then.
"""

import json
import os
import socket

from absl import logging

__all__ = [
    "STRATEGIES",
    "describe_strategy",
    "is_chief",
    "is_multi_worker",
    "make_strategy",
    "prepare_model",
    "read_tf_config",
    "shard_by_data",
    "validate_strategy_options",
    "worker_workdir",
]

STRATEGIES = ("default", "mirrored", "multi_worker", "tpu")

_TPU_CONNECT_SECONDS = 20

# Strategies made in this process, by options: a multi-worker or TPU strategy
# can be made once per process (e.g. for the trials of an ensemble).
_MADE = {}


def read_tf_config(environ=None):
    """The parsed and checked `TF_CONFIG` of a multi-worker run.

    Args:
        environ: mapping of environment variables (default `os.environ`).

    Returns:
        The `TF_CONFIG` dict: `{"cluster": {"worker": [...], ...}, "task":
        {"type": ..., "index": ...}}`.

    Raises:
        ValueError: `TF_CONFIG` is unset, not JSON, or inconsistent (a task
            that is not in the cluster), with what is wrong.
    """
    environ = os.environ if environ is None else environ
    text = environ.get("TF_CONFIG", "")
    example = (
        'e.g. TF_CONFIG=\'{"cluster": {"worker": ["host1:12345", "host2:12345"]}, '
        '"task": {"type": "worker", "index": 0}}\' on the first machine and '
        '"index": 1 on the second'
    )
    if not text.strip():
        raise ValueError(
            "strategy='multi_worker' reads the cluster from the TF_CONFIG environment "
            f"variable, which is not set: {example}."
        )
    try:
        tf_config = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"TF_CONFIG is not valid JSON ({error}): {example}.") from None
    if not isinstance(tf_config, dict):
        raise ValueError(f"TF_CONFIG must be a JSON object. Received: {text!r}; {example}.")
    cluster = tf_config.get("cluster")
    if not isinstance(cluster, dict) or not (cluster.get("worker") or cluster.get("chief")):
        raise ValueError(
            "TF_CONFIG must have a \"cluster\" with a \"worker\" (and optionally a "
            f"\"chief\") list of host:port addresses. Received: {text!r}; {example}."
        )
    for job, addresses in cluster.items():
        if job not in ("chief", "worker"):
            raise ValueError(
                "MultiWorkerMirroredStrategy takes only \"chief\" and \"worker\" tasks; "
                f"TF_CONFIG's cluster has {job!r}. Received: {text!r}."
            )
        if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
            raise ValueError(
                f"TF_CONFIG cluster[{job!r}] must be a list of \"host:port\" strings. "
                f"Received: {addresses!r}."
            )
    if len(cluster.get("chief", [])) > 1:
        raise ValueError(f"TF_CONFIG may have at most one chief. Received: {cluster['chief']!r}.")
    task = tf_config.get("task")
    if not isinstance(task, dict) or "type" not in task or "index" not in task:
        raise ValueError(
            "TF_CONFIG must have a \"task\" saying which cluster member this process "
            f"is, as {{\"type\": \"worker\", \"index\": 0}}. Received: {text!r}; {example}."
        )
    task_type, index = task["type"], task["index"]
    members = cluster.get(task_type, [])
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(members):
        raise ValueError(
            f"TF_CONFIG's task {task!r} is not in its cluster (which has "
            f"{len(members)} {task_type!r} task(s)). Received: {text!r}."
        )
    return tf_config


def _normalize_device(device):
    import tensorflow as tf

    try:
        spec = tf.DeviceSpec.from_string(str(device).strip())
    except ValueError:
        spec = None
    if spec is None or (spec.device_type or "").upper() not in ("CPU", "GPU"):
        raise ValueError(
            "`devices` must be local CPU or GPU device names such as '/gpu:0' or "
            f"'/cpu:0'. Received: {device!r}"
        )
    if spec.job or spec.replica is not None or spec.task is not None:
        raise ValueError(
            "`devices` lists local devices only (for several machines use "
            f"strategy='multi_worker'). Received: {device!r}"
        )
    return f"/{spec.device_type.lower()}:{spec.device_index or 0}"


def validate_strategy_options(strategy, devices=None, tpu=None, environ=None):
    """Checks a combination of strategy options without touching TensorFlow's devices.

    Args:
        strategy: one of `STRATEGIES`.
        devices: device names for `"mirrored"`, or None.
        tpu: TPU address for `"tpu"`, or None.
        environ: environment (default `os.environ`), for `TF_CONFIG`.

    Returns:
        The normalised device names (`"/gpu:0"`, ...) as a tuple, or None.

    Raises:
        ValueError: an unknown strategy, `devices` with a strategy other than
            `"mirrored"`, `tpu` with a strategy other than `"tpu"`, bad or
            repeated device names, or `"multi_worker"` without a valid
            `TF_CONFIG`.
    """
    if strategy not in STRATEGIES:
        raise ValueError(
            f"`strategy` must be one of {', '.join(STRATEGIES)}. Received: strategy={strategy!r}"
        )
    if devices is not None and strategy != "mirrored":
        hint = {
            "multi_worker": " (each worker uses all its local GPUs; restrict them "
            "with CUDA_VISIBLE_DEVICES)",
            "default": " (use strategy='mirrored' to train on the listed devices)",
        }.get(strategy, "")
        raise ValueError(
            f"`devices` applies to strategy='mirrored' only{hint}. "
            f"Received: strategy={strategy!r}, devices={devices!r}"
        )
    if tpu is not None and strategy != "tpu":
        raise ValueError(
            f"`tpu` applies to strategy='tpu' only. Received: strategy={strategy!r}, tpu={tpu!r}"
        )
    if strategy == "multi_worker":
        read_tf_config(environ)
    if devices is None:
        return None
    if isinstance(devices, str):
        devices = [device for device in devices.split(",") if device.strip()]
    normalized = tuple(_normalize_device(device) for device in devices)
    if not normalized:
        raise ValueError(
            "`devices` must list at least one device, or be None for all local GPUs. "
            f"Received: devices={devices!r}"
        )
    if len(set(normalized)) != len(normalized):
        raise ValueError(f"`devices` lists a device twice. Received: devices={devices!r}")
    return normalized


def _make_cpu_devices(count):
    """Splits the CPU into `count` logical devices (possible only before TF starts)."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    current = tf.config.get_logical_device_configuration(cpu)
    if current is not None and len(current) >= count:
        return
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
        )
    except RuntimeError:
        raise ValueError(
            f"devices names CPU devices up to /cpu:{count - 1}, but TensorFlow has already "
            "initialised its devices with fewer: several CPU devices can only be made before "
            "TensorFlow creates any tensor (make the strategy first, in a fresh process)."
        ) from None


def _mirrored_strategy(devices):
    import tensorflow as tf

    if devices is None:
        strategy = tf.distribute.MirroredStrategy()
        if not tf.config.list_physical_devices("GPU"):
            logging.warning(
                "strategy='mirrored' found no GPU: training runs as %d replica(s) on the "
                "CPU (one, like strategy='default', unless the CPU was split into logical "
                "devices). List devices, e.g. /cpu:0,/cpu:1, to split the CPU into "
                "several replicas.",
                strategy.num_replicas_in_sync,
            )
        return strategy
    cpu_indices = [int(device.split(":")[1]) for device in devices if device.startswith("/cpu")]
    if cpu_indices and max(cpu_indices) > 0:
        _make_cpu_devices(max(cpu_indices) + 1)
    available = {
        _normalize_device(device.name) for device in tf.config.list_logical_devices()
        if device.device_type in ("CPU", "GPU")
    }
    missing = [device for device in devices if device not in available]
    if missing:
        raise ValueError(
            f"devices {', '.join(missing)} do not exist on this machine; it has "
            f"{', '.join(sorted(available))}."
        )
    return tf.distribute.MirroredStrategy(list(devices))


def _tpu_strategy(tpu):
    import tensorflow as tf

    where = repr(tpu) if tpu else "$TPU_NAME or the local TPU"
    hint = (
        "Pass the TPU's name or grpc:// address with --tpu (or 'local' on a Cloud TPU "
        "VM), and check that it is up and that this TensorFlow build supports TPUs."
    )
    if tpu and tpu.startswith("grpc://"):
        # TensorFlow waits without end for an address where nothing listens.
        host, _, port = tpu[len("grpc://"):].rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=_TPU_CONNECT_SECONDS).close()
        except (OSError, ValueError) as error:
            raise ValueError(
                f"strategy='tpu' could not reach a TPU at {where}: {error}. {hint}"
            ) from None
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
        if tpu not in (None, "", "local"):
            tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        strategy = tf.distribute.TPUStrategy(resolver)
    except (ValueError, RuntimeError, tf.errors.OpError, NotImplementedError) as error:
        lines = str(error).strip().splitlines() or [type(error).__name__]
        raise ValueError(
            f"strategy='tpu' could not reach a TPU at {where}: {lines[0].rstrip('.')}. {hint}"
        ) from None
    return strategy


def make_strategy(strategy="default", devices=None, tpu=None):
    """The `tf.distribute.Strategy` called `strategy`.

    Call it before TensorFlow creates any tensor (see the module docstring).

    Args:
        strategy: `"default"`, `"mirrored"`, `"multi_worker"` or `"tpu"`.
        devices: for `"mirrored"`: device names (`"/gpu:0"`, `"/cpu:1"`, ...)
            or a comma-separated string; None: all local GPUs (one CPU
            replica when there is none).
        tpu: for `"tpu"`: the TPU name or `grpc://` address, or `"local"`.

    Returns:
        The strategy; `tf.distribute.get_strategy()` for `"default"`.

    Raises:
        ValueError: invalid combinations (see `validate_strategy_options`),
            listed devices that do not exist, or an unreachable TPU.
    """
    import tensorflow as tf

    devices = validate_strategy_options(strategy, devices, tpu)
    if strategy == "default":
        return tf.distribute.get_strategy()
    key = (strategy, devices, tpu)
    if key in _MADE:
        return _MADE[key]
    if strategy == "mirrored":
        result = _mirrored_strategy(devices)
    elif strategy == "multi_worker":
        try:
            result = tf.distribute.MultiWorkerMirroredStrategy()
        except RuntimeError as error:
            raise ValueError(
                f"Cannot start MultiWorkerMirroredStrategy ({error}): it must be made "
                "before TensorFlow creates any tensor, in a fresh process."
            ) from None
    else:
        result = _tpu_strategy(tpu)
    logging.info("Distribution: %s", describe_strategy(result))
    _MADE[key] = result
    return result


def shard_by_data(dataset):
    """`dataset` with the `DATA` auto-shard policy (no effect but under `multi_worker`).

    Under `MultiWorkerMirroredStrategy`, every worker then reads the same
    examples in the same order (same files, `take`, seed and shuffle) and
    keeps its replicas' share of each global batch, so that all workers run
    the same number of steps. The default policy would first try to give
    each worker different files, which fails with fewer files than workers
    (MNIST has one per split) and, with more, gives workers epochs of
    different lengths.
    """
    import tensorflow as tf

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(options)


def describe_strategy(strategy):
    """One line naming the strategy, its replicas and, for several workers, this task."""
    name = type(strategy).__name__
    replicas = strategy.num_replicas_in_sync
    devices = getattr(strategy.extended, "worker_devices", ())
    text = f"{name} with {replicas} replica(s) in sync"
    if devices:
        text += f" on {', '.join(devices)}"
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is not None and resolver.task_type is not None:
        role = "chief" if is_chief(strategy) else "not chief"
        text += f"; this task: {resolver.task_type} {resolver.task_id} ({role})"
    return text


def is_multi_worker(strategy):
    """Whether `strategy` spans several processes (`MultiWorkerMirroredStrategy`)."""
    import tensorflow as tf

    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)


def is_chief(strategy):
    """Whether this process writes the shared outputs (checkpoints, logs).

    True without a cluster; in a cluster, for the `"chief"` task, or for
    worker 0 when the cluster has no chief (TensorFlow's convention).
    """
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or resolver.task_type is None:
        return True
    if resolver.task_type == "chief":
        return True
    cluster = resolver.cluster_spec().as_dict()
    return resolver.task_type == "worker" and resolver.task_id == 0 and "chief" not in cluster


def worker_workdir(workdir, strategy):
    """The directory this process writes its configuration, checkpoints and logs to.

    The chief (and any single-process run) writes `workdir`. Every other
    worker of a multi-worker run computes the same weights and must run the
    same callbacks (evaluation steps are collective), but writes to its own
    `workdir/workers/<type>_<index>`, so that no two processes write the same
    file on a shared file system. That directory is kept: a rerun of the same
    command resumes the worker from its own backup there. Delete
    `workdir/workers` after a finished run.
    """
    if is_chief(strategy):
        return workdir
    resolver = strategy.cluster_resolver
    return os.path.join(workdir, "workers", f"{resolver.task_type}_{resolver.task_id}")


def prepare_model(model, strategy, element_spec):
    """Fits Keras 3's `fit`/`evaluate` to `strategy`; returns `model`.

    1. Under any `tf.distribute` strategy, Keras 3 (3.15 included) builds the
       model from the first batch of the first epoch and then restarts the
       data iterator. A pipeline that reshuffles every iteration then trains
       its first epoch on its second shuffle, unlike the same run on one
       device; under `MultiWorkerMirroredStrategy` the build fails outright
       for dict batches such as CapsNet's `{"image", "label"}`: "Attempt to
       convert a value ({'image': PerReplica...}) ... to a Tensor"
       (keras-team/keras issue 20329). Only shapes and dtypes are needed there,
       so `model` builds from `element_spec` (the undistributed dataset's)
       instead. Without a strategy Keras builds while tracing the first step;
       nothing changes.
    2. Under `MultiWorkerMirroredStrategy`, every step reduces the per-replica
       logs (scalar loss and metrics) with `strategy.reduce("MEAN", value,
       axis=0)`, which fails on scalars ("Invalid reduction dimension 0 for
       input with 0 dimensions", tensorflow/tensorflow issue 72388). Keras's
       `reduce_per_replica` is wrapped so that there scalars are averaged over
       all replicas (`axis=None`), as Keras does on one machine; other values
       and other strategies are left to Keras.

    tests/test_distribute.py fails if a Keras upgrade makes these wrong.

    Args:
        model: a compiled Keras model made under `strategy.scope()`.
        strategy: the `tf.distribute.Strategy` it trains under.
        element_spec: `element_spec` of the training `tf.data.Dataset`.

    Returns:
        `model`.
    """
    import tensorflow as tf

    build = getattr(model, "_maybe_symbolic_build", None)
    if build is not None:

        def build_from_spec(iterator=None, data_batch=None):
            return build(data_batch=element_spec if data_batch is None else data_batch)

        model._maybe_symbolic_build = build_from_spec
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        _patch_keras_reduce_per_replica()
    return model


def _patch_keras_reduce_per_replica():
    import tensorflow as tf
    from keras.src.backend.tensorflow import trainer

    original = getattr(trainer, "reduce_per_replica", None)
    if original is None or getattr(original, "_capsnet_tf_patched", False):
        return

    def reduce_per_replica(values, strategy, reduction):
        if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) or reduction not in (
            "auto",
            "mean",
        ):
            return original(values, strategy, reduction)

        def reduce(value):
            local = strategy.experimental_local_results(value)
            if all(isinstance(v, tf.Tensor) and v.shape.rank == 0 for v in local):
                return strategy.reduce("MEAN", value, axis=None)
            return original(value, strategy, reduction)

        return tf.nest.map_structure(reduce, values)

    reduce_per_replica._capsnet_tf_patched = True
    trainer.reduce_per_replica = reduce_per_replica
