"""The one adapter of a trained CapsNet: a Keras model, a work directory, a `.keras`
file and a SavedModel give the same predictions, drawings and routing couplings."""

import json
import os
import shutil

import keras
import numpy as np
import pytest

from capsnet_tf.export import METADATA_FILE, export_saved_model
from capsnet_tf.models import BaselineCNN
from capsnet_tf.routing import routing_couplings
from capsnet_tf.trained import KerasCapsNet, SavedModelCapsNet, open_capsnet
from tests.test_export import make_workdir, mnist_sized_model


@pytest.fixture(scope="module")
def model():
    """A tiny CapsNet whose class capsules are long, as a trained one's are.

    Untrained, they are ~1e-3 long, where `Length`'s epsilon alone moves the
    model's lengths by more than the routing rebuild's tolerance.
    """
    keras.utils.set_random_seed(7)
    model = mnist_sized_model()
    kernel = model.get_layer("class_capsules").kernel
    kernel.assign(kernel * 20.0)
    return model


@pytest.fixture(scope="module")
def export_dir(model, tmp_path_factory):
    """An export whose metadata holds the model's configuration, as experiments/export.py
    writes it."""
    base = tmp_path_factory.mktemp("trained")
    metadata = {"model_config": model.get_config(), "dataset": "letters"}
    return export_saved_model(model, str(base), class_names=list("abcdefghij"),
                              metadata=metadata, verify=False)


@pytest.fixture(scope="module")
def images():
    return np.random.default_rng(3).random((5, 28, 28, 1)).astype("float32")


def test_every_form_predicts_and_draws_alike(model, export_dir, images, tmp_path):
    keras_path = str(tmp_path / "model.keras")
    model.save(keras_path)
    workdir = make_workdir(str(tmp_path / "run"), model)
    forms = {
        "keras": open_capsnet(model),
        ".keras": open_capsnet(keras_path),
        "workdir": open_capsnet(workdir=workdir),
        "saved_model": open_capsnet(export_dir),
    }
    assert isinstance(forms["saved_model"], SavedModelCapsNet)
    assert forms[".keras"].source == keras_path
    assert forms["workdir"].source == os.path.abspath(workdir)
    expected = forms["keras"].predict(images, batch_size=2)
    capsules = expected["capsules"]
    class_ids = expected["predictions"]
    drawn = forms["keras"].decode(capsules, class_ids)
    for name, capsnet in forms.items():
        assert open_capsnet(capsnet) is capsnet
        assert (capsnet.num_classes, capsnet.capsule_dim, capsnet.image_shape,
                capsnet.reconstruction) == (10, 6, (28, 28, 1), True), name
        outputs = capsnet.predict(images, batch_size=2)
        for key in ("length", "capsules", "reconstruction", "predictions"):
            np.testing.assert_allclose(outputs[key], expected[key], atol=1e-5,
                                       err_msg=f"{name} {key}")
        np.testing.assert_allclose(capsnet.decode(capsules, class_ids), drawn, atol=1e-5,
                                   err_msg=name)
    assert forms["saved_model"].class_names == list("abcdefghij")
    assert forms["keras"].class_names is None
    assert forms["workdir"].dataset == "mnist" and forms["keras"].dataset is None


def test_the_routing_of_an_export_is_rebuilt_from_its_metadata(model, export_dir, images):
    exported = open_capsnet(export_dir)
    assert exported.routing_model() is not None, exported.routing_note
    assert exported.routing_note is None and exported.dataset == "letters"
    expected = routing_couplings(model, images[0])
    rebuilt = exported.routing_couplings(images[0])
    for key in ("couplings", "primary_lengths", "lengths"):
        np.testing.assert_allclose(rebuilt[key], expected[key], atol=1e-5, err_msg=key)
    assert open_capsnet(model).routing_model() is model


def test_an_export_without_the_model_configuration_has_no_routing(export_dir, tmp_path):
    metadata_path = os.path.join(export_dir, "assets", METADATA_FILE)
    with open(metadata_path) as file:
        metadata = json.load(file)
    copy = tmp_path / "copy"
    shutil.copytree(export_dir, copy)
    del metadata["source"]["model_config"]
    with open(copy / "assets" / METADATA_FILE, "w") as file:
        json.dump(metadata, file)
    exported = open_capsnet(str(copy))
    assert exported.routing_couplings(np.zeros((28, 28, 1), "float32")) is None
    assert "no model configuration" in exported.routing_note


def test_what_is_not_a_capsnet_is_refused(model):
    with pytest.raises(ValueError, match="exactly one"):
        open_capsnet()
    with pytest.raises(ValueError, match="exactly one"):
        open_capsnet(model, workdir="somewhere")
    with pytest.raises(ValueError, match="is a Sequential, not a CapsNet"):
        KerasCapsNet(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]))
    with pytest.raises(ValueError, match="run is a BaselineCNN, not a CapsNet"):
        KerasCapsNet(BaselineCNN(image_shape=(28, 28, 1)), source="run")
    no_decoder = open_capsnet(mnist_sized_model(reconstruction=False))
    assert not no_decoder.reconstruction
    with pytest.raises(ValueError, match="no decoder"):
        no_decoder.decode(np.zeros((1, 10, 6), "float32"), [0])
