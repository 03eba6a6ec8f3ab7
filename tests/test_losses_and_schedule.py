"""Margin and reconstruction losses against a worked table; the learning-rate schedule."""

import keras
import numpy as np
import pytest

from capsnet_tf import (
    FlooredExponentialDecay,
    MarginLoss,
    ReconstructionLoss,
    margin_loss,
    reconstruction_loss,
)

LENGTHS = np.array([[0.95, 0.5, 0.05], [0.95, 0.5, 0.05], [0.2, 0.9, 0.3]], "float32")
# Worked by hand, m+ = 0.9, m- = 0.1, lambda = 0.5:
# row 0, label 0: present (0.9-0.95)+ = 0; absent 0.5*(0.5-0.1)^2 = 0.08; 0 -> 0.08
# row 1, label 1: present (0.9-0.5)^2 = 0.16; absent 0.5*(0.85)^2 = 0.36125 -> 0.52125
# row 2, label 2: present (0.9-0.3)^2 = 0.36; absent 0.5*(0.1^2 + 0.8^2) = 0.325 -> 0.685
LABELS = np.array([0, 1, 2])
EXPECTED = np.array([0.08, 0.52125, 0.685])


def test_margin_loss_matches_worked_table():
    np.testing.assert_allclose(margin_loss(LABELS, LENGTHS).numpy(), EXPECTED, rtol=1e-5)


def test_official_normalisation_is_half_the_class_mean():
    official = margin_loss(LABELS, LENGTHS, class_reduction="official").numpy()
    np.testing.assert_allclose(official, 0.5 * EXPECTED / 3, rtol=1e-5)


def test_margin_loss_with_two_labels_counts_both_present():
    # row 1 with labels {0, 1}: class 0 present, 0; class 1 present, 0.16; class 2: 0.
    loss = margin_loss(np.array([[0, 1]]), LENGTHS[1:2]).numpy()
    np.testing.assert_allclose(loss, [0.16], rtol=1e-5)


def test_margin_loss_class_and_config():
    loss = MarginLoss()
    np.testing.assert_allclose(float(loss(LABELS, LENGTHS)), EXPECTED.mean(), rtol=1e-5)
    loss = MarginLoss(class_reduction="official")
    restored = keras.losses.deserialize(keras.losses.serialize(loss))
    assert isinstance(restored, MarginLoss) and restored.class_reduction == "official"
    with pytest.raises(ValueError, match="class_reduction"):
        MarginLoss(class_reduction="mean")
    with pytest.raises(ValueError, match="Margins"):
        MarginLoss(positive_margin=0.1, negative_margin=0.9)


def test_reconstruction_loss_is_per_example_sum_of_squares():
    images = np.zeros((2, 28, 28, 1), "float32")
    recon = np.zeros_like(images)
    recon[0, :2, :2] = 0.5  # 4 pixels * 0.25 = 1.0
    recon[1] = 0.1  # 784 * 0.01 = 7.84
    np.testing.assert_allclose(reconstruction_loss(images, recon).numpy(), [1.0, 7.84], rtol=1e-5)
    np.testing.assert_allclose(float(ReconstructionLoss()(images, recon)), 4.42, rtol=1e-5)
    restored = keras.losses.deserialize(keras.losses.serialize(ReconstructionLoss()))
    assert isinstance(restored, ReconstructionLoss)


def test_schedule_matches_official_formula_and_floor():
    schedule = FlooredExponentialDecay(1e-3, 2000, 0.96, 1e-6)
    for step in (0, 1, 1000, 2000, 4000, 12345):
        np.testing.assert_allclose(float(schedule(step)), 1e-3 * 0.96 ** (step / 2000), rtol=1e-5)
    # 0.96^(s/2000) < 1e-3 after about 338,000 steps: the floor holds.
    assert float(schedule(400_000)) == pytest.approx(1e-6)
    restored = keras.optimizers.schedules.deserialize(
        keras.optimizers.schedules.serialize(schedule)
    )
    assert isinstance(restored, FlooredExponentialDecay)
    assert restored.get_config() == schedule.get_config()
    with pytest.raises(ValueError, match="decay_rate"):
        FlooredExponentialDecay(decay_rate=1.5)
