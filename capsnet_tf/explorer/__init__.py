"""A capsule explorer in the browser: draw a digit, watch the capsules, move their dimensions.

`experiments/explore.py` serves it. The library part, flag-free:
`load_explorer_model` (an export or a training run, checked to be an MNIST
CapsNet), `create_app` (the Flask app: one page, JSON endpoints), `serve`,
`check_port`, `prepare_digit` (a drawing as MNIST was made) and `SampleDigits`
(MNIST test images). Needs the `explore` extra (`pip install -e ".[explore]"`,
Flask). See docs/explorer.md.
"""

from capsnet_tf.explorer.app import SLIDER_RANGE, PortInUseError, check_port, create_app, serve
from capsnet_tf.explorer.digits import SampleDigits
from capsnet_tf.explorer.model import (
    ExplorerModel,
    ModelError,
    load_explorer_model,
    resolve_model_dir,
)
from capsnet_tf.explorer.preprocess import DrawingError, image_from_data_url, prepare_digit

__all__ = [
    "DrawingError",
    "ExplorerModel",
    "ModelError",
    "PortInUseError",
    "SLIDER_RANGE",
    "SampleDigits",
    "check_port",
    "create_app",
    "image_from_data_url",
    "load_explorer_model",
    "prepare_digit",
    "resolve_model_dir",
    "serve",
]
