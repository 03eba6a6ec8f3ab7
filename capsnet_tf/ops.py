"""Capsule nonlinearities shared by the layers: `squash` and `safe_norm`.

Reference:
    Sabour, Frosst & Hinton, "Dynamic Routing Between Capsules", NIPS 2017,
    arXiv:1710.09829, equation (1).
"""

import keras
from keras import ops

__all__ = ["safe_norm", "squash"]

_FLOAT32_ONLY = ("float16", "bfloat16")


def _to_float32_if_low_precision(tensor):
    """Returns `(tensor_in_float32_or_wider, original_dtype)`.

    Half-precision squash loses the `|s|^2 / (1 + |s|^2)` ratio for short
    vectors, so under mixed precision the nonlinearities compute in float32 and
    hand back the caller's dtype.
    """
    dtype = keras.backend.standardize_dtype(tensor.dtype)
    if dtype in _FLOAT32_ONLY:
        return ops.cast(tensor, "float32"), dtype
    return tensor, dtype


def safe_norm(vectors, axis=-1, keepdims=False, epsilon=None):
    """Euclidean norm with a finite gradient at the zero vector.

    Computes `sqrt(sum(vectors**2) + epsilon)`. The plain norm has an infinite
    derivative at zero; the epsilon keeps it finite while changing the norm of
    a unit vector by less than `epsilon / 2`.

    Args:
        vectors: float tensor.
        axis: axis along which the norm is taken.
        keepdims: keep the reduced axis with size 1.
        epsilon: added under the square root; defaults to
            `keras.config.epsilon()` (1e-7).

    Returns:
        The norms, in the dtype of `vectors`.
    """
    if epsilon is None:
        epsilon = keras.config.epsilon()
    vectors, dtype = _to_float32_if_low_precision(vectors)
    squared = ops.sum(ops.square(vectors), axis=axis, keepdims=keepdims)
    return ops.cast(ops.sqrt(squared + epsilon), dtype)


def squash(vectors, axis=-1, epsilon=None):
    """The capsule nonlinearity of Sabour et al. (2017), equation (1).

    `squash(s) = |s|^2 / (1 + |s|^2) * s / |s|`, written as
    `s * |s| / (1 + |s|^2)` with `|s| = sqrt(sum(s**2) + epsilon)` so that the
    value and the gradient are finite at `s = 0` (the official release divides
    by `|s|` and returns NaN there). Short vectors shrink to almost zero, long
    ones to just under unit length; the direction is kept.

    Args:
        vectors: float tensor of capsule vectors.
        axis: the capsule dimension (default: last).
        epsilon: see `safe_norm`.

    Returns:
        Tensor of the same shape and dtype as `vectors`. float16 and bfloat16
        inputs are squashed in float32 and cast back.

    Example:

    >>> import numpy as np
    >>> out = squash(np.ones((1, 4), "float32"))
    >>> np.asarray(out).astype(float).round(4).tolist()  # 1/2 * 4/5 each
    [[0.4, 0.4, 0.4, 0.4]]

    Reference:
        Sabour et al., 2017, arXiv:1710.09829, equation (1).
    """
    vectors = ops.convert_to_tensor(vectors)
    wide, dtype = _to_float32_if_low_precision(vectors)
    norm = safe_norm(wide, axis=axis, keepdims=True, epsilon=epsilon)
    scale = norm / (1.0 + ops.square(norm))
    return ops.cast(wide * scale, dtype)
