"""Deprecated: moved to :mod:`gradzip.data.batches`.

Kept for compatibility only (old imports keep working, with a ``DeprecationWarning``); it will be
removed. Import from :mod:`gradzip.data.batches` instead.
"""

from __future__ import annotations

import warnings

from gradzip.data.batches import (
    CIFARNET_CROP,
    EpochBatches,
    center_crop,
    random_crop_flip,
)

__all__ = [
    "CIFARNET_CROP",
    "EpochBatches",
    "center_crop",
    "random_crop_flip",
]

warnings.warn(
    "gradzip.experiments.data_batches is deprecated; import from gradzip.data.batches",
    DeprecationWarning,
    stacklevel=2,
)
