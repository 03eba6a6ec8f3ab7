"""Capsule lengths: the probability that each capsule's entity is present."""

import keras

from capsnet_tf.ops import safe_norm

__all__ = ["Length"]


@keras.saving.register_keras_serializable(package="capsnet_tf")
class Length(keras.layers.Layer):
    """Euclidean length of every capsule vector.

    After the squash a capsule's length lies in `[0, 1)` and is read as the
    probability that the entity it represents is present; CapsNet's class
    scores are the lengths of the digit capsules. The norm is
    `sqrt(sum(v**2) + epsilon)` so its gradient stays finite at the zero
    vector (see `capsnet_tf.ops.safe_norm`).

    Args:
        epsilon: added under the square root; default `keras.config.epsilon()`.
        **kwargs: base `keras.layers.Layer` arguments. Pass `dtype="float32"`
            to keep lengths in float32 under a mixed-precision policy.

    Call arguments:
        inputs: capsules `[..., num_capsules, capsule_dim]`.

    Returns:
        Lengths `[..., num_capsules]`.

    Example:

    >>> import numpy as np
    >>> lengths = Length()(np.array([[[3.0, 4.0], [0.0, 0.0]]], "float32"))
    >>> np.asarray(lengths).astype(float).round(3).tolist()
    [[5.0, 0.0]]

    Reference:
        Sabour et al., 2017, arXiv:1710.09829, section 2.
    """

    def __init__(self, epsilon=None, **kwargs):
        super().__init__(**kwargs)
        if epsilon is not None and not epsilon > 0:
            raise ValueError(f"`epsilon` must be positive. Received: epsilon={epsilon}")
        self.epsilon = epsilon

    def call(self, inputs):
        return safe_norm(inputs, axis=-1, epsilon=self.epsilon)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1])

    def get_config(self):
        return {**super().get_config(), "epsilon": self.epsilon}
