"""Deprecated: moved to :mod:`gradzip.models.layers`.

Kept for compatibility only (old imports keep working, with a ``DeprecationWarning``); it will be
removed. Import from :mod:`gradzip.models.layers` instead.
"""

from __future__ import annotations

import warnings

from gradzip.models.layers import (
    TRUNCATED_STD_FACTOR,
    TRUNCATION,
    ConvSame,
    Dense,
    lrn,
    max_pool_same,
    truncated_normal_,
)

__all__ = [
    "TRUNCATED_STD_FACTOR",
    "TRUNCATION",
    "ConvSame",
    "Dense",
    "lrn",
    "max_pool_same",
    "truncated_normal_",
]

warnings.warn(
    "gradzip.experiments.layers is deprecated; import from gradzip.models.layers",
    DeprecationWarning,
    stacklevel=2,
)
