"""capsnet_tf: Capsule Networks (Sabour, Frosst & Hinton, 2017) in TensorFlow 2 / Keras 3.

Reference:
    Sabour, Frosst & Hinton, "Dynamic Routing Between Capsules", NIPS 2017,
    arXiv:1710.09829.
"""

import os

# TensorFlow turns oneDNN's CPU kernels on by itself only on CPUs with
# AVX512_VNNI, AVX512_BF16 or AMX. On AVX2-only CPUs (AMD EPYC Zen 1-3, most
# laptops) its default Eigen kernels run CapsNet's float32 training step about
# 1.4x slower (docs/performance.md). This takes effect only where capsnet_tf is
# imported before TensorFlow; TF_ENABLE_ONEDNN_OPTS=0 still turns them off.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

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
