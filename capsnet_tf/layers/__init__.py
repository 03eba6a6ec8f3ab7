"""Keras layers of capsule networks."""

from capsnet_tf.layers.capsule_layer import CapsuleLayer, dynamic_routing
from capsnet_tf.layers.length import Length
from capsnet_tf.layers.mask import Mask
from capsnet_tf.layers.primary_capsule import PrimaryCapsule

__all__ = ["CapsuleLayer", "Length", "Mask", "PrimaryCapsule", "dynamic_routing"]
