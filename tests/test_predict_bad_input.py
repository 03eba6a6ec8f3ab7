"""experiments/predict.py on bad files and bad models: one line naming both, exit status 1.

Each case is a subprocess of its own. With an export that records its input
shape (every capsnet_tf export does), the files are checked before
TensorFlow is imported, so a bad file's stderr is exactly one line; a bad
model's error is the last line, after TensorFlow's start-up lines. A file
that is too large is refused from its header: the tests give files whose
data would fail to decode (or whose `.npy` data is absent), so reading the
data first would give another message or a traceback.

The file cases stop before TensorFlow is imported (a fraction of a second
each) and stay in the default tier with one bad-model case (the damaged
SavedModel); the other bad-model cases load TensorFlow in their subprocess
(about 7 s each) and are marked large.
"""

import io
import os
import re
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest
from PIL import Image

from tests.conftest import REPO_ROOT
from tests.test_model import small_model

PREDICT = os.path.join(REPO_ROOT, "experiments", "predict.py")


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    """A tiny untrained 28x28 CapsNet export, as tests/test_predict.py makes one."""
    import keras

    from capsnet_tf.export import export_saved_model

    keras.utils.set_random_seed(7)
    base = tmp_path_factory.mktemp("serving")
    return export_saved_model(small_model(image_shape=(28, 28, 1)), str(base), version=1,
                              verify=False)


def predict(model, *files, cwd):
    return subprocess.run([sys.executable, PREDICT, f"--model={model}", *files], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def assert_one_line(result, pattern):
    """Exit status 1, stderr exactly one line matching `pattern`, nothing classified."""
    assert result.returncode == 1, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-3000:]
    assert re.fullmatch(pattern, lines[0]), lines[0]
    assert ": class " not in result.stdout


def assert_last_line(result, pattern):
    """Exit status 1, the last line of stderr matching `pattern`, no traceback."""
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and re.fullmatch(pattern, errors[0]), result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == errors[0]


def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def raw_png(width, height, idat):
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", header) + png_chunk(b"IDAT", idat)
            + png_chunk(b"IEND", b""))


def test_a_decompression_bomb_png_is_one_line(export_dir, tmp_path):
    # 400 bytes whose header claims 20000x20000 pixels (400 million: 1.6 GB as RGBA).
    (tmp_path / "bomb.png").write_bytes(raw_png(20000, 20000, zlib.compress(b"\0" * 10**5)))
    result = predict(export_dir, "bomb.png", cwd=tmp_path)
    assert_one_line(result, r"error: bomb\.png: more than 50,000,000 pixels, too large to read "
                            r"\(Pillow: Image size \(400000000 pixels\) exceeds limit .*")


def test_a_png_with_broken_pixel_data_is_one_line(export_dir, tmp_path):
    (tmp_path / "broken.png").write_bytes(raw_png(28, 28, b"\x78\x9c" + bytes(range(256))))
    result = predict(export_dir, "broken.png", cwd=tmp_path)
    assert_one_line(result, r"error: broken\.png: not a readable image \(OSError: .*\)")


def test_a_large_image_is_refused_from_its_header_without_decoding(export_dir, tmp_path):
    # 5000x5000 is under the bomb limit; its pixel data is garbage, so only a
    # check made before decoding gives the size message.
    (tmp_path / "big.png").write_bytes(raw_png(5000, 5000, b"garbage"))
    result = predict(export_dir, "big.png", cwd=tmp_path)
    assert_one_line(result, r"error: big\.png: image is 5000x5000 \(L\); expected a 28x28 "
                            r"grayscale image.*\(or pass --resize\)")


def test_an_eps_named_png_never_reaches_ghostscript(export_dir, tmp_path):
    (tmp_path / "digit.png").write_bytes(
        b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 28 28\n0 0 moveto showpage\n")
    result = predict(export_dir, "digit.png", cwd=tmp_path)
    assert_one_line(result, r"error: digit\.png: not an image in a format predict\.py reads "
                            r"\(PNG, JPEG, .*\) nor a \.npy array")


def test_a_npy_of_the_wrong_shape_is_refused_from_its_header(export_dir, tmp_path):
    # The header promises 10^9 images of 32x32 and the file holds none of them.
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "|u1", "fortran_order": False, "shape": (10**9, 32, 32)})
    (tmp_path / "wrong.npy").write_bytes(header.getvalue())
    result = predict(export_dir, "wrong.npy", cwd=tmp_path)
    assert_one_line(result, r"error: wrong\.npy: array of shape \[1000000000, 32, 32\]; "
                            r"expected a 28x28 grayscale image.*")


def test_a_npy_whose_data_is_missing_is_refused_before_loading(export_dir, tmp_path):
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "|u1", "fortran_order": False, "shape": (10**9, 28, 28)})
    (tmp_path / "cut.npy").write_bytes(header.getvalue() + b"\0" * 100)
    result = predict(export_dir, "cut.npy", cwd=tmp_path)
    assert_one_line(result, r"error: cut\.npy: its header describes 784,000,000,000 bytes of "
                            r"uint8 \[1000000000, 28, 28\], but the file holds 100: .*")


def test_a_pickled_npy_is_refused(export_dir, tmp_path):
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}] * 28 * 28).reshape(28, 28),
            allow_pickle=True)
    result = predict(export_dir, "objects.npy", cwd=tmp_path)
    assert_one_line(result, r"error: objects\.npy: unsupported dtype object; use uint8 or float")


def test_a_file_that_is_not_a_npy_is_refused(export_dir, tmp_path):
    (tmp_path / "text.npy").write_text("28, 28\n")
    result = predict(export_dir, "text.npy", cwd=tmp_path)
    assert_one_line(result, r"error: text\.npy: not a readable \.npy array \(ValueError: .*\)")


@pytest.mark.large  # loads TensorFlow and a model in a subprocess (~7 s)
def test_a_savedmodel_without_serving_float_is_one_line(tmp_path):
    import tensorflow as tf

    module = tf.Module()
    module.scale = tf.Variable(2.0)
    module.run = tf.function(lambda x: {"y": x * module.scale},
                             input_signature=[tf.TensorSpec([None], tf.float32)])
    tf.saved_model.save(module, str(tmp_path / "other"), signatures={"serving_default": module.run})
    Image.fromarray(np.zeros((28, 28), np.uint8)).save(tmp_path / "good.png")
    result = predict(tmp_path / "other", "good.png", cwd=tmp_path)
    assert_last_line(result, r"error: --model=.*other has no 'serving_float' signature \(it has "
                             r"\['serving_default'\]\): not a capsnet_tf export; .*")


def test_a_damaged_savedmodel_is_one_line(tmp_path):
    (tmp_path / "damaged").mkdir()
    (tmp_path / "damaged" / "saved_model.pb").write_bytes(b"\x08\x01garbage" * 10)
    Image.fromarray(np.zeros((28, 28), np.uint8)).save(tmp_path / "good.png")
    result = predict(tmp_path / "damaged", "good.png", cwd=tmp_path)
    assert_last_line(result, r"error: --model=.*damaged: cannot load the SavedModel \(.*\)")


@pytest.mark.large  # loads TensorFlow and a model in a subprocess (~7 s)
def test_labels_that_do_not_match_the_model_are_one_line(export_dir, tmp_path):
    import shutil

    copy = tmp_path / "1"
    shutil.copytree(export_dir, copy)
    (copy / "assets" / "labels.txt").write_text("cat\ndog\n")
    Image.fromarray(np.zeros((28, 28), np.uint8)).save(tmp_path / "good.png")
    result = predict(copy, "good.png", cwd=tmp_path)
    assert_last_line(result, r"error: .*labels\.txt names 2 classes, but the model has 10: .*")
