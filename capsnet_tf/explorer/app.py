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

Only what the page sends is accepted, each bound checked before the work it
guards: the Host header (`host_checker`, against DNS rebinding), the body's
size, its JSON's depth and size (`parse_json_object`), each field's type and
range, a drawing's format and size (`image_from_data_url`), and the number
of model calls at once (`_Turns`). A bad request gets a 4xx answer with
`{"error": ...}` naming the problem; 503 means that the model cannot answer
now. The bounds are the constants below; docs/explorer.md lists them.
"""

import contextlib
import errno
import ipaddress
import json
import logging
import os
import re
import socket
import threading
import time

import numpy as np

from capsnet_tf.explorer.preprocess import (
    MAX_PIXELS,
    DrawingError,
    image_from_data_url,
    prepare_digit,
)
from capsnet_tf.extras import require

__all__ = [
    "CAPSULE_BOUND",
    "SLIDER_RANGE",
    "ApiError",
    "PortInUseError",
    "check_port",
    "create_app",
    "host_checker",
    "limit_pillow",
    "make_server",
    "parse_json_object",
    "serve",
]

# The paper's Figure 4 perturbs each dimension by -0.25 .. +0.25.
SLIDER_RANGE = 0.25
# A class capsule is squashed to a length below 1, so each of its values lies
# in (-1, 1), and a slider adds at most SLIDER_RANGE: a value outside
# +-1.25 is one the page never sends and the decoder never saw.
CAPSULE_BOUND = 1.0 + SLIDER_RANGE
STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
# A 280x280 canvas as a PNG data URL is a few kilobytes (420 KB if every
# pixel were noise); refuse anything far bigger.
MAX_REQUEST_BYTES = 2**20
# The deepest request the page sends is {"pixels": [[...], ...]}: 3 levels;
# the largest, 28x28 pixels: 784 values.
MAX_JSON_DEPTH = 4
MAX_JSON_ITEMS = 1024
# Requests running the model (or decoding a drawing) at once; the others wait
# up to BUSY_WAIT_S for a turn, then get 503 with Retry-After.
MAX_CONCURRENT_CALLS = 2
BUSY_WAIT_S = 2.0
# The fields of each POST endpoint's JSON object; any other is refused.
_FIELDS = {
    "classify": ("drawing", "pixels", "test_index"),
    "decode": ("capsule", "class_id"),
}
# A JSON string, escapes included (unrolled so that it scans megabytes in one pass).
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
# Served with every answer: no framing by other sites, no content sniffing, and
# a page that loads nothing from elsewhere.
_SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                               "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}
_LOG = logging.getLogger(__name__)


class PortInUseError(OSError):
    """The port is taken (or may not be used); the message names it."""


class ApiError(Exception):
    """A request the explorer answers with `{"error": message}` and `status`.

    4xx: the request is wrong, and the message says how; 503: the model
    cannot answer now (`retry_after` seconds, when it is busy).
    """

    def __init__(self, message, status=400, retry_after=None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.retry_after = retry_after


def _timed(function, *args):
    """`(result, milliseconds)` of one call."""
    start = time.perf_counter()
    result = function(*args)
    return result, (time.perf_counter() - start) * 1000.0


def _pixels(image, digits=4):
    return np.round(np.asarray(image, "float64"), digits).tolist()


def _shown(value, limit=40):
    """A short description of a JSON value for an error message: its type and a prefix."""
    kinds = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
             list: "a list", dict: "an object", type(None): "null"}
    text = json.dumps(value) if not isinstance(value, (list, dict, type(None))) else ""
    if len(text) > limit:
        text = text[:limit] + "..."
    return kinds.get(type(value), type(value).__name__) + (f" ({text})" if text else "")


def json_structure(text):
    """`(depth, items)` of JSON `text` without parsing it: its deepest nesting and its size.

    String literals are removed first (brackets and commas in strings do not
    count); `depth` is then the highest running count of `[`/`{` minus
    `]`/`}`, and `items` the number of commas plus one (at least the number
    of values in any one array or object). Linear in the text's length: it
    bounds a request before `json.loads` recurses into it or builds it.
    """
    bare = _JSON_STRING.sub('""', text)
    codes = np.frombuffer(bare.encode("utf-8"), np.uint8)
    steps = np.isin(codes, (ord("["), ord("{"))).astype(np.int32)
    steps -= np.isin(codes, (ord("]"), ord("}")))
    return int(np.cumsum(steps).max(initial=0)), bare.count(",") + 1


def _refuse_constant(name):
    raise ValueError(f"{name} is not a JSON number")


def parse_json_object(body, fields, max_depth=MAX_JSON_DEPTH, max_items=MAX_JSON_ITEMS):
    """The JSON object of a request body, checked before and after parsing.

    Before: UTF-8, nested at most `max_depth` deep, at most `max_items`
    values (`json_structure`). While: `NaN` and `Infinity`, which Python's
    `json` accepts but JSON has not, are refused. After: an object whose
    keys are all in `fields`.

    Args:
        body: the request's bytes (already bounded by MAX_REQUEST_BYTES).
        fields: the names the endpoint reads.
        max_depth: the deepest nesting accepted.
        max_items: the most values accepted.

    Raises:
        ApiError: (400) which of those it failed.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ApiError(f"The body is not UTF-8 text ({error.reason} at byte {error.start}).")
    depth, items = json_structure(text)
    if depth > max_depth:
        raise ApiError(f"The JSON is nested {depth} levels deep; at most {max_depth} are "
                       "accepted.")
    if items > max_items:
        raise ApiError(f"The JSON holds {items} or more values; at most {max_items} are "
                       "accepted.")
    try:
        request = json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as error:
        raise ApiError(f"The body is not valid JSON ({error}).")
    if not isinstance(request, dict):
        raise ApiError(f"Send a JSON object with {_either(fields)}; received {_shown(request)}.")
    unknown = sorted(set(request) - set(fields))
    if unknown:
        raise ApiError(f"Unknown field {unknown[0][:40]!r}; the fields are {_either(fields)}.")
    return request


def _either(fields):
    names = [f"'{name}'" for name in fields]
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]


def _integer(request, name, high=None):
    """`request[name]`, an integer in [0, high): a JSON integer, not a boolean, float or string."""
    value = request[name]
    if type(value) is not int:  # bool is a subclass of int
        raise ApiError(f"'{name}' must be an integer; received {_shown(value)}.")
    if value < 0 or (high is not None and value >= high):
        allowed = "0 or more" if high is None else f"in [0, {high})"
        raise ApiError(f"'{name}' must be {allowed}; received {_shown(value)}.")
    return value


def _numbers(request, name, shape, low, high, meaning):
    """`request[name]` as float32 of `shape`: nested lists of JSON numbers in [low, high].

    Checked in Python before NumPy sees it: a boolean, a string or an
    integer too large for a float is refused, not converted.
    """
    described = "x".join(str(size) for size in shape)

    def problem(detail):
        return ApiError(f"'{name}' must be {described} {meaning}; {detail}.")

    def check(value, where):
        at = name + "".join(f"[{index}]" for index in where)
        depth = len(where)
        if depth == len(shape):
            if type(value) not in (int, float):
                raise problem(f"{at} is {_shown(value)}")
            if not low <= value <= high:  # also false for an infinity
                raise problem(f"{at} is {_shown(value)}")
            return
        if type(value) is not list:
            raise problem(f"{at} is {_shown(value)}")
        if len(value) != shape[depth]:
            raise problem(f"{at} has {len(value)} entries, not {shape[depth]}")
        for index, item in enumerate(value):
            check(item, [*where, index])

    check(request[name], [])
    return np.asarray(request[name], "float32")


def host_checker(host, allowed_hosts=()):
    """A test of a request's Host header: is it a name of the address served?

    A page on another site can reach a server on 127.0.0.1 through DNS
    rebinding (its own name, re-resolved to 127.0.0.1), but its requests
    still carry its own name in the Host header. Accepted names: `host`
    itself, `localhost`, `127.0.0.1`, `::1`, and `allowed_hosts`; for a
    server on every address (`0.0.0.0` or `::`) also any IP address and the
    machine's own name. The port is not compared: no name of another site
    gets through whatever its port.

    Args:
        host: the address the server listens on (`--host`).
        allowed_hosts: more names the server is reached by (`--allowed_hosts`).

    Returns:
        `check(host_header) -> bool`.
    """
    names = {_host_name(name) for name in (host, *allowed_hosts)}
    names |= {"localhost", "127.0.0.1", "::1"}
    every_address = _host_name(host) in ("0.0.0.0", "::", "")
    if every_address:
        names |= {socket.gethostname().lower(), socket.getfqdn().lower()}

    def check(host_header):
        name = _host_name(host_header)
        if not name:
            return False
        if name in names:
            return True
        if every_address:
            try:
                ipaddress.ip_address(name)
                return True
            except ValueError:
                return False
        return False

    return check


def _host_name(host):
    """The lower-case name of a `host[:port]`, `[v6][:port]` or bare address, sans port."""
    host = (host or "").strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


def _display_source(path):
    """The model's name for the page, without where it lives on disk.

    `<export_dir>/<version>` shows as `export_dir/version`, anything else as
    its last component.
    """
    path = os.path.normpath(path)
    name = os.path.basename(path)
    if name.isdigit():
        name = f"{os.path.basename(os.path.dirname(path))}/{name}"
    return name


class _Turns:
    """At most `count` callers at once; the next waits up to `wait_s`, then gets 503."""

    def __init__(self, count, wait_s):
        self._semaphore = threading.BoundedSemaphore(count)
        self._wait_s = wait_s

    @contextlib.contextmanager
    def take(self):
        if not self._semaphore.acquire(timeout=self._wait_s):
            raise ApiError("The model is busy with other requests; try again in a second.",
                           503, retry_after=1)
        try:
            yield
        finally:
            self._semaphore.release()


def _run_model(function, *args):
    """`_timed(function, *args)`; a failure of the model itself is a 503, logged."""
    try:
        return _timed(function, *args)
    except Exception as error:  # TensorFlow's errors have no common base besides Exception
        _LOG.exception("the model failed")
        raise ApiError(f"The model could not answer ({type(error).__name__}).", 503)


def create_app(model, test_digits=None, host="127.0.0.1", allowed_hosts=(),
               max_concurrent=MAX_CONCURRENT_CALLS, busy_wait_s=BUSY_WAIT_S):
    """The Flask app of the explorer page for an `ExplorerModel`.

    Every answer under `/api/`, errors included, is JSON: a bad request gets
    a 4xx and `{"error": ...}` naming the problem; 503 means that the model
    cannot answer (busy: with `Retry-After`). docs/explorer.md lists what is
    accepted and refused.

    Args:
        model: an `ExplorerModel` (`load_explorer_model`).
        test_digits: a `SampleDigits` for the "random test digit" button (None:
            the button says that MNIST is not available).
        host: the address served; requests naming another host are refused
            (`host_checker`).
        allowed_hosts: more host names to accept.
        max_concurrent: requests that may run the model (or decode a
            drawing) at once.
        busy_wait_s: how long a request beyond them waits before its 503.

    Returns:
        A `flask.Flask` app; `app.test_client()` drives it without a server.
    """
    flask = require("flask", "explore", "The capsule explorer")
    app = flask.Flask(__name__, static_folder=STATIC_DIR, static_url_path="/static")
    app.config["MAX_CONTENT_LENGTH"] = MAX_REQUEST_BYTES
    app.json.sort_keys = False
    _add_error_handlers(app, flask)
    _add_host_check_and_headers(app, flask, host, host_checker(host, allowed_hosts))
    _add_routes(app, flask, model, test_digits, _Turns(max_concurrent, busy_wait_s))
    return app


def _add_error_handlers(app, flask):
    """Answers every error as `{"error": message}` with its status, so the page can show it."""
    from werkzeug.exceptions import HTTPException

    def error_reply(message, status, headers=None):
        return flask.jsonify({"error": message}), status, headers or {}

    @app.errorhandler(ApiError)
    def api_error(error):
        headers = {"Retry-After": str(error.retry_after)} if error.retry_after else None
        return error_reply(error.message, error.status, headers)

    @app.errorhandler(HTTPException)
    def http_error(error):
        headers = {name: value for name, value in error.get_headers()
                   if name.lower() in ("allow", "retry-after")}
        return error_reply(_http_error_message(error, flask.request), error.code, headers)

    @app.errorhandler(Exception)
    def unexpected(error):  # a bug: still JSON, and logged with its traceback
        _LOG.error("unexpected error", exc_info=error)
        return error_reply(f"Internal error ({type(error).__name__}).", 500)


def _http_error_message(error, request):
    """The message of a Werkzeug HTTP error: what was asked, and what the explorer takes."""
    methods = [method for method in getattr(error, "valid_methods", None) or ()
               if method not in ("HEAD", "OPTIONS")]
    messages = {
        404: f"There is nothing at {request.path}.",
        405: f"{request.path} does not take {request.method}; it takes "
             f"{' or '.join(sorted(methods)) or 'another method'}.",
        413: f"The request is larger than {MAX_REQUEST_BYTES // 2**20} MiB, the most the "
             "explorer reads.",
    }
    return messages.get(error.code, f"{error.name}: {error.description}")


def _add_host_check_and_headers(app, flask, host, host_allowed):
    """Refuses requests naming another host (DNS rebinding); adds the security headers."""

    @app.before_request
    def check_host():
        if not host_allowed(flask.request.host):
            raise ApiError(
                f"This server does not serve the host {flask.request.host[:100]!r}; open it "
                f"as http://{host}:PORT/ (or start it with --allowed_hosts).", 400)

    @app.after_request
    def security_headers(response):
        response.headers.update(_SECURITY_HEADERS)
        return response


def _add_routes(app, flask, model, test_digits, turns):
    """The page and its four JSON endpoints; the model runs in one of `turns`."""
    num_classes, capsule_dim = model.num_classes, model.capsule_dim

    @app.get("/")
    def index():
        return flask.send_from_directory(STATIC_DIR, "index.html")

    @app.get("/api/info")
    def info():
        return flask.jsonify(_model_info(model, capsule_dim, test_digits))

    @app.get("/api/test_digit")
    def get_test_digit():
        requested = _test_digit_index(flask.request.args.get("index", ""))
        index, image, label = _test_digit(test_digits, requested)
        return flask.jsonify({"index": index, "label": label, "pixels": _pixels(image)})

    @app.post("/api/classify")
    def classify():
        request = _json_object(flask.request, "classify")
        image, index, label = _classify_input(request, test_digits, turns)
        if not image.any():
            return flask.jsonify({"empty": True, "input": _pixels(image)})
        return flask.jsonify(_classification(model, image, index, label, turns))

    @app.post("/api/decode")
    def decode():
        request = _json_object(flask.request, "decode")
        capsule, class_id = _decode_input(request, capsule_dim, num_classes)
        with turns.take():
            reconstruction, decode_ms = _run_model(model.decode, capsule, class_id)
        return flask.jsonify({
            "reconstruction": _pixels(reconstruction),
            "server_ms": {"decode": round(decode_ms, 2)},
        })


def _json_object(request, endpoint):
    """The checked JSON object of a POST to `endpoint` (`parse_json_object`); 400 if not JSON."""
    if not request.is_json:
        raise ApiError(f"Send a JSON object (Content-Type: application/json) with "
                       f"{_either(_FIELDS[endpoint])}.")
    return parse_json_object(request.get_data(cache=False), _FIELDS[endpoint])


def _model_info(model, capsule_dim, test_digits):
    """`GET /api/info`'s reply: what the page needs to label and bound its controls."""
    return {
        "source": _display_source(model.source),
        "class_names": model.class_names,
        "capsule_dim": capsule_dim,
        "slider_range": SLIDER_RANGE,
        "capsule_bound": CAPSULE_BOUND,
        "routing_iterations": model.routing_iterations,
        "couplings_note": model.couplings_note,
        "test_digits": test_digits is not None,
    }


def _test_digit_index(raw):
    """The `index` query parameter as an integer, None when empty; 400 unless 1-9 digits."""
    if raw and not (raw.isascii() and raw.isdigit() and len(raw) <= 9):
        raise ApiError(f"index must be a whole number of at most 9 digits; received "
                       f"{raw[:40]!r}.")
    return int(raw) if raw else None


def _test_digit(test_digits, index):
    """`(index, image, label)` of MNIST test image `index` (None: random); 4xx if there is none."""
    if test_digits is None:
        raise ApiError("This explorer has no MNIST test set.", 404)
    try:
        return test_digits.get(index)
    except IndexError as error:
        raise ApiError(str(error))
    except LookupError as error:  # MNIST not prepared: the message says where it looked
        raise ApiError(str(error), 404)


def _classify_input(request, test_digits, turns):
    """`(image, test_index, label)` of a classify request: a test digit, pixels or a drawing."""
    given = [name for name in _FIELDS["classify"] if name in request]
    if len(given) != 1:
        raise ApiError("Send exactly one of 'drawing' (a data URL), 'pixels' or "
                       f"'test_index'; received {len(given)}.")
    label = index = None
    if "test_index" in request:
        index, image, label = _test_digit(test_digits, _integer(request, "test_index"))
    elif "pixels" in request:
        image = _numbers(request, "pixels", (28, 28), 0.0, 1.0, "values in [0, 1]")
    else:
        image = _drawn_digit(request["drawing"], turns)
    return image, index, label


def _drawn_digit(drawing, turns):
    """A canvas's data URL prepared as MNIST was (`prepare_digit`), in one of `turns`."""
    if not isinstance(drawing, str):
        raise ApiError(f"'drawing' must be a data URL (a string); received "
                       f"{_shown(drawing)}.")
    with turns.take():
        try:
            return prepare_digit(image_from_data_url(drawing))
        except DrawingError as error:
            raise ApiError(str(error))


def _classification(model, image, index, label, turns):
    """`POST /api/classify`'s reply for a non-empty `image`: the model's answer, timed."""
    with turns.take():
        result, classify_ms = _run_model(model.classify, image)
        couplings, couplings_ms = _run_model(model.couplings, image)
    class_id = result["class_id"]
    return {
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
    }


def _decode_input(request, capsule_dim, num_classes):
    """`(capsule, class_id)` of a decode request, each within what the decoder was trained on."""
    missing = [name for name in _FIELDS["decode"] if name not in request]
    if missing:
        raise ApiError(f"Send {{'capsule': [{capsule_dim} numbers], 'class_id': int}}; "
                       f"'{missing[0]}' is missing.")
    capsule = _numbers(request, "capsule", (capsule_dim,), -CAPSULE_BOUND, CAPSULE_BOUND,
                       f"finite numbers in [-{CAPSULE_BOUND}, {CAPSULE_BOUND}] (a capsule's "
                       f"values lie in (-1, 1); a slider adds at most {SLIDER_RANGE})")
    class_id = _integer(request, "class_id", num_classes)
    return capsule, class_id


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


def limit_pillow():
    """Sets Pillow's decompression-bomb limit, for this process, to the explorer's.

    `image_from_data_url` refuses a drawing of more than `MAX_PIXELS` from
    its header already; with this Pillow's own check (a warning above
    `MAX_IMAGE_PIXELS`, an error above twice that, instead of 89 and 179
    million pixels) stands behind it for any image the process opens.
    Process-wide, so it is set by `serve`, not by `create_app`.
    """
    from PIL import Image

    Image.MAX_IMAGE_PIXELS = MAX_PIXELS


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
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    limit_pillow()
    server = make_server(app, host, port)
    shown = f"[{host}]" if ":" in host else host
    if ready is not None:
        ready(f"http://{shown}:{server.server_port}/")
    try:
        server.serve_forever()
    finally:
        server.server_close()
