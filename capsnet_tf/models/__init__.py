"""CapsNet models."""

from capsnet_tf.models.capsnet import PRESETS, CapsNet

__all__ = ["CapsNet", "PRESETS"]
