"""`--ema_momentum`: the weights' moving average is evaluated and saved, the weights trained."""

import os

import keras
import numpy as np
import pytest

from capsnet_tf.callbacks import AveragedWeights, TrainingStateBackup, load_weights
from capsnet_tf.config import ExperimentConfig


class Probe(keras.callbacks.Callback):
    """Records the single weight of the model at each epoch end."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def on_epoch_end(self, epoch, logs=None):
        self.seen.append(float(np.asarray(self.model.trainable_variables[0]).item()))


def one_weight_model(momentum):
    """`y = w * x` with w = 1, trained by SGD(0.1) on mse: each step multiplies w by 0.8."""
    model = keras.Sequential(
        [keras.Input((1,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")]
    )
    optimizer = keras.optimizers.SGD(0.1, use_ema=momentum > 0, ema_momentum=momentum or 0.99)
    model.compile(optimizer=optimizer, loss="mse")
    return model


def test_validation_and_epoch_end_callbacks_see_the_averages_the_backup_the_trained_weights():
    x, y = np.ones((3, 1), np.float32), np.zeros((3, 1), np.float32)
    model = one_weight_model(0.5)
    averaged, inside, after = AveragedWeights(), Probe(), Probe()
    history = model.fit(
        x, y, batch_size=1, epochs=1, shuffle=False, validation_data=(x, y), verbose=0,
        callbacks=[averaged, inside, averaged.restore, after],
    )
    # By hand: w_t = 0.8 ** t; a_1 = w_1, a_t = 0.5 * a_(t-1) + 0.5 * w_t.
    trained = [0.8, 0.64, 0.512]
    average = trained[0]
    for weight in trained[1:]:
        average = 0.5 * average + 0.5 * weight  # 0.72, then 0.616
    assert average == pytest.approx(0.616)
    # The validation loss (mse of w * 1 against 0) is that of the average.
    assert history.history["val_loss"][0] == pytest.approx(average**2, rel=1e-5)
    assert inside.seen == [pytest.approx(average, rel=1e-6)]
    assert after.seen == [pytest.approx(trained[-1], rel=1e-6)]
    # fit's end puts the averages in the model, as Keras does without the callback.
    assert float(np.asarray(model.trainable_variables[0]).item()) == pytest.approx(average)


def test_without_averaging_the_callbacks_change_nothing():
    x, y = np.ones((3, 1), np.float32), np.zeros((3, 1), np.float32)
    model = one_weight_model(0.0)
    averaged, inside = AveragedWeights(), Probe()
    history = model.fit(
        x, y, batch_size=1, epochs=1, shuffle=False, validation_data=(x, y), verbose=0,
        callbacks=[averaged, inside, averaged.restore],
    )
    assert inside.seen == [pytest.approx(0.512, rel=1e-6)]
    assert history.history["val_loss"][0] == pytest.approx(0.512**2, rel=1e-5)
    assert not averaged.holds_averages


@pytest.mark.large
def test_a_run_checkpoints_the_averages_and_backs_up_the_trained_weights(tfds_data_dir, tmp_path):
    from capsnet_tf.training import build_model, compile_model, train_and_evaluate

    workdir = str(tmp_path / "run")
    config = ExperimentConfig(
        epochs=2, steps_per_epoch=3, batch_size=8, train_examples=64, eval_examples=16,
        validation_examples=16, primary_capsule_types=2, ema_momentum=0.5, verbose=0,
    )
    train_and_evaluate(config, workdir)
    with open(os.path.join(workdir, "training_log.csv")) as file:
        header = file.readline().strip().split(",")
    # Validation with the averages (choosing checkpoints) and with the trained weights.
    assert {"val_length_accuracy", "val_trained_length_accuracy", "test_length_accuracy"} <= set(
        header
    )

    def fresh():
        model = build_model(config, (28, 28, 1), 10)
        compile_model(model, config, steps_per_epoch=3)
        model.optimizer.build(model.trainable_variables)
        return model

    state = fresh()
    load_weights(state, os.path.join(workdir, "backup", TrainingStateBackup.STATE_FILE),
                 include_optimizer=True)
    checkpoint = fresh()
    load_weights(checkpoint, os.path.join(workdir, "checkpoints", "latest.weights.h5"))
    averages = state.optimizer._model_variables_moving_average
    assert len(averages) == len(checkpoint.trainable_variables) > 0
    moved = 0
    for trained, average, saved in zip(state.trainable_variables, averages,
                                       checkpoint.trainable_variables):
        np.testing.assert_array_equal(np.asarray(saved), np.asarray(average))
        moved += not np.array_equal(np.asarray(trained), np.asarray(average))
    # With momentum 0.5 over 6 steps the average differs from the trained weights.
    assert moved > 0
