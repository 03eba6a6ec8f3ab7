"""Helpers shared by the data pipeline tests."""

import numpy as np


def collect(dataset):
    """All batches of a pipeline, concatenated per key, as NumPy."""
    inputs, targets = {}, {}
    for x, y in dataset:
        for store, part in ((inputs, x), (targets, y)):
            for key, value in part.items():
                store.setdefault(key, []).append(value.numpy())
    return (
        {k: np.concatenate(v) for k, v in inputs.items()},
        {k: np.concatenate(v) for k, v in targets.items()},
    )
