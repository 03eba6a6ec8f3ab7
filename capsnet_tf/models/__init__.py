"""CapsNet models."""

from capsnet_tf.models.baseline import BaselineCNN
from capsnet_tf.models.capsnet import PRESETS, CapsNet

__all__ = ["BaselineCNN", "CapsNet", "PRESETS"]
