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

import numpy as np

__all__ = ["DrawingError", "image_from_data_url", "prepare_digit"]

# MNIST's geometry: the digit's longer side is scaled to BOX pixels inside a
# SIZE x SIZE field.
SIZE = 28
BOX = 20


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


def image_from_data_url(data_url, max_side=2048):
    """The grayscale pixels of a PNG `data:` URL (what `canvas.toDataURL()` gives).

    Transparent pixels count as black, so a canvas whose background was never
    painted reads as a white-on-black drawing.

    Args:
        data_url: `"data:image/png;base64,..."` (any image type PIL reads).
        max_side: larger images are refused (a browser canvas is a few
            hundred pixels).

    Returns:
        float32 `[H, W]` in [0, 1].

    Raises:
        DrawingError: not a base64 `data:` URL, not an image, or too large.
    """
    from PIL import Image, UnidentifiedImageError

    if not isinstance(data_url, str) or not data_url.startswith("data:image/"):
        raise DrawingError("Expected a data:image/...;base64 URL of the drawing.")
    header, _, payload = data_url.partition(",")
    if not header.endswith(";base64"):
        raise DrawingError("Expected a base64 data URL (data:image/png;base64,...).")
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise DrawingError("The drawing's data URL is not valid base64.")
    try:
        with Image.open(io.BytesIO(raw)) as picture:
            if max(picture.size) > max_side:
                raise DrawingError(
                    f"The drawing is {picture.size[0]}x{picture.size[1]} pixels; at most "
                    f"{max_side} pixels a side are accepted."
                )
            picture = picture.convert("RGBA")
            rgba = np.asarray(picture, "float32") / 255.0
    except (UnidentifiedImageError, OSError) as error:
        raise DrawingError(f"The drawing is not a readable image ({error}).")
    # ITU-R 601-2 luma, as PIL's "L" conversion, over a black background.
    luma = rgba[..., 0] * 0.299 + rgba[..., 1] * 0.587 + rgba[..., 2] * 0.114
    return (luma * rgba[..., 3]).astype("float32")
