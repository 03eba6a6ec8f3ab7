"""Turns a drawing into the 28x28 input an MNIST model expects, as MNIST was made.

MNIST's digits (LeCun et al., "Gradient-based learning applied to document
recognition", 1998, and the MNIST page) were made from NIST's binary scans by
scaling each digit, aspect ratio kept, to fit a 20x20 box (anti-aliasing gives
the grey levels) and then placing that box in a 28x28 field so that the
digit's centre of mass lies at the field's centre. A digit drawn anywhere on a
canvas, at any size, has to go through the same steps: a model trained on
MNIST has never seen a digit that fills the frame or sits in a corner.
"""

import base64
import binascii
import io
import struct

import numpy as np

__all__ = ["DrawingError", "MAX_PIXELS", "MAX_SIDE", "image_from_data_url", "png_size",
           "prepare_digit"]

# MNIST's geometry: the digit's longer side is scaled to BOX pixels inside a
# SIZE x SIZE field.
SIZE = 28
BOX = 20
# The largest drawing read: the page's canvas is 280x280; a script may send a
# larger one, up to 1024 pixels a side and a million pixels.
MAX_SIDE = 1024
MAX_PIXELS = 1024 * 1024
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# The chunks that make a PNG's pixels; a canvas's PNG holds no others.
_IMAGE_CHUNKS = (b"IHDR", b"PLTE", b"tRNS", b"IDAT", b"IEND")
# A browser writes a few IDAT chunks; a 1 MiB body of empty chunks would be 87,000.
MAX_PNG_CHUNKS = 4096


class DrawingError(ValueError):
    """A drawing that cannot be read; the message says what was wrong."""


def prepare_digit(image, size=SIZE, box=BOX, threshold=0.0):
    """A white-on-black drawing of any size, as an MNIST-style `[size, size]` image.

    The pixels brighter than `threshold` define the digit's bounding box; the
    box is cropped, scaled (bilinear, anti-aliased when shrinking) so that its
    longer side is `box` pixels, and pasted into a black `size` x `size` field
    shifted by whole pixels so that its centre of mass (intensity-weighted) is
    at pixel index `size / 2` (14) in both directions, rounded to the nearest
    pixel: where MNIST's own digits have it (within half a pixel, every one),
    so an MNIST digit comes back unchanged. A digit whose centre of mass is
    far off its box's centre may lose a few pixels over the border, as in
    MNIST.

    Args:
        image: 2-D array (or `[H, W, 1]`), white digit on black; uint8 in
            [0, 255] or float in [0, 1].
        size: side of the output field (28).
        box: side of the box the digit is scaled into (20).
        threshold: pixels above this (in [0, 1]) count as ink for the
            bounding box (0: any ink, as MNIST; raise it to ignore faint
            specks); fainter ones are cut off with the border.

    Returns:
        float32 `[size, size]` in [0, 1]; all zeros when nothing is drawn.

    Example:

    >>> canvas = np.zeros((100, 100), "uint8")
    >>> canvas[10:90, 60:80] = 255          # a bar 80 tall and 20 wide
    >>> digit = prepare_digit(canvas)
    >>> rows, cols = np.nonzero(digit)
    >>> int(rows.min()), int(rows.max()), int(cols.min()), int(cols.max())
    (4, 23, 12, 16)
    """
    from PIL import Image

    array = np.asarray(image)
    if array.ndim == 3 and array.shape[-1] == 1:
        array = array[..., 0]
    if array.ndim != 2:
        raise DrawingError(f"Expected a 2-D grayscale image. Received shape {array.shape}.")
    if array.dtype.kind in "biu":
        array = array.astype("float32") / 255.0
    array = np.clip(np.nan_to_num(array.astype("float32")), 0.0, 1.0)
    output = np.zeros((size, size), "float32")
    rows = np.flatnonzero((array > threshold).any(axis=1))
    cols = np.flatnonzero((array > threshold).any(axis=0))
    if not len(rows):
        return output
    crop = array[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1]
    height, width = crop.shape
    scale = box / max(height, width)
    new_width = max(1, round(width * scale))
    new_height = max(1, round(height * scale))
    scaled = Image.fromarray(crop).resize(
        (new_width, new_height), Image.Resampling.BILINEAR
    )
    digit = np.clip(np.asarray(scaled, "float32"), 0.0, 1.0)
    total = digit.sum()
    if total <= 0:
        return output
    centre_y = (digit.sum(axis=1) * np.arange(new_height)).sum() / total
    centre_x = (digit.sum(axis=0) * np.arange(new_width)).sum() / total
    top = int(np.rint(size / 2 - centre_y))
    left = int(np.rint(size / 2 - centre_x))
    # Paste with clipping at the field's border.
    y0, x0 = max(top, 0), max(left, 0)
    y1, x1 = min(top + new_height, size), min(left + new_width, size)
    if y1 > y0 and x1 > x0:
        output[y0:y1, x0:x1] = digit[y0 - top:y1 - top, x0 - left:x1 - left]
    return output


def png_size(data):
    """`(width, height)` from a PNG's header, before anything is decoded.

    Raises:
        DrawingError: `data` does not start with the PNG signature and an
            IHDR chunk (whatever its label said, it is not a PNG).
    """
    if not data.startswith(PNG_SIGNATURE):
        raise DrawingError("The drawing is not a PNG (its first bytes are not PNG's signature).")
    if len(data) < 33 or data[12:16] != b"IHDR" or data[8:12] != b"\x00\x00\x00\x0d":
        raise DrawingError("The drawing's PNG header (IHDR) is missing or damaged.")
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def _essential_png(data, max_chunks=MAX_PNG_CHUNKS):
    """The PNG `data` rebuilt from its image chunks only (IHDR, PLTE, tRNS, IDAT, IEND).

    A canvas's PNG holds nothing else. Text, colour profiles and animation
    chunks are dropped unread: compressed text and profiles are further
    inflation work that no pixel needs. The chunks kept are copied as they
    are, checksums included.

    Raises:
        DrawingError: a chunk runs past the end of the data, there are more
            than `max_chunks`, there is no IEND, or a critical chunk (upper
            case first letter) is not one of PNG's own.
    """
    kept, position = [PNG_SIGNATURE], len(PNG_SIGNATURE)
    for _ in range(max_chunks):
        if position + 12 > len(data):
            raise DrawingError("The drawing's PNG is truncated (it ends inside a chunk header).")
        (length,) = struct.unpack(">I", data[position:position + 4])
        kind = data[position + 4:position + 8]
        end = position + 12 + length
        if end > len(data):
            raise DrawingError(f"The drawing's PNG is truncated (its {_name(kind)} chunk is cut "
                               "off).")
        if kind in _IMAGE_CHUNKS:
            kept.append(data[position:end])
        elif not kind[:1].islower():  # critical: a decoder must understand it
            raise DrawingError(f"The drawing's PNG has an unknown critical chunk {_name(kind)}.")
        position = end
        if kind == b"IEND":
            return b"".join(kept)
    raise DrawingError(f"The drawing's PNG has more than {max_chunks} chunks.")


def _name(kind):
    """A chunk type for a message: `'IDAT'`, not `b'IDAT'`."""
    return repr(kind.decode("latin-1"))


def image_from_data_url(data_url, max_side=MAX_SIDE, max_pixels=MAX_PIXELS):
    """The grayscale pixels of a PNG `data:` URL (what `canvas.toDataURL()` gives).

    Only a PNG is read, recognised by its signature (not by the URL's
    label), so no other Pillow decoder (Ghostscript for EPS, ...) ever sees
    a request. Its size is read from the header and checked before any pixel
    is decoded; only the image chunks reach the decoder (`_essential_png`),
    and Pillow's own decompression-bomb limit applies on top. Transparent
    pixels count as black, so a canvas whose background was never painted
    reads as a white-on-black drawing. The pixels are decoded once and kept
    as bytes (RGBA, then Pillow's ITU-R 601-2 luma times alpha) until the
    float32 result: a 1024x1024 drawing takes about 14 MiB at its peak.

    Args:
        data_url: `"data:image/png;base64,..."`.
        max_side: larger images are refused (a browser canvas is a few
            hundred pixels; the page's is 280).
        max_pixels: so are images with more pixels than this.

    Returns:
        float32 `[H, W]` in [0, 1].

    Raises:
        DrawingError: not a base64 `data:` URL, not a PNG, too large, or a
            PNG that does not decode; the message says which.
    """
    from PIL import Image, ImageChops, UnidentifiedImageError

    if not isinstance(data_url, str) or not data_url.startswith("data:image/"):
        raise DrawingError("Expected a data:image/png;base64 URL of the drawing.")
    header, _, payload = data_url.partition(",")
    if not header.endswith(";base64"):
        raise DrawingError("Expected a base64 data URL (data:image/png;base64,...).")
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise DrawingError("The drawing's data URL is not valid base64.")
    width, height = png_size(raw)
    if not width * height:
        raise DrawingError(f"The drawing is {width}x{height} pixels: an empty image.")
    if max(width, height) > max_side or width * height > max_pixels:
        raise DrawingError(
            f"The drawing is {width}x{height} pixels; at most {max_side} pixels a side and "
            f"{max_pixels:,} pixels in all are accepted."
        )
    try:
        with Image.open(io.BytesIO(_essential_png(raw)), formats=["PNG"]) as picture:
            picture.load()
            luma, alpha = picture.convert("RGBA").convert("LA").split()
    except DrawingError:  # from _essential_png
        raise
    except UnidentifiedImageError:  # its message names a BytesIO object, not the problem
        raise DrawingError("The drawing is not a readable PNG (a damaged or unsupported header).")
    except Exception as error:  # any failure to decode is the file's
        # Pillow reports broken files as OSError, SyntaxError, ValueError,
        # EOFError, zlib.error or DecompressionBombError, depending on where
        # the damage is; each is a file that cannot be drawn.
        raise DrawingError(
            f"The drawing is not a readable PNG ({type(error).__name__}: {error})."
        )
    # Over a black background: luma * alpha / 255, rounded, as one byte a pixel.
    ink = ImageChops.multiply(luma, alpha)
    return np.asarray(ink, "float32") / np.float32(255.0)
