"""The model behind the explorer: classify, decode a capsule, routing couplings.

`load_explorer_model` opens an exported SavedModel (`experiments/export.py`)
or a training work directory and checks that it is an MNIST CapsNet: 28x28x1
inputs, 10 class capsules and a decoder. Both give the same three operations:

- `classify(image)`: capsule lengths, the winning class, all class capsules
  and the reconstruction from the winner (the export's `serving_float`);
- `decode(capsule, class_id)`: the decoder's drawing of one class capsule,
  every other capsule zeroed (the export's `decode` signature: no
  convolutions, no routing, which is why a slider can redraw at once);
- `couplings(image)`: the routing coefficients `c_ij` of every iteration,
  averaged over the primary capsule types of each position of the primary
  grid (6x6 for MNIST).

Both forms are read through the one adapter of a trained CapsNet,
`capsnet_tf.trained.open_capsnet`: its `predict`, `decode` and routing
model. A SavedModel has no signature that returns couplings, so for an
export the adapter rebuilds the routing layers in Keras from the export's
metadata and checks them against the SavedModel's capsule lengths; when it
cannot, the couplings are switched off with its reason (`couplings_note`)
rather than drawn wrong.
"""

import os

import numpy as np

__all__ = [
    "ExplorerModel",
    "ModelError",
    "load_explorer_model",
    "resolve_model_dir",
]

IMAGE_SHAPE = (28, 28, 1)
NUM_CLASSES = 10


class ModelError(ValueError):
    """A model that the explorer cannot show; the message says why and what to do."""


def resolve_model_dir(path):
    """`path` if it is a SavedModel, else its highest numbered version.

    The same rule as `experiments/predict.py --model`: a version directory
    (`<export_dir>/1`) or the export directory itself.

    Raises:
        ModelError: neither.
    """
    if os.path.exists(os.path.join(path, "saved_model.pb")):
        return path
    versions = []
    if os.path.isdir(path):
        versions = [
            int(name)
            for name in os.listdir(path)
            if name.isdigit() and os.path.exists(os.path.join(path, name, "saved_model.pb"))
        ]
    if not versions:
        raise ModelError(
            f"--model={path} is neither a SavedModel directory (with saved_model.pb) nor "
            "an export directory holding numbered versions; export one with "
            "experiments/export.py, or pass a training run with --workdir."
        )
    return os.path.join(path, str(max(versions)))


def _check_mnist(where, image_shape, num_classes, dataset=None, class_names=None):
    """Refuses what is not an MNIST CapsNet, naming what it is instead."""
    problems = []
    if tuple(image_shape) != IMAGE_SHAPE:
        problems.append(
            "its input is " + "x".join(str(size) for size in image_shape) + ", not 28x28x1"
        )
    if num_classes != NUM_CLASSES:
        problems.append(f"it has {num_classes} classes, not 10")
    if dataset is not None and dataset != "mnist":
        problems.append(f"it was trained on {dataset}")
    elif dataset is None and class_names and list(class_names) != [str(d) for d in range(10)]:
        problems.append(f"its classes are {', '.join(class_names[:4])}, ..., not the digits 0-9")
    if problems:
        raise ModelError(
            f"{where} is not an MNIST CapsNet: {'; '.join(problems)}. The explorer draws "
            "digits for a CapsNet trained on MNIST (experiments/mnist.py --flagfile="
            "mnist.flags, then experiments/export.py)."
        )


def _aggregate_couplings(routing):
    """`[iterations, rows, columns, classes]`: couplings averaged over capsule types.

    Each primary capsule type's coupling is weighted by that capsule's
    length, the probability that its entity is present: an inactive capsule's
    vote hardly moves the class capsules, whatever its coupling.
    """
    couplings = routing["couplings"]  # [iterations, types, rows, columns, classes]
    weights = routing["primary_lengths"][None, :, :, :, None]
    total = np.maximum(weights.sum(axis=1), 1e-12)
    return (couplings * weights).sum(axis=1) / total


class ExplorerModel:
    """An MNIST CapsNet as the explorer uses it (see the module docstring).

    Build it with `load_explorer_model`, which checks the model first.

    Args:
        source: the model's path, shown on the page.
        classify_fn: float32 images `[1, 28, 28, 1]` -> `(lengths [1, 10],
            capsules [1, 10, dim], reconstruction [1, 28, 28, 1])`.
        decode_fn: `(capsules [1, 10, dim] with all but one class zeroed,
            class_ids [1])` -> reconstruction `[1, 28, 28, 1]`.
        keras_model: a `CapsNet` holding the routing weights, or None when
            there is none (then `couplings` returns None).
        class_names: one name per class.
        capsule_dim: dimension of the class capsules (16).
        couplings_note: why there are no couplings, for the page.
    """

    def __init__(self, source, classify_fn, decode_fn, keras_model, class_names, capsule_dim,
                 couplings_note=None):
        self.source = source
        self._classify_fn = classify_fn
        self._decode_fn = decode_fn
        self._keras_model = keras_model
        self.class_names = list(class_names)
        self.num_classes = len(self.class_names)
        self.capsule_dim = int(capsule_dim)
        self.couplings_note = couplings_note
        self.routing_iterations = (
            keras_model.get_layer("class_capsules").routing_iterations if keras_model else None
        )

    def classify(self, image):
        """Lengths `[10]`, class id, capsules `[10, 16]`, reconstruction `[28, 28]`."""
        images = np.asarray(image, "float32").reshape((1, *IMAGE_SHAPE))
        lengths, capsules, reconstruction = self._classify_fn(images)
        lengths = np.asarray(lengths, "float32")[0]
        return {
            "lengths": lengths,
            "class_id": int(lengths.argmax()),
            "capsules": np.asarray(capsules, "float32")[0],
            "reconstruction": np.asarray(reconstruction, "float32")[0, :, :, 0],
        }

    def decode(self, capsule, class_id):
        """The decoder's `[28, 28]` drawing of `capsule` `[16]` as class `class_id`."""
        capsule = np.asarray(capsule, "float32").reshape(self.capsule_dim)
        capsules = np.zeros((1, self.num_classes, self.capsule_dim), "float32")
        capsules[0, int(class_id)] = capsule
        reconstruction = self._decode_fn(capsules, np.array([class_id], "int32"))
        return np.asarray(reconstruction, "float32")[0, :, :, 0]

    def couplings(self, image):
        """Couplings `[iterations, rows, columns, classes]` for one image, or None.

        None when the model's routing layers could not be rebuilt
        (`couplings_note` says why).
        """
        if self._keras_model is None:
            return None
        from capsnet_tf.routing import routing_couplings

        image = np.asarray(image, "float32").reshape(IMAGE_SHAPE)
        return _aggregate_couplings(routing_couplings(self._keras_model, image))


def load_explorer_model(model_dir=None, workdir=None, checkpoint="best"):
    """Opens an export (`model_dir`) or a training run (`workdir`) for the explorer.

    Args:
        model_dir: a SavedModel version directory or an export directory
            (its highest version), as `experiments/predict.py --model` takes.
        workdir: a training work directory (`experiments/mnist.py --workdir`).
        checkpoint: `"best"` or `"latest"`, for `workdir`.

    Returns:
        An `ExplorerModel`.

    Raises:
        ModelError: neither or both given, not a model, not an MNIST CapsNet,
            or no decoder; the message says what to do.
    """
    if (model_dir is None) == (workdir is None):
        raise ModelError("Give exactly one of --model (an export) and --workdir (a training run).")
    if workdir is not None:
        model = _from_workdir(workdir, checkpoint)
    else:
        model = _from_saved_model(resolve_model_dir(model_dir))
    # The first call of each function traces or loads kernels (~0.1 s); pay
    # that here, not on the first slider move.
    blank = np.zeros(IMAGE_SHAPE[:2], "float32")
    model.classify(blank)
    model.decode(np.zeros(model.capsule_dim, "float32"), 0)
    model.couplings(blank)
    return model


def _from_workdir(workdir, checkpoint):
    from capsnet_tf.trained import open_capsnet

    where = f"--workdir={workdir}"
    try:
        capsnet = open_capsnet(workdir=workdir, checkpoint=checkpoint)
    except (FileNotFoundError, ValueError) as error:
        raise ModelError(f"{where}: {error}")
    _check_mnist(where, capsnet.image_shape, capsnet.num_classes, capsnet.dataset)
    if not capsnet.reconstruction:
        raise ModelError(f"{where} has no decoder (reconstruction=False): nothing to redraw.")
    return _explorer_model(capsnet.source, capsnet, [str(digit) for digit in range(10)])


def _from_saved_model(path):
    import tensorflow as tf

    from capsnet_tf.trained import open_capsnet

    where = f"--model={path}"
    try:
        capsnet = open_capsnet(path)
    except (OSError, RuntimeError, tf.errors.OpError) as error:
        raise ModelError(f"{where}: cannot load the SavedModel ({error}).")
    except ValueError as error:  # no serving_float signature, or no capsules
        raise ModelError(f"{where}: {error}")
    class_names = capsnet.class_names
    if class_names is not None:
        _check_class_names(where, class_names, capsnet.num_classes)
    _check_mnist(where, capsnet.image_shape, capsnet.num_classes, capsnet.dataset, class_names)
    if not capsnet.reconstruction:
        raise ModelError(
            f"{where} has no 'decode' signature: the model was exported without a "
            "decoder (reconstruction=False), so there is nothing to redraw."
        )
    return _explorer_model(os.path.abspath(path), capsnet,
                           class_names or [str(digit) for digit in range(10)])


def _explorer_model(source, capsnet, class_names):
    """An `ExplorerModel` of a checked `TrainedCapsNet` (`capsnet_tf.trained`)."""

    def classify_fn(images):
        outputs = capsnet.predict(images)
        return outputs["length"], outputs["capsules"], outputs["reconstruction"]

    routing = capsnet.routing_model()  # rebuilt for an export; routing_note says why not
    return ExplorerModel(source, classify_fn, capsnet.decode, routing, class_names,
                         capsnet.capsule_dim, couplings_note=capsnet.routing_note)


def _check_class_names(where, class_names, num_classes):
    """Refuses class names that are not one string per class capsule.

    The names come from the export's files (`assets/capsnet_metadata.json`
    or `assets/labels.txt`); the page shows them as text and indexes them
    by class, so a list of another length would fail on the first request.
    """
    if not isinstance(class_names, list) or not all(
        isinstance(name, str) for name in class_names
    ):
        raise ModelError(f"{where}: its class names are not a list of strings "
                         f"(assets/capsnet_metadata.json).")
    if len(class_names) != num_classes:
        raise ModelError(
            f"{where} names {len(class_names)} classes but has {num_classes} class capsules: "
            "its metadata (assets/capsnet_metadata.json, assets/labels.txt) does not belong "
            "to this model; export it again with experiments/export.py."
        )
