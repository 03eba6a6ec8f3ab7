"""`AveragedWeights`: evaluate and save the moving average of the weights, train the weights.

With `keras.optimizers.Adam(use_ema=True, ema_momentum=m)` the optimizer
keeps, inside each training step, an exponential moving average of every
trainable variable (`average = m * average + (1 - m) * weight`, the first
step copying the weight). The averaged weights usually generalize a little
better than the last ones, because they smooth the noise of the last few
hundred small-batch steps. Keras puts them in the model only when `fit`
ends (`finalize_variable_values`); `AveragedWeights` also puts them there
for the validation inside `fit` and for the callbacks between it and its
`restore` callback at each epoch end (the test-set evaluation, the
checkpoints, the reconstruction images), and puts the trained weights back
before the training-state backup, which must hold them (the averages are
optimizer variables, backed up with the optimizer) to resume exactly.

Unlike `keras.callbacks.SwapEMAWeights(swap_on_epoch=True)`, which keeps the
averages in the model until the next epoch begins, the trained weights are
back in the model before anything that backs up the training state.
"""

import keras

__all__ = ["AveragedWeights", "uses_weight_averaging"]


def uses_weight_averaging(optimizer):
    """Whether `optimizer` keeps a moving average of the weights (`use_ema=True`)."""
    return bool(getattr(optimizer, "use_ema", False))


class AveragedWeights(keras.callbacks.Callback):
    """Puts the optimizer's moving averages in the model to evaluate and save them.

    Place this callback before the epoch-end callbacks that should see the
    averaged weights and its `restore` callback after them, before the
    backup of the training state. Without weight averaging in the optimizer
    both do nothing.

    Example:

    ```python
    averaged = AveragedWeights()
    callbacks = [averaged, TestSetEvaluation(test_data), WeightsCheckpoint(path),
                 averaged.restore, TrainingStateBackup(backup_dir)]
    ```
    """

    def __init__(self):
        super().__init__()
        self._trained = None  # the trained weights while the averages are in the model
        self.restore = _RestoreTrainedWeights(self)

    @property
    def holds_averages(self):
        """Whether the model holds the averaged weights now."""
        return self._trained is not None

    def swap_in(self):
        """Puts the averages in the model, keeping the trained weights aside."""
        optimizer = getattr(self.model, "optimizer", None)
        if self._trained is not None or not uses_weight_averaging(optimizer):
            return
        variables = self.model.trainable_variables
        averages = optimizer._model_variables_moving_average  # as SwapEMAWeights reads them
        if len(averages) != len(variables):
            raise ValueError(
                "The optimizer's moving averages do not match the model's trainable "
                f"variables. Received: {len(averages)} averages for {len(variables)} variables"
            )
        self._trained = [keras.ops.convert_to_numpy(variable) for variable in variables]
        for variable, average in zip(variables, averages):
            variable.assign(average)

    def swap_out(self):
        """Puts the trained weights back in the model."""
        if self._trained is None:
            return
        for variable, value in zip(self.model.trainable_variables, self._trained):
            variable.assign(value)
        self._trained = None

    def on_test_begin(self, logs=None):  # the validation inside `fit`
        self.swap_in()

    def on_test_end(self, logs=None):
        self.swap_out()

    def on_epoch_end(self, epoch, logs=None):
        self.swap_in()

    def on_train_end(self, logs=None):  # in a callback list without `restore`
        self.swap_out()


class _RestoreTrainedWeights(keras.callbacks.Callback):
    """`AveragedWeights.restore`: the trained weights back in the model at epoch ends."""

    def __init__(self, averaged):
        super().__init__()
        self._averaged = averaged

    def on_epoch_end(self, epoch, logs=None):
        self._averaged.swap_out()
