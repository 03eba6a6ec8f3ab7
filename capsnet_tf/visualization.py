"""The figures under their earlier name: `capsnet_tf.figures` plus `ReconstructionImages`.

Kept so that notebooks and scripts written against `capsnet_tf.visualization`
keep working; new code imports `capsnet_tf.figures` (and the callback from
`capsnet_tf.callbacks`).
"""

from capsnet_tf.callbacks.images import ReconstructionImages
from capsnet_tf.figures import *  # noqa: F403
from capsnet_tf.figures import __all__ as _figures_all

__all__ = [*_figures_all, "ReconstructionImages"]
