"""Argument checks the models share, Keras-style: each names the argument and the value received."""

__all__ = ["check_image_shape", "check_integer"]


def check_integer(name, value, minimum=1):
    """Returns `value` if it is an `int` (not a `bool`) of at least `minimum`.

    Raises:
        ValueError: naming `name` and the value received.
    """
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(
            f"`{name}` must be an integer >= {minimum}. Received: {name}={value!r}"
        )
    return value


def check_image_shape(image_shape):
    """Returns `image_shape` as a tuple of ints: (height, width, channels), each >= 1.

    Raises:
        ValueError: not three positive sizes.
    """
    image_shape = tuple(int(size) for size in image_shape)
    if len(image_shape) != 3 or min(image_shape) < 1:
        raise ValueError(
            "`image_shape` must be (height, width, channels) of positive "
            f"sizes. Received: image_shape={image_shape}"
        )
    return image_shape
