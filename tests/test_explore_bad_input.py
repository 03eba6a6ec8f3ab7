"""The explorer's API under bad input: a 4xx with a JSON `{"error": ...}`, never a 500.

Each case of issue 43 is a test of its own, through Flask's test client:
JSON nested 100,000 deep, `Infinity` and `1e999` where an integer goes, a
PNG whose header claims 20000x20000 pixels, a PNG with broken pixel data,
an EPS labelled as a PNG, a large blank PNG, framework errors (404, 405,
413), another site's Host header (DNS rebinding), loosely typed fields,
unbounded capsule values, class names that do not match the capsules, a
busy or failing model. Then a seeded fuzzer sends a few hundred random JSON
bodies, random bytes and mutated PNGs to every endpoint: every answer is
below 500, and every answer under `/api/` is JSON.

Most tests use a stand-in model (NumPy functions in an `ExplorerModel`: no
TensorFlow in the request path, so a busy or failing model can be staged);
the fuzzer and the class-name check use a small untrained CapsNet exported
as `tests/test_predict.py` exports one.
"""

import base64
import io
import json
import os
import random
import struct
import threading
import zlib

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("flask", reason='the explorer needs Flask: pip install -e ".[explore]"')

from capsnet_tf.explorer import ExplorerModel, ModelError, SampleDigits, create_app  # noqa: E402
from capsnet_tf.explorer import app as explorer_app  # noqa: E402
from tests.test_model import small_model  # noqa: E402

STATIC = os.path.join(os.path.dirname(explorer_app.__file__), "static")
DIGITS = [str(digit) for digit in range(10)]


# --- helpers ---------------------------------------------------------------------------


def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def raw_png(width, height, idat=None, color_type=0, extra=()):
    """A grayscale PNG built by hand, so that its header can say what it likes."""
    header = struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0)
    if idat is None:
        idat = zlib.compress(b"\0" * ((width + 1) * height), 9)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", header) + b"".join(extra)
            + png_chunk(b"IDAT", idat) + png_chunk(b"IEND", b""))


def canvas_png(size=280, seed=0):
    """What the page sends: an RGBA canvas with a white stroke on black."""
    rgba = np.zeros((size, size, 4), "uint8")
    rgba[..., 3] = 255
    start = np.random.default_rng(seed).integers(size // 8, size // 2)
    rgba[start:start + size * 3 // 7, start:start + size // 12 + 1, :3] = 255
    buffer = io.BytesIO()
    Image.fromarray(rgba).save(buffer, format="PNG")
    return buffer.getvalue()


def data_url(data, label="image/png"):
    return f"data:{label};base64," + base64.b64encode(data).decode()


def post(client, path, body, **kwargs):
    """POSTs `body` (str or bytes) as application/json, untouched by a JSON encoder."""
    return client.post(path, data=body, content_type="application/json", **kwargs)


def assert_json_error(reply, status, *fragments):
    assert reply.status_code == status, (reply.status_code, reply.get_data(as_text=True)[:300])
    assert reply.mimetype == "application/json", reply.get_data(as_text=True)[:300]
    message = reply.get_json()["error"]
    assert isinstance(message, str)
    for fragment in fragments:
        assert fragment in message, message
    return message


class StandIn:
    """NumPy stand-ins for an export's signatures; `gate` holds classify until set."""

    def __init__(self):
        self.gate = None
        self.entered = threading.Event()
        self.fail = False

    def classify(self, images):
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(30)
        if self.fail:
            raise RuntimeError("the stand-in model failed")
        lengths = np.linspace(0.05, 0.9, 10, dtype="float32")[None]
        return lengths, np.full((1, 10, 16), 0.1, "float32"), images

    def decode(self, capsules, class_ids):
        if self.fail:
            raise RuntimeError("the stand-in model failed")
        return np.full((1, 28, 28, 1), 0.5, "float32")


def stand_in_app(**kwargs):
    functions = StandIn()
    model = ExplorerModel("/home/someone/exports/mnist/3", functions.classify, functions.decode,
                          None, DIGITS, 16, couplings_note="stand-in")
    digits = SampleDigits(images=(np.full((5, 28, 28), 200, "uint8"), np.arange(5)))
    return create_app(model, digits, **kwargs), functions


@pytest.fixture
def client():
    return stand_in_app()[0].test_client()


# --- the cases of issue 43, one test each ------------------------------------------------


def test_json_nested_100000_deep_is_refused_before_parsing(client):
    for path in ("/api/classify", "/api/decode"):
        body = "[" * 100_000 + "]" * 100_000
        assert_json_error(post(client, path, body), 400, "nested 100000 levels deep")
        body = '{"test_index": ' + '{"a": ' * 100_000 + "1" + "}" * 100_001
        assert_json_error(post(client, path, body), 400, "nested")


def test_json_with_too_many_values_is_refused_before_parsing(client):
    body = json.dumps({"pixels": [[0.5] * 28] * 28})  # the largest the page sends
    assert post(client, "/api/classify", body).status_code == 200
    body = "[" + ",".join(["[1]"] * 50_000) + "]"
    assert_json_error(post(client, "/api/classify", body), 400, "at most 1024")


@pytest.mark.parametrize("value", ["Infinity", "-Infinity", "NaN", "1e999", "-1e999"])
@pytest.mark.parametrize("field", ["test_index", "class_id"])
def test_infinite_and_overflowing_integers_are_refused(client, field, value):
    path = "/api/classify" if field == "test_index" else "/api/decode"
    capsule = "" if field == "test_index" else f'"capsule": {json.dumps([0.0] * 16)}, '
    reply = post(client, path, f'{{{capsule}"{field}": {value}}}')
    message = assert_json_error(reply, 400)
    assert ("not a JSON number" in message) or (f"'{field}' must be an integer" in message)


@pytest.mark.parametrize("value", [2.7, 3.0, True, False, "3", None, [3], {"k": 3}])
def test_class_id_must_be_an_integer_not_converted(client, value):
    reply = client.post("/api/decode", json={"capsule": [0.0] * 16, "class_id": value})
    assert_json_error(reply, 400, "'class_id' must be an integer")


@pytest.mark.parametrize("value", [2.0, True, "1", -1, 10**30])
def test_test_index_must_be_an_integer_in_range(client, value):
    reply = client.post("/api/classify", json={"test_index": value})
    assert_json_error(reply, 400)


def test_integers_in_range_still_work(client):
    reply = client.post("/api/decode", json={"capsule": [0.0] * 16, "class_id": 9})
    assert reply.status_code == 200 and np.shape(reply.get_json()["reconstruction"]) == (28, 28)
    assert_json_error(client.post("/api/decode", json={"capsule": [0.0] * 16, "class_id": 10}),
                      400, "[0, 10)")
    reply = client.post("/api/classify", json={"test_index": 4})
    assert reply.status_code == 200 and reply.get_json()["label"] == 4


@pytest.mark.parametrize("value", [3e38, -3e38, 1.2501, -1.26, 10**400])
def test_capsule_values_are_bounded(client, value):
    capsule = [0.0] * 16
    capsule[5] = value
    body = json.dumps({"capsule": capsule, "class_id": 1})
    assert_json_error(post(client, "/api/decode", body), 400, "[-1.25, 1.25]", "capsule[5]")


def test_capsule_values_within_the_sliders_range_are_accepted(client):
    # A capsule value near +-1 moved by a full slider is still accepted.
    capsule = [1.25, -1.25] + [0.999] * 14
    assert client.post("/api/decode", json={"capsule": capsule, "class_id": 3}).status_code == 200
    for bad in ([True] * 16, ["0.1"] * 16, [[0.1]] * 16, [0.0] * 17, 0.5):
        reply = client.post("/api/decode", json={"capsule": bad, "class_id": 3})
        assert_json_error(reply, 400, "'capsule' must be 16 finite numbers")


def test_pixels_are_strictly_typed(client):
    good = [[0.25] * 28 for _ in range(28)]
    assert client.post("/api/classify", json={"pixels": good}).status_code == 200
    for value, where in [(True, "pixels[3][4] is a boolean"), ("1", "pixels[3][4] is a string"),
                         (1.5, "pixels[3][4] is a number (1.5)"), (None, "pixels[3][4] is null")]:
        bad = [row[:] for row in good]
        bad[3][4] = value
        assert_json_error(client.post("/api/classify", json={"pixels": bad}), 400, "28x28", where)


def test_a_png_whose_header_claims_20000x20000_is_refused_before_decoding(client):
    bomb = raw_png(20000, 20000, idat=zlib.compress(b"\0" * 100_000))
    assert len(bomb) < 500
    reply = client.post("/api/classify", json={"drawing": data_url(bomb)})
    assert_json_error(reply, 400, "20000x20000 pixels", "at most 1024 pixels a side")


def chunk_rows(rows, filter_type=0, width=28):
    return zlib.compress(bytes([filter_type]) * ((width + 1) * rows))


@pytest.mark.parametrize("damage", ["garbage stream", "unknown row filter", "no pixel data",
                                    "empty pixel data", "damaged header checksum", "truncated"])
def test_a_png_with_a_good_header_and_broken_pixel_data_is_refused(client, damage):
    good = raw_png(28, 28)
    png = {
        "garbage stream": raw_png(28, 28, idat=b"\x78\x9c" + bytes(range(256)) * 4),
        "unknown row filter": raw_png(28, 28, idat=chunk_rows(28, filter_type=9)),
        "no pixel data": good[:33] + png_chunk(b"IEND", b""),
        "empty pixel data": raw_png(28, 28, idat=b""),
        "damaged header checksum": good[:30] + bytes([good[30] ^ 0xFF]) + good[31:],
        "truncated": good[:-20],
    }[damage]
    reply = client.post("/api/classify", json={"drawing": data_url(png)})
    message = assert_json_error(reply, 400)
    assert ("not a readable PNG" in message) or ("truncated" in message), message
    assert "BytesIO" not in message


def test_an_eps_labelled_as_a_png_never_reaches_a_decoder(client, monkeypatch):
    from PIL import Image as pil

    opened = []
    real_open = pil.open
    monkeypatch.setattr(pil, "open", lambda *args, **kwargs: opened.append(1) or real_open(
        *args, **kwargs))
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 28 28\n0 0 moveto showpage\n"
    for label in ("image/png", "image/x-eps"):
        reply = client.post("/api/classify", json={"drawing": data_url(eps, label)})
        assert_json_error(reply, 400, "not a PNG")
    jpeg = io.BytesIO()
    Image.fromarray(np.zeros((28, 28), "uint8")).save(jpeg, format="JPEG")
    reply = client.post("/api/classify", json={"drawing": data_url(jpeg.getvalue())})
    assert_json_error(reply, 400, "not a PNG")
    assert opened == []


def test_a_large_blank_png_is_refused_from_its_header(client):
    blank = raw_png(2048, 2048)
    assert len(blank) < 30_000
    reply = client.post("/api/classify", json={"drawing": data_url(blank)})
    assert_json_error(reply, 400, "2048x2048")
    # The page's own canvas, and the largest accepted size, are read.
    for png in (canvas_png(), raw_png(1024, 1024)):
        reply = client.post("/api/classify", json={"drawing": data_url(png)})
        assert reply.status_code == 200, reply.get_json()


def test_ancillary_png_chunks_are_not_read(client):
    # A compressed text chunk that inflates to 1 MB: dropped before Pillow sees the file.
    text = png_chunk(b"zTXt", b"Comment\0\0" + zlib.compress(b"x" * 2**20))
    unknown_critical = png_chunk(b"ABCD", b"")
    reply = client.post("/api/classify", json={"drawing": data_url(raw_png(28, 28, extra=[text]))})
    assert reply.status_code == 200 and reply.get_json()["empty"] is True
    reply = client.post("/api/classify",
                        json={"drawing": data_url(raw_png(28, 28, extra=[unknown_critical]))})
    assert_json_error(reply, 400, "unknown critical chunk")


def test_pillows_own_bomb_limit_is_the_explorers(monkeypatch):
    from PIL import Image as pil

    from capsnet_tf.explorer.preprocess import MAX_PIXELS

    monkeypatch.setattr(pil, "MAX_IMAGE_PIXELS", pil.MAX_IMAGE_PIXELS)
    explorer_app.limit_pillow()
    assert pil.MAX_IMAGE_PIXELS == MAX_PIXELS


@pytest.mark.parametrize("method, path, status, fragment", [
    ("get", "/api/nothing", 404, "nothing at /api/nothing"),
    ("get", "/static/../app.py", 404, "nothing at"),
    ("get", "/api/decode", 405, "takes POST"),
    ("put", "/api/classify", 405, "takes POST"),
    ("post", "/api/info", 405, "takes GET"),
])
def test_framework_errors_are_json(client, method, path, status, fragment):
    reply = getattr(client, method)(path)
    assert_json_error(reply, status, fragment)
    if status == 405:
        assert "POST" in reply.headers["Allow"] or "GET" in reply.headers["Allow"]


def test_a_body_over_the_limit_is_a_json_413(client):
    body = b'{"drawing": "' + b"A" * explorer_app.MAX_REQUEST_BYTES + b'"}'
    assert_json_error(post(client, "/api/classify", body), 413, "larger than 1 MiB")


@pytest.mark.parametrize("body, content_type, fragment", [
    (b'{"test_index": 1}', "text/plain", "Content-Type: application/json"),
    (b"\xff\xfe{}", "application/json", "not UTF-8"),
    (b"{'test_index': 1}", "application/json", "not valid JSON"),
    (b"[1, 2]", "application/json", "received a list"),
    (b'{"test_index": 1, "extra": 2}', "application/json", "Unknown field 'extra'"),
    (b'{"test_index": 1, "pixels": []}', "application/json", "exactly one"),
])
def test_malformed_bodies_get_their_reason(client, body, content_type, fragment):
    reply = client.post("/api/classify", data=body, content_type=content_type)
    assert_json_error(reply, 400, fragment)


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "127.0.0.1.nip.io",
                                  "localhost.evil.example", "[::2]:8000", ""])
def test_another_host_is_refused_against_dns_rebinding(client, host):
    for path in ("/api/info", "/", "/static/explorer.js"):
        reply = client.get(path, headers={"Host": host})
        assert_json_error(reply, 400, "does not serve the host")


@pytest.mark.parametrize("host", ["127.0.0.1:8000", "localhost:8000", "LOCALHOST", "[::1]:80",
                                  "localhost."])
def test_the_served_address_is_accepted(client, host):
    assert client.get("/api/info", headers={"Host": host}).status_code == 200


def test_hosts_accepted_for_each_listening_address():
    check = explorer_app.host_checker("192.168.1.5", allowed_hosts=["box.lan"])
    assert check("192.168.1.5:8000") and check("box.lan:8000") and check("localhost")
    assert not check("10.0.0.1:8000") and not check("evil.example")
    everywhere = explorer_app.host_checker("0.0.0.0")
    assert everywhere("10.0.0.7:8000") and everywhere("[fe80::1]:8000")
    assert not everywhere("evil.example:8000")


def test_no_answer_holds_an_absolute_path(client):
    info = client.get("/api/info").get_json()
    assert info["source"] == "mnist/3"
    text = json.dumps(info)
    assert "/home/someone" not in text and "exports" not in text


def test_security_headers_keep_the_page_to_itself(client):
    page = client.get("/")
    assert page.status_code == 200
    policy = page.headers["Content-Security-Policy"]
    assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert page.headers["X-Content-Type-Options"] == "nosniff"
    assert "Access-Control-Allow-Origin" not in client.get("/api/info").headers


def test_a_busy_model_answers_503_with_retry_after():
    app, functions = stand_in_app(max_concurrent=1, busy_wait_s=0.2)
    functions.gate = threading.Event()
    client = app.test_client()
    first = []
    worker = threading.Thread(target=lambda: first.append(
        client.post("/api/classify", json={"test_index": 0})))
    worker.start()
    try:
        assert functions.entered.wait(30), "the first request never reached the model"
        reply = client.post("/api/decode", json={"capsule": [0.0] * 16, "class_id": 1})
        assert_json_error(reply, 503, "busy")
        assert reply.headers["Retry-After"] == "1"
        assert client.get("/api/info").status_code == 200  # no model call: not bounded
    finally:
        functions.gate.set()
        worker.join(30)
    assert first[0].status_code == 200
    reply = client.post("/api/decode", json={"capsule": [0.0] * 16, "class_id": 1})
    assert reply.status_code == 200  # the turn was given back


def test_a_failing_model_answers_503_not_500():
    app, functions = stand_in_app()
    functions.fail = True
    client = app.test_client()
    reply = client.post("/api/decode", json={"capsule": [0.0] * 16, "class_id": 1})
    assert_json_error(reply, 503, "could not answer")
    assert_json_error(client.post("/api/classify", json={"test_index": 1}), 503)


def test_test_digits_that_are_missing_are_a_404_not_a_5xx():
    model = ExplorerModel("m/1", StandIn().classify, StandIn().decode, None, DIGITS, 16)
    client = create_app(model, None).test_client()
    assert_json_error(client.get("/api/test_digit"), 404, "no MNIST test set")
    assert_json_error(client.post("/api/classify", json={"test_index": 0}), 404)


def test_class_names_go_into_the_page_as_text():
    with open(os.path.join(STATIC, "explorer.js")) as file:
        script = file.read()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write"):
        assert sink not in script, f"explorer.js writes markup through {sink}"
    assert "textContent = name" in script and "names[k]" in script


# --- a small export, for the class-name check and the fuzzer --------------------------------


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    import keras

    from capsnet_tf.export import export_saved_model

    keras.utils.set_random_seed(43)
    base = tmp_path_factory.mktemp("bad_input_serving")
    export_saved_model(small_model(image_shape=(28, 28, 1), capsule_dim=16), str(base),
                       version=1, verify=False)
    return base / "1"


@pytest.mark.parametrize("names", [
    [str(digit) for digit in range(11)],
    [str(digit) for digit in range(9)],
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9],
    "0123456789",
])
def test_class_names_must_match_the_capsules_when_the_model_loads(export_dir, tmp_path, names):
    import shutil

    from capsnet_tf.explorer import load_explorer_model

    copy = tmp_path / "1"
    shutil.copytree(export_dir, copy)
    metadata_path = copy / "assets" / "capsnet_metadata.json"
    metadata = json.loads(metadata_path.read_text())
    metadata["class_names"] = names
    metadata["source"] = {"dataset": "mnist"}  # so the names are not checked as digits
    metadata_path.write_text(json.dumps(metadata))
    with pytest.raises(ModelError, match="names .* classes but has 10 class capsules|not a list"):
        load_explorer_model(model_dir=str(copy))


# --- the fuzzer ---------------------------------------------------------------------------

FIELDS = ["drawing", "pixels", "test_index", "capsule", "class_id", "index", "x", ""]
NUMBERS = [0, 1, -1, 9, 10, 16, 2**31, 10**25, 0.5, -0.5, 1.25, 1.2500001, 1e308, -1e-320,
           3e38, 2.7, True, False, None]


def random_json(rng, depth=0):
    """A random JSON value, biased towards the shapes the endpoints read."""
    choice = rng.random()
    if depth > 4 or choice < 0.3:
        return rng.choice(NUMBERS + ["3", "", "data:image/png;base64,AAAA", "\u202e\x00"])
    if choice < 0.45:
        size = rng.choice([0, 1, 15, 16, 17, 27, 28, 29])
        return [rng.choice(NUMBERS[:16]) if rng.random() < 0.9 else random_json(rng, depth + 1)
                for _ in range(size)]
    if choice < 0.55:
        return [[rng.random() * rng.choice([1, 1, 1, 2, -1]) for _ in range(28)]
                for _ in range(rng.choice([27, 28, 28, 28]))]
    if choice < 0.65:
        return data_url(mutated_png(rng), rng.choice(["image/png", "image/png", "text/plain"]))
    return {rng.choice(FIELDS): random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def mutated_png(rng):
    """A valid canvas PNG, damaged one of several ways (or left whole)."""
    data = bytearray(canvas_png(rng.choice([28, 64, 280]), seed=rng.randint(0, 99)))
    kind = rng.randrange(8)
    if kind == 0:  # flipped bytes anywhere
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif kind == 1:  # cut short
        data = data[:rng.randrange(len(data))]
    elif kind == 2:  # another size in the header, CRC made to match
        width, height = rng.choice([0, 1, 1025, 20000, 2**31 - 1]), rng.choice([1, 280, 65536])
        header = struct.pack(">II", width, height) + bytes(data[24:29])
        data[8:33] = png_chunk(b"IHDR", header)
    elif kind == 3:  # another bit depth or colour type, CRC made to match
        header = bytes(data[16:24]) + bytes([rng.choice([1, 2, 7, 16, 32]),
                                             rng.choice([0, 1, 2, 3, 4, 5, 6])]) + b"\0\0\0"
        data[8:33] = png_chunk(b"IHDR", header)
    elif kind == 4:  # random chunks inserted after the header
        data[33:33] = png_chunk(bytes(rng.choice([b"zTXt", b"iCCP", b"acTL", b"QQQQ", b"IDAT"])),
                                bytes(rng.randrange(256) for _ in range(rng.randint(0, 64))))
    elif kind == 5:  # a chunk length that runs past the end
        data[33:37] = struct.pack(">I", rng.choice([2**31, len(data), 0xFFFFFFFF]))
    elif kind == 6:  # random bytes after the signature
        data = data[:8] + bytearray(rng.randrange(256) for _ in range(rng.randint(0, 200)))
    return bytes(data)


def random_request(rng):
    """`(method, path, kwargs)` of one random request to some endpoint."""
    path = rng.choice(["/api/classify", "/api/classify", "/api/decode", "/api/decode",
                       "/api/test_digit", "/api/info", "/", "/static/explorer.js",
                       "/api/" + "x" * rng.randint(0, 5), "/static/%2e%2e/app.py"])
    usual = "post" if path.startswith(("/api/classify", "/api/decode")) else "get"
    method = usual if rng.random() < 0.85 else rng.choice(["post", "get", "put", "delete"])
    kind = rng.random()
    headers = {}
    if rng.random() < 0.05:
        headers["Host"] = rng.choice(["evil.example", "127.0.0.1:1", "[::1]", "a" * 300])
    if kind < 0.6:
        text = json.dumps(random_json(rng))
        if rng.random() < 0.1:  # a bare JSON-ish edit: the text cut or a token spliced in
            cut = rng.randrange(len(text) + 1)
            text = text[:cut] + rng.choice(["", "NaN", "1e999", "[" * 50, "\\", '"']) + text[cut:]
        body = text.encode()
    elif kind < 0.8:
        body = bytes(rng.randrange(256) for _ in range(rng.randint(0, 300)))
    else:
        body = json.dumps({"drawing": data_url(mutated_png(rng))}).encode()
    content_type = rng.choice(["application/json"] * 4 + ["text/plain", "application/x-www-"
                                                           "form-urlencoded", ""])
    query = rng.choice(["", "?index=1", "?index=-1", "?index=1e3", "?index=99999999999",
                        "?index=%00", "?index=" + "9" * 30])
    return method, path + query, dict(data=body, content_type=content_type, headers=headers)


def test_fuzzed_requests_never_get_a_500_and_api_errors_are_json(export_dir):
    from capsnet_tf.explorer import load_explorer_model

    model = load_explorer_model(model_dir=str(export_dir))
    digits = SampleDigits(images=(np.random.default_rng(0).integers(0, 256, (20, 28, 28))
                                .astype("uint8"), np.arange(20) % 10))
    client = create_app(model, digits).test_client()
    rng = random.Random(43)
    seen = {}
    for case in range(800):
        method, path, kwargs = random_request(rng)
        reply = getattr(client, method)(path, **kwargs)
        seen[reply.status_code] = seen.get(reply.status_code, 0) + 1
        described = f"case {case}: {method.upper()} {path} {kwargs['data'][:120]!r}"
        assert reply.status_code < 500, (described, reply.get_data(as_text=True)[:300])
        if path.startswith("/api/") or reply.status_code >= 400:
            assert reply.mimetype == "application/json", described
            body = reply.get_json()
            if reply.status_code >= 400:
                assert isinstance(body["error"], str) and body["error"], described
    print(f"fuzzed answers by status: {dict(sorted(seen.items()))}")
    # The generator reaches the model as well as the refusals.
    assert seen.get(200, 0) >= 40 and seen.get(400, 0) >= 100
