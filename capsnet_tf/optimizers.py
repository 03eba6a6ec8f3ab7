"""Adam with TensorFlow's fused update kernel (`ResourceApplyAdam`)."""

import keras
import tensorflow as tf

__all__ = ["FusedAdam"]


def _handle(variable):
    """The resource handle of a Keras or TensorFlow variable."""
    if isinstance(variable, keras.Variable):
        variable = variable.value
    return variable.handle


@keras.saving.register_keras_serializable(package="capsnet_tf")
class FusedAdam(keras.optimizers.Adam):
    """`keras.optimizers.Adam` whose dense update is one fused kernel per variable.

    Keras's Adam writes the update as about ten element-wise TensorFlow ops
    per variable (moments, bias correction, division), each a pass over the
    variable's memory; on a CPU those passes share the cores with the
    backward pass. TensorFlow's `ResourceApplyAdam` computes the same update
    in place, in one kernel:

        m <- m + (1 - beta_1) (g - m)
        v <- v + (1 - beta_2) (g^2 - v)
        var <- var - lr sqrt(1 - beta_2^t) / (1 - beta_1^t) * m / (sqrt(v) + epsilon)

    which is Keras's formula term for term (same `epsilon` placement, `t`
    the 1-based step), so the two agree to float32 rounding
    (`tests/test_optimizers.py` checks both against a float64 NumPy Adam).
    AMSGrad and sparse (`IndexedSlices`) gradients keep Keras's update.
    Everything else (learning-rate schedules, EMA, gradient clipping, loss
    scaling, `tf.distribute`, saving) is the base class's.

    Takes `keras.optimizers.Adam`'s arguments.
    """

    def update_step(self, gradient, variable, learning_rate):
        if self.amsgrad or isinstance(gradient, tf.IndexedSlices):
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        step = tf.cast(self.iterations + 1, dtype)
        beta_1 = tf.cast(self.beta_1, dtype)
        beta_2 = tf.cast(self.beta_2, dtype)
        index = self._get_variable_index(variable)
        tf.raw_ops.ResourceApplyAdam(
            var=_handle(variable),
            m=_handle(self._momentums[index]),
            v=_handle(self._velocities[index]),
            beta1_power=tf.pow(beta_1, step),
            beta2_power=tf.pow(beta_2, step),
            lr=tf.cast(learning_rate, dtype),
            beta1=beta_1,
            beta2=beta_2,
            epsilon=tf.cast(self.epsilon, dtype),
            grad=tf.cast(gradient, dtype),
        )
