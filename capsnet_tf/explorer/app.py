"""The explorer's web app: one page and four JSON endpoints, on Flask.

Flask because the page is ours: one hand-written HTML/JS file with stable
element ids, each slider move one small `POST /api/decode`, nothing generated
that a test or a user has to guess at. The endpoints (all JSON):

- `GET /api/info`: class names, capsule dimension, slider range, routing
  iterations, and why couplings are off if they are;
- `GET /api/test_digit?index=N`: MNIST test image `N` (random without it);
- `POST /api/classify` with `{"drawing": "data:image/png;base64,..."}` (a
  canvas, prepared as MNIST was made: `prepare_digit`), `{"pixels": 28x28}`
  (already prepared, in [0, 1]) or `{"test_index": N}`: the input the model
  saw, capsule lengths, the winning class, all class capsules, the
  reconstruction and the routing couplings;
- `POST /api/decode` with `{"capsule": [16 numbers], "class_id": k}`: the
  reconstruction of that capsule as class `k`.

Images travel as nested lists of pixel values in [0, 1], rows first; every
reply carries `server_ms`, the time the model took.
"""

import errno
import os
import socket
import time

import numpy as np

from capsnet_tf.explorer.preprocess import DrawingError, image_from_data_url, prepare_digit
from capsnet_tf.extras import require

__all__ = ["SLIDER_RANGE", "PortInUseError", "check_port", "create_app", "make_server", "serve"]

# The paper's Figure 4 perturbs each dimension by -0.25 .. +0.25.
SLIDER_RANGE = 0.25
STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
# A 280x280 canvas as a PNG is a few kilobytes; refuse anything far bigger.
MAX_REQUEST_BYTES = 4 * 2**20


class PortInUseError(OSError):
    """The port is taken (or may not be used); the message names it."""


def _timed(function, *args):
    """`(result, milliseconds)` of one call."""
    start = time.perf_counter()
    result = function(*args)
    return result, (time.perf_counter() - start) * 1000.0


def _pixels(image, digits=4):
    return np.round(np.asarray(image, "float64"), digits).tolist()


def create_app(model, test_digits=None):
    """The Flask app of the explorer page for an `ExplorerModel`.

    Args:
        model: an `ExplorerModel` (`load_explorer_model`).
        test_digits: a `TestDigits` for the "random test digit" button (None:
            the button says that MNIST is not available).

    Returns:
        A `flask.Flask` app; `app.test_client()` drives it without a server.
    """
    flask = require("flask", "explore", "The capsule explorer")
    app = flask.Flask(__name__, static_folder=STATIC_DIR, static_url_path="/static")
    app.config["MAX_CONTENT_LENGTH"] = MAX_REQUEST_BYTES
    app.json.sort_keys = False

    def bad_request(message, status=400):
        return flask.jsonify({"error": message}), status

    @app.get("/")
    def index():
        return flask.send_from_directory(STATIC_DIR, "index.html")

    @app.get("/api/info")
    def info():
        return flask.jsonify({
            "source": model.source,
            "class_names": model.class_names,
            "capsule_dim": model.capsule_dim,
            "slider_range": SLIDER_RANGE,
            "routing_iterations": model.routing_iterations,
            "couplings_note": model.couplings_note,
            "test_digits": test_digits is not None,
        })

    def test_digit(index):
        if test_digits is None:
            raise LookupError("No MNIST test set was given to the explorer.")
        return test_digits.get(index)

    @app.get("/api/test_digit")
    def get_test_digit():
        raw = flask.request.args.get("index")
        try:
            index = None if raw in (None, "") else int(raw)
            index, image, label = test_digit(index)
        except ValueError:
            return bad_request(f"index must be a whole number; received {raw!r}.")
        except IndexError as error:
            return bad_request(str(error))
        except LookupError as error:
            return bad_request(str(error), 503)
        return flask.jsonify({"index": index, "label": label, "pixels": _pixels(image)})

    @app.post("/api/classify")
    def classify():
        request = flask.request.get_json(silent=True)
        if not isinstance(request, dict):
            return bad_request("Send a JSON object with 'drawing', 'pixels' or 'test_index'.")
        label = index = None
        try:
            if "test_index" in request:
                index, image, label = test_digit(int(request["test_index"]))
            elif "pixels" in request:
                image = np.asarray(request["pixels"], "float32")
                if image.shape != (28, 28) or not np.all((image >= 0) & (image <= 1)):
                    return bad_request("'pixels' must be 28x28 values in [0, 1].")
            elif "drawing" in request:
                image = prepare_digit(image_from_data_url(request["drawing"]))
            else:
                return bad_request("Send 'drawing' (a data URL), 'pixels' or 'test_index'.")
        except (TypeError, ValueError, IndexError, DrawingError) as error:
            return bad_request(str(error))
        except LookupError as error:  # no MNIST test set
            return bad_request(str(error), 503)
        if not image.any():
            return flask.jsonify({"empty": True, "input": _pixels(image)})
        result, classify_ms = _timed(model.classify, image)
        couplings, couplings_ms = _timed(model.couplings, image)
        class_id = result["class_id"]
        return flask.jsonify({
            "empty": False,
            "input": _pixels(image),
            "test_index": index,
            "label": label,
            "lengths": _pixels(result["lengths"], 5),
            "class_id": class_id,
            "class_name": model.class_names[class_id],
            "probability": round(float(result["lengths"][class_id]), 5),
            "capsules": _pixels(result["capsules"], 6),
            "reconstruction": _pixels(result["reconstruction"]),
            "couplings": None if couplings is None else _pixels(couplings, 4),
            "server_ms": {"classify": round(classify_ms, 2), "couplings": round(couplings_ms, 2)},
        })

    @app.post("/api/decode")
    def decode():
        request = flask.request.get_json(silent=True)
        try:
            capsule = np.asarray(request["capsule"], "float32")
            class_id = int(request["class_id"])
        except (TypeError, KeyError, ValueError):
            return bad_request("Send {'capsule': [numbers], 'class_id': int}.")
        if capsule.shape != (model.capsule_dim,) or not np.all(np.isfinite(capsule)):
            return bad_request(f"'capsule' must be {model.capsule_dim} finite numbers.")
        if not 0 <= class_id < model.num_classes:
            return bad_request(f"'class_id' must be in [0, {model.num_classes}).")
        reconstruction, decode_ms = _timed(model.decode, capsule, class_id)
        return flask.jsonify({
            "reconstruction": _pixels(reconstruction),
            "server_ms": {"decode": round(decode_ms, 2)},
        })

    return app


def check_port(host, port):
    """Raises `PortInUseError` unless `host:port` can be listened on now.

    Called before the (slow) model loading, so a taken port is reported at
    once. `SO_REUSEADDR` as the server sets it: a port left in TIME_WAIT by
    an earlier run counts as free, one with a listener does not.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            raise PortInUseError(_port_message(host, port, error))


def _port_message(host, port, error):
    if error.errno == errno.EADDRINUSE:
        return (f"port {port} on {host} is already in use (another explorer or server?); "
                "choose another with --port.")
    if error.errno == errno.EACCES:
        return f"port {port} on {host} needs more privileges; choose one above 1023 with --port."
    return f"cannot listen on {host}:{port} ({error.strerror or error}); check --host and --port."


def make_server(app, host, port):
    """A threaded Werkzeug server for `app` whose `server_close` waits for its requests.

    Raises:
        PortInUseError: the port is taken.
    """
    from werkzeug.serving import make_server as werkzeug_server

    try:
        server = werkzeug_server(host, port, app, threaded=True)
    except OSError as error:
        raise PortInUseError(_port_message(host, port, error))
    except SystemExit:  # Werkzeug exits when the port is taken
        raise PortInUseError(_port_message(host, port, OSError(errno.EADDRINUSE, "in use")))
    # Non-daemon request threads, joined by `server_close` (socketserver's switches).
    server.daemon_threads = False
    server.block_on_close = True
    return server


def serve(app, host, port, ready=None):
    """Serves `app` on `host:port` until Ctrl-C (threaded Werkzeug server), then returns.

    Ctrl-C returns once the requests in flight have answered
    (`make_server`): Werkzeug's request threads are daemons, and the
    interpreter shutting down under one still running the model aborted
    the process (SIGABRT in 2 of 8 stops with classifications in flight).

    Args:
        app: the Flask app.
        host: address to listen on (`127.0.0.1`: this machine only).
        port: TCP port; 0 picks a free one.
        ready: called with the page's URL once the server listens.

    Raises:
        PortInUseError: the port was taken between `check_port` and now.
    """
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    server = make_server(app, host, port)
    shown = f"[{host}]" if ":" in host else host
    if ready is not None:
        ready(f"http://{shown}:{server.server_port}/")
    try:
        server.serve_forever()
    finally:
        server.server_close()
