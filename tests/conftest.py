"""Shared fixtures: seeds, the TFDS data directory, the --run-large switch."""

import glob
import os

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SHARED_TFDS = os.path.join(os.path.dirname(REPO_ROOT), "shared", "data", "tensorflow_datasets")

# Point TFDS at the shared, prepared copy unless the user chose a directory.
if not os.environ.get("TFDS_DATA_DIR") and os.path.isdir(_SHARED_TFDS):
    os.environ["TFDS_DATA_DIR"] = _SHARED_TFDS
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def pytest_addoption(parser):
    parser.addoption("--run-large", action="store_true", help="run tests marked large")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-large"):
        return
    skip = pytest.mark.skip(reason="large test: pass --run-large to run it")
    for item in items:
        if "large" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed_and_policy():
    """Every test starts from the same seeds and the float32 policy."""
    import keras

    keras.utils.set_random_seed(1234)
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")


@pytest.fixture(scope="session")
def tfds_data_dir():
    """The TFDS directory holding a prepared MNIST; skips when there is none."""
    from capsnet_tf.data import resolve_data_dir

    data_dir = resolve_data_dir()
    if not glob.glob(os.path.join(data_dir, "mnist", "*", "dataset_info.json")):
        pytest.skip(f"MNIST is not prepared in {data_dir}; set TFDS_DATA_DIR")
    return data_dir
