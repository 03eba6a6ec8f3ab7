"""One view of a trained CapsNet, whichever form holds it.

A trained CapsNet reaches the figures (`capsnet_tf.figures`), the explorer
(`capsnet_tf.explorer`) and notebooks as a training work directory's
checkpoint, a `.keras` file, a Keras `CapsNet` in memory or an exported
SavedModel (`capsnet_tf.export`). `open_capsnet` turns any of them into a
`TrainedCapsNet`, which offers the same operations for all:

- `predict(images)`: capsule lengths, the longest capsule's class, every
  class capsule and, with a decoder, the reconstruction from the winner;
- `decode(capsules, class_ids)`: the decoder's drawing of each class
  capsule of `class_ids`, every other capsule zeroed (a SavedModel's
  `decode` signature: no convolutions, no routing);
- `routing_model()`: a Keras `CapsNet` holding the routing weights, for
  `capsnet_tf.routing.routing_couplings`. A SavedModel returns no couplings,
  so for an export the three layers before the routing (`conv1`,
  `primary_capsules`, `class_capsules`) are rebuilt in Keras from the model
  configuration that `experiments/export.py` records in
  `assets/capsnet_metadata.json`, and their weights copied from the
  SavedModel's variables by name. The rebuilt layers must give the
  SavedModel's capsule lengths on a probe image, or there is no routing
  model and `routing_note` says why.

Each also says what it is: `num_classes`, `capsule_dim`, `image_shape`,
`reconstruction` (has a decoder), `source` (a path or None), `class_names`
and `dataset` (what it was trained on; None when the form does not say),
and `metadata` (an export's `capsnet_metadata.json`, else `{}`).
"""

import os

import keras
import numpy as np
import tensorflow as tf

from capsnet_tf.export import LABELS_FILE, load_metadata
from capsnet_tf.routing import routing_couplings

__all__ = [
    "KerasCapsNet",
    "SavedModelCapsNet",
    "TrainedCapsNet",
    "mask_capsules",
    "open_capsnet",
]

# Layers whose weights the routing needs; their names are fixed by `CapsNet`.
ROUTING_LAYERS = ("conv1", "primary_capsules", "class_capsules")
# Largest difference of capsule lengths accepted between the rebuilt Keras
# layers and the SavedModel (float32 round-off is ~1e-7).
REBUILD_TOLERANCE = 1e-4


def mask_capsules(capsules, class_ids):
    """Capsules `[b, classes, dim]` with all but `class_ids` `[b]` zeroed."""
    capsules = np.asarray(capsules, "float32")
    mask = np.eye(capsules.shape[1], dtype="float32")[np.asarray(class_ids)]
    return capsules * mask[..., None]


class TrainedCapsNet:
    """What every form of a trained CapsNet offers (see the module docstring).

    Build one with `open_capsnet`.
    """

    source = None
    num_classes = None
    capsule_dim = None
    image_shape = None
    reconstruction = False
    class_names = None
    dataset = None
    metadata = {}
    routing_note = None

    def predict(self, images, batch_size=100):
        """Runs the CapsNet on float32 images `[n, H, W, C]` in [0, 1].

        Returns:
            Dict of numpy arrays: `"length"` `[n, classes]`, `"capsules"`
            `[n, classes, dim]`, `"predictions"` int32 `[n]` (the longest
            capsule) and, with a decoder, `"reconstruction"` `[n, H, W, C]`.
        """
        raise NotImplementedError

    def decode(self, capsules, class_ids, batch_size=256):
        """The decoder's images of `capsules` `[n, classes, dim]` as `class_ids` `[n]`.

        Every capsule but the one of `class_ids` is zeroed first.

        Raises:
            ValueError: the model has no decoder.
        """
        raise NotImplementedError

    def routing_model(self):
        """A Keras `CapsNet` with the routing weights, or None (`routing_note` says why)."""
        return None

    def routing_couplings(self, image):
        """`capsnet_tf.routing.routing_couplings` of one image, or None without a routing model."""
        model = self.routing_model()
        return None if model is None else routing_couplings(model, image)


class KerasCapsNet(TrainedCapsNet):
    """A Keras `CapsNet` (the training model, weights loaded) as a `TrainedCapsNet`.

    Args:
        model: a `capsnet_tf.CapsNet`.
        source: where it was read from (a work directory, a `.keras` file).
        class_names: one name per class, when known.
        dataset: the data set it was trained on, when known.

    Raises:
        ValueError: not a CapsNet (the baseline CNN has no capsules).
    """

    def __init__(self, model, source=None, class_names=None, dataset=None):
        if not (callable(getattr(model, "inference_model", None))
                and hasattr(model, "capsule_dim")):
            raise ValueError(
                f"{source or 'The model'} is a {type(model).__name__}, not a CapsNet: it has "
                "no capsules."
            )
        self.model = model
        self.source = source
        self.class_names = None if class_names is None else list(class_names)
        self.dataset = dataset
        inference = model.inference_model()
        # A graph per batch shape: no Python between the ops, unlike eager calls.
        self.inference = tf.function(
            lambda images: inference(images, training=False), reduce_retracing=True
        )
        self.decoder = model.get_layer("decoder") if model.reconstruction else None
        self.num_classes = model.num_classes
        self.capsule_dim = int(model.capsule_dim)
        self.image_shape = tuple(int(size) for size in model.image_shape)
        self.reconstruction = bool(model.reconstruction)

    def predict(self, images, batch_size=100):
        images = np.asarray(images, "float32")
        outputs = {"length": [], "capsules": [], "reconstruction": []}
        for start in range(0, len(images), batch_size):
            batch = self.inference(tf.constant(images[start:start + batch_size]))
            for name in outputs:
                if name in batch:
                    outputs[name].append(np.asarray(batch[name]))
        outputs = {name: np.concatenate(values) for name, values in outputs.items() if values}
        outputs["predictions"] = outputs["length"].argmax(-1).astype("int32")
        return outputs

    def decode(self, capsules, class_ids, batch_size=256):
        if self.decoder is None:
            raise ValueError("This CapsNet was built with reconstruction=False: no decoder.")
        masked = mask_capsules(capsules, class_ids)
        return np.concatenate([
            np.asarray(self.decoder(masked[start:start + batch_size], training=False))
            for start in range(0, len(masked), batch_size)
        ])

    def routing_model(self):
        return self.model


class SavedModelCapsNet(TrainedCapsNet):
    """An exported SavedModel (`capsnet_tf.export`) as a `TrainedCapsNet`.

    Uses the `serving_float` signature (float32 images -> probabilities,
    class_ids, capsules, reconstruction) and, when the model has a decoder,
    the `decode` signature (capsules [b, classes, dim] + class_ids [b] ->
    reconstruction).

    Args:
        path: the SavedModel's directory (a version directory of an export),
            or what `tf.saved_model.load` returned.

    Raises:
        ValueError: no `serving_float` signature, or one without capsules.
    """

    def __init__(self, path):
        self.source = os.fspath(path) if isinstance(path, (str, os.PathLike)) else None
        self.loaded = tf.saved_model.load(self.source) if self.source else path
        if "serving_float" not in self.loaded.signatures:
            raise ValueError(
                f"The SavedModel {self.source or ''} has no 'serving_float' signature (it has "
                f"{sorted(self.loaded.signatures)}); export it with experiments/export.py."
            )
        self.serving = self.loaded.signatures["serving_float"]
        inputs = self.serving.structured_input_signature[1]
        (self.image_key,) = inputs
        self.image_shape = tuple(int(size) for size in inputs[self.image_key].shape[1:])
        capsules = self.serving.structured_outputs.get("capsules")
        if capsules is None:
            raise ValueError(
                f"The SavedModel {self.source or ''} returns no capsules: not a capsnet_tf "
                "CapsNet export."
            )
        self.num_classes, self.capsule_dim = (int(size) for size in capsules.shape[1:])
        self.reconstruction = "decode" in self.loaded.signatures
        if self.reconstruction:
            self.decoder = self.loaded.signatures["decode"]
            specs = self.decoder.structured_input_signature[1]
            self.capsules_key = next(k for k, spec in specs.items() if spec.shape.rank == 3)
            self.class_ids_key = next(k for k, spec in specs.items() if spec.shape.rank == 1)
            self.class_ids_dtype = specs[self.class_ids_key].dtype
        self.metadata = _read_metadata(self.source)
        self.class_names = self.metadata.get("class_names") or _read_labels(self.source)
        source = self.metadata.get("source")
        dataset = source.get("dataset") if isinstance(source, dict) else None
        self.dataset = dataset if isinstance(dataset, str) else None
        self._routing = None

    def predict(self, images, batch_size=100):
        images = np.asarray(images, "float32")
        outputs = {"length": [], "capsules": [], "reconstruction": [], "predictions": []}
        for start in range(0, len(images), batch_size):
            batch = self.serving(**{self.image_key: tf.constant(images[start:start + batch_size])})
            outputs["length"].append(batch["probabilities"].numpy())
            outputs["capsules"].append(batch["capsules"].numpy())
            if "reconstruction" in batch:
                outputs["reconstruction"].append(batch["reconstruction"].numpy())
            outputs["predictions"].append(batch["class_ids"].numpy().astype("int32"))
        return {name: np.concatenate(values) for name, values in outputs.items() if values}

    def decode(self, capsules, class_ids, batch_size=256):
        if not self.reconstruction:
            raise ValueError(f"The SavedModel {self.source or ''} has no 'decode' signature.")
        capsules = np.asarray(capsules, "float32")
        class_ids = np.asarray(class_ids)
        return np.concatenate([
            self.decoder(**{
                self.capsules_key: tf.constant(capsules[start:start + batch_size]),
                self.class_ids_key: tf.constant(class_ids[start:start + batch_size],
                                                self.class_ids_dtype),
            })["reconstruction"].numpy()
            for start in range(0, len(capsules), batch_size)
        ])

    def routing_model(self):
        """The routing layers rebuilt from the export (see the module docstring), or None.

        Built on the first call; `routing_note` then says why there is none.
        """
        if self._routing is None:
            source = self.metadata.get("source")
            model_config = source.get("model_config") if isinstance(source, dict) else None
            self._routing = _rebuild_routing(self, model_config)
            self.routing_note = self._routing[1]
        return self._routing[0]


def _read_metadata(path):
    """An export's `capsnet_metadata.json` as a dict; `{}` when there is none to read."""
    if path is None:
        return {}
    try:
        metadata = load_metadata(path)
    except (OSError, ValueError):
        return {}
    return metadata if isinstance(metadata, dict) else {}


def _read_labels(path):
    """An export's `assets/labels.txt` as a list of lines, or None."""
    labels = None if path is None else os.path.join(path, "assets", LABELS_FILE)
    if labels is None or not os.path.exists(labels):
        return None
    with open(labels) as file:
        return file.read().splitlines()


def _rebuild_routing(saved, model_config):
    """A Keras CapsNet holding the export's routing weights, or `(None, reason)`."""
    if not model_config:
        return None, (
            "The export's metadata has no model configuration (source.model_config), so "
            "the routing cannot be rebuilt; export the run again with experiments/export.py."
        )
    from capsnet_tf.models import CapsNet

    try:
        model = CapsNet.from_config(dict(model_config))
        model.inference_model()  # builds every layer
    except (TypeError, ValueError, KeyError) as error:
        return None, f"The export's model configuration does not rebuild ({error})."
    variables = {variable.name.split(":")[0]: variable for variable in saved.loaded.variables}
    for layer_name in ROUTING_LAYERS:
        for weight in model.get_layer(layer_name).weights:
            variable = variables.get(weight.path)
            if variable is None or tuple(variable.shape) != tuple(weight.shape):
                return None, (
                    f"The export has no variable {weight.path} of shape {tuple(weight.shape)}; "
                    "the routing cannot be rebuilt from it."
                )
            weight.assign(variable.numpy())
    probe = np.random.default_rng(0).random((1, *saved.image_shape)).astype("float32")
    expected = saved.predict(probe)["length"][0]
    rebuilt = routing_couplings(model, probe[0])["lengths"]
    difference = float(np.max(np.abs(expected - rebuilt)))
    if not difference <= REBUILD_TOLERANCE:
        return None, (
            f"The rebuilt routing layers disagree with the export (capsule lengths differ "
            f"by {difference:.2g}); couplings are not shown."
        )
    return model, None


def open_capsnet(model=None, *, workdir=None, checkpoint="best"):
    """A `TrainedCapsNet` of whatever holds a trained CapsNet.

    Args:
        model: a `TrainedCapsNet` (returned as it is); a Keras `CapsNet`;
            the path of a `.keras` file; the path of a SavedModel directory
            (a version directory of `capsnet_tf.export.export_saved_model`)
            or what `tf.saved_model.load` returned. None with `workdir`.
        workdir: instead of `model`, a training work directory
            (`capsnet_tf.training.train_and_evaluate`): its `checkpoint` is
            loaded (`capsnet_tf.workdir.load_trained_model`) and its
            `labels.txt` gives the class names.
        checkpoint: `"best"` or `"latest"`, with `workdir`.

    Returns:
        A `KerasCapsNet` or a `SavedModelCapsNet`.

    Raises:
        FileNotFoundError: not a finished work directory (named).
        ValueError: neither or both of `model` and `workdir`; a model without
            capsules (the baseline CNNs, a SavedModel without `serving_float`);
            a checkpoint that cannot be read.

    Example:

    >>> capsnet = open_capsnet(workdir="/tmp/capsnet_mnist")  # doctest: +SKIP
    >>> capsnet.predict(images[:2])["predictions"]  # doctest: +SKIP
    array([7, 2], dtype=int32)
    >>> exported = open_capsnet("/tmp/capsnet_export/1")  # doctest: +SKIP
    """
    if (model is None) == (workdir is None):
        raise ValueError("Give exactly one of `model` and `workdir`.")
    if workdir is not None:
        from capsnet_tf.workdir import load_trained_model, read_class_names

        keras_model, config = load_trained_model(workdir, checkpoint)
        return KerasCapsNet(
            keras_model, os.path.abspath(workdir),
            read_class_names(workdir, getattr(keras_model, "num_classes", None)),
            dataset=config.dataset,
        )
    if isinstance(model, TrainedCapsNet):
        return model
    if isinstance(model, (str, os.PathLike)) and os.fspath(model).endswith(".keras"):
        return KerasCapsNet(keras.saving.load_model(os.fspath(model)), os.fspath(model))
    if isinstance(model, (str, os.PathLike)) or hasattr(model, "signatures"):
        return SavedModelCapsNet(model)
    return KerasCapsNet(model)
