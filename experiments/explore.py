r"""Serves the capsule explorer: draw a digit, watch the capsules, slide their dimensions.

Usage:

    python experiments/explore.py --model=/tmp/capsnet_serving/1
    python experiments/explore.py --model=/tmp/capsnet_serving --port=8080
    python experiments/explore.py --workdir=/tmp/capsnet_mnist

Then open the printed address (http://127.0.0.1:8000/ by default). The page
classifies a drawn digit (or a real MNIST test digit), shows the ten capsule
lengths, the reconstruction from the winning capsule with one slider per
capsule dimension (-0.25 .. +0.25, the paper's Figure 4), a picker to
reconstruct it as another digit, and the routing couplings over the primary
capsule grid for every iteration. `?digit=N` in the address loads test digit
N at once.

`--model` is an export (`experiments/export.py`): a version directory or the
export directory, whose highest version is used, as `predict.py` takes it;
`--workdir` a training run instead. Needs the explore extra
(`pip install -e ".[explore]"`). A taken port, a wrong directory or a model
that is not an MNIST CapsNet stop with one line and exit status 1. A
SavedModel is code: open only exports you trust. Bad requests get a 4xx
answer with a JSON `{"error": ...}`; requests naming another host than
--host (DNS rebinding) are refused. See docs/explorer.md.
"""

import os
import sys

from absl import app, flags

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))  # the repository, when not installed

# oneDNN's CPU kernels on AVX2-only CPUs too, where TensorFlow leaves them off
# (docs/performance.md). Read once, when TensorFlow is first imported; =0 keeps them off.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

_MODEL = flags.DEFINE_string(
    "model", None, "Exported SavedModel: <export_dir>/<version>, or <export_dir> for its "
    "highest version."
)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Training work directory (instead of --model)."
)
_CHECKPOINT = flags.DEFINE_enum(
    "checkpoint", "best", ["best", "latest"], "Which checkpoint of --workdir to show."
)
_HOST = flags.DEFINE_string(
    "host", "127.0.0.1", "Address to listen on; the default serves this machine only "
    "(0.0.0.0 opens the page to the network)."
)
_PORT = flags.DEFINE_integer(
    "port", 8000, "TCP port of the page.", lower_bound=1, upper_bound=65535
)
_ALLOWED_HOSTS = flags.DEFINE_list(
    "allowed_hosts", [], "More host names the page is opened by (a DNS name of this "
    "machine, for --host=0.0.0.0); requests naming any other host are refused, against DNS "
    "rebinding. --host itself, localhost and 127.0.0.1 are always accepted."
)
_DATA_DIR = flags.DEFINE_string(
    "data_dir", None, "TFDS data directory holding MNIST, for the test digits (default: "
    "TFDS_DATA_DIR or ~/tensorflow_datasets)."
)
flags.register_multi_flags_validator(
    ["model", "workdir"],
    lambda values: (values["model"] is None) != (values["workdir"] is None),
    message="give exactly one of --model (an export) and --workdir (a training run)",
)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    from capsnet_tf.explorer import (
        ModelError,
        PortInUseError,
        SampleDigits,
        check_port,
        create_app,
        load_explorer_model,
        serve,
    )
    from capsnet_tf.extras import MissingDependencyError, require

    try:
        # Both before the slow model loading.
        require("flask", "explore", "The capsule explorer")
        check_port(_HOST.value, _PORT.value)
        model = load_explorer_model(_MODEL.value, _WORKDIR.value, _CHECKPOINT.value)
        page = create_app(model, SampleDigits(_DATA_DIR.value), host=_HOST.value,
                          allowed_hosts=_ALLOWED_HOSTS.value)
    except (PortInUseError, ModelError, MissingDependencyError) as error:
        sys.exit(f"error: {error}")
    if model.couplings_note:
        print(f"note: no routing couplings: {model.couplings_note}", flush=True)

    def ready(url):
        print(f"Capsule explorer of {model.source} at {url} (Ctrl-C to stop)", flush=True)

    try:
        serve(page, _HOST.value, _PORT.value, ready=ready)  # returns on Ctrl-C
    except PortInUseError as error:
        sys.exit(f"error: {error}")
    except KeyboardInterrupt:  # before the server's own loop caught it
        pass
    print("Stopped.")


if __name__ == "__main__":
    app.run(main)
