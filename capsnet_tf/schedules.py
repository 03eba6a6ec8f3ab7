"""Learning-rate schedules: the official release's decay, and warm-up + cosine for short runs."""

import keras
from keras import ops

__all__ = ["FlooredExponentialDecay", "make_schedule", "warmup_cosine_decay"]


@keras.saving.register_keras_serializable(package="capsnet_tf")
class FlooredExponentialDecay(keras.optimizers.schedules.LearningRateSchedule):
    """`max(initial * decay_rate ** (step / decay_steps), minimum)`, continuous.

    The official CapsNet release decays Adam's learning rate from 1e-3 by 0.96
    every 2000 steps without a staircase and never lets it fall below 1e-6.

    Args:
        initial_learning_rate: rate at step 0.
        decay_steps: steps over which the rate is multiplied by `decay_rate`.
        decay_rate: multiplicative decay per `decay_steps`.
        minimum_learning_rate: the floor.

    Call arguments:
        step: the optimizer's iteration count (global steps).

    Returns:
        The learning rate, float32 scalar.

    Example:

    >>> schedule = FlooredExponentialDecay(1e-3, 2000, 0.96, 1e-6)
    >>> round(float(schedule(4000)), 10)
    0.0009216

    Reference:
        Sabour et al., 2017, arXiv:1710.09829; official release's
        `tf.train.exponential_decay` + `tf.maximum(lr, 1e-6)`.
    """

    def __init__(
        self,
        initial_learning_rate=1e-3,
        decay_steps=2000,
        decay_rate=0.96,
        minimum_learning_rate=1e-6,
    ):
        if not initial_learning_rate > 0:
            raise ValueError(
                "`initial_learning_rate` must be positive. "
                f"Received: initial_learning_rate={initial_learning_rate}"
            )
        if not decay_steps > 0:
            raise ValueError(f"`decay_steps` must be positive. Received: decay_steps={decay_steps}")
        if not 0 < decay_rate <= 1:
            raise ValueError(f"`decay_rate` must be in (0, 1]. Received: decay_rate={decay_rate}")
        if not 0 <= minimum_learning_rate <= initial_learning_rate:
            raise ValueError(
                "`minimum_learning_rate` must be in [0, initial_learning_rate]. "
                f"Received: minimum_learning_rate={minimum_learning_rate}"
            )
        self.initial_learning_rate = initial_learning_rate
        self.decay_steps = decay_steps
        self.decay_rate = decay_rate
        self.minimum_learning_rate = minimum_learning_rate

    def __call__(self, step):
        step = ops.cast(step, "float32")
        rate = self.initial_learning_rate * ops.power(
            ops.cast(self.decay_rate, "float32"), step / float(self.decay_steps)
        )
        return ops.maximum(rate, self.minimum_learning_rate)

    def get_config(self):
        return {
            "initial_learning_rate": self.initial_learning_rate,
            "decay_steps": self.decay_steps,
            "decay_rate": self.decay_rate,
            "minimum_learning_rate": self.minimum_learning_rate,
        }


def warmup_cosine_decay(learning_rate, total_steps, warmup_steps=0, minimum_learning_rate=0.0):
    """Linear warm-up to `learning_rate`, then cosine decay to the minimum at `total_steps`.

    The warm-up starts from a tenth of `learning_rate`. For runs of a few
    epochs: the official decay (x0.96 every 2000 steps) is built for
    hundreds of epochs and still has most of its rate after ten, so a short
    run ends with the noise of a high rate; this schedule ends annealed.
    Keras's own `CosineDecay` computes it.

    Args:
        learning_rate: the peak rate, reached after the warm-up.
        total_steps: steps of the whole run (warm-up included).
        warmup_steps: steps of linear warm-up (0: none).
        minimum_learning_rate: the rate at `total_steps`.

    Returns:
        A `keras.optimizers.schedules.CosineDecay`.

    Example:

    >>> schedule = warmup_cosine_decay(1e-3, total_steps=1000, warmup_steps=100)
    >>> [round(float(schedule(step)), 6) for step in (0, 100, 550, 1000)]
    [0.0001, 0.001, 0.0005, 0.0]
    """
    if not total_steps > warmup_steps >= 0:
        raise ValueError(
            "`total_steps` must exceed `warmup_steps` >= 0. "
            f"Received: total_steps={total_steps}, warmup_steps={warmup_steps}"
        )
    if not 0 <= minimum_learning_rate <= learning_rate:
        raise ValueError(
            "`minimum_learning_rate` must be in [0, learning_rate]. "
            f"Received: minimum_learning_rate={minimum_learning_rate}"
        )
    warmup = int(warmup_steps) > 0
    return keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=learning_rate / 10 if warmup else learning_rate,
        decay_steps=int(total_steps) - int(warmup_steps),
        alpha=minimum_learning_rate / learning_rate,
        warmup_target=learning_rate if warmup else None,
        warmup_steps=int(warmup_steps),
    )


def make_schedule(config, steps_per_epoch=None):
    """The learning-rate schedule a run's configuration names.

    One place for training (`capsnet_tf.training.compile_model`) and the
    figures (`learning_rates`), so that both read the same rate.

    Args:
        config: an `ExperimentConfig` or the dict of its `config.json`
            (`schedule`, `learning_rate`, `minimum_learning_rate`, and
            `decay_steps`, `decay_rate` or `epochs`, `warmup_epochs`; a
            config saved before `schedule` existed is exponential).
        steps_per_epoch: training steps per epoch; needed by `"cosine"`.

    Returns:
        A `keras.optimizers.schedules.LearningRateSchedule`.
    """
    if not isinstance(config, dict):
        config = vars(config)
    if config.get("schedule", "exponential") == "cosine":
        if not steps_per_epoch:
            raise ValueError("The cosine schedule needs `steps_per_epoch`.")
        return warmup_cosine_decay(
            config["learning_rate"],
            total_steps=config["epochs"] * steps_per_epoch,
            warmup_steps=round(config.get("warmup_epochs", 0.0) * steps_per_epoch),
            minimum_learning_rate=config["minimum_learning_rate"],
        )
    return FlooredExponentialDecay(
        config["learning_rate"],
        config["decay_steps"],
        config["decay_rate"],
        config["minimum_learning_rate"],
    )
