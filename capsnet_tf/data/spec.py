"""What a training pipeline delivers, independent of where the data come from."""

import dataclasses

__all__ = ["DatasetSpec"]


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """Shape and size of the examples of one split of a pipeline.

    Every pipeline of `capsnet_tf.data` returns `(dataset, spec)`: the model is
    built from `image_shape`, `num_classes` and `num_targets`, the training
    loop counts images with `num_examples`.

    Attributes:
        name: data set name, e.g. `"mnist"`, `"multi_mnist"`.
        image_shape: `(height, width, channels)` of the model's input.
        num_classes: number of classes (= class capsules).
        num_examples: examples in one pass over the split (before `take`).
        num_targets: labels per example: 1, or 2 for MultiMNIST (labels then
            have shape `[2]` and reconstruction targets `[2, H, W, C]`).
        class_names: optional names of the classes, in label order.
    """

    name: str
    image_shape: tuple
    num_classes: int
    num_examples: int
    num_targets: int = 1
    class_names: tuple | None = None
