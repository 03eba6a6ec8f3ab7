"""capsnet_tf: Capsule Networks (Sabour, Frosst & Hinton, 2017) in TensorFlow 2 / Keras 3.

Reference:
    Sabour, Frosst & Hinton, "Dynamic Routing Between Capsules", NIPS 2017,
    arXiv:1710.09829.

Importing the package changes no environment variable. On CPUs without
AVX-512 VNNI, AVX-512 BF16 or AMX (AVX2-only AMD EPYCs, most laptops)
TensorFlow leaves its oneDNN kernels off unless `TF_ENABLE_ONEDNN_OPTS=1` is
set before TensorFlow is first imported; the experiment scripts set it, and
docs/layers.md shows a notebook how (docs/performance.md has the speed-up).
"""

from capsnet_tf.ensemble import ensemble_scores, evaluate_ensemble
from capsnet_tf.layers import CapsuleLayer, Length, Mask, PrimaryCapsule, dynamic_routing
from capsnet_tf.losses import (
    RECONSTRUCTION_WEIGHT,
    MarginLoss,
    ReconstructionLoss,
    margin_loss,
    reconstruction_loss,
)
from capsnet_tf.metrics import MultiLabelAccuracy
from capsnet_tf.models import PRESETS, BaselineCNN, CapsNet
from capsnet_tf.ops import safe_norm, squash
from capsnet_tf.optimizers import FusedAdam
from capsnet_tf.schedules import FlooredExponentialDecay

__version__ = "0.1.0"

__all__ = [
    "BaselineCNN",
    "CapsNet",
    "CapsuleLayer",
    "FlooredExponentialDecay",
    "FusedAdam",
    "Length",
    "MarginLoss",
    "Mask",
    "MultiLabelAccuracy",
    "PRESETS",
    "PrimaryCapsule",
    "RECONSTRUCTION_WEIGHT",
    "ReconstructionLoss",
    "dynamic_routing",
    "ensemble_scores",
    "evaluate_ensemble",
    "margin_loss",
    "reconstruction_loss",
    "safe_norm",
    "squash",
]
