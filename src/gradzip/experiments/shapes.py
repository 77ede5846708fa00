"""Deprecated: moved to :mod:`gradzip.models.shapes`.

Kept for compatibility only (old imports keep working, with a ``DeprecationWarning``); it will be
removed. Import from :mod:`gradzip.models.shapes` instead.
"""

from __future__ import annotations

import warnings

from gradzip.models.shapes import (
    CIFARNET,
    FC_300_100,
    LENET,
    MODEL_SHAPES,
    Shape,
    parameter_count,
)

__all__ = [
    "CIFARNET",
    "FC_300_100",
    "LENET",
    "MODEL_SHAPES",
    "Shape",
    "parameter_count",
]

warnings.warn(
    "gradzip.experiments.shapes is deprecated; import from gradzip.models.shapes",
    DeprecationWarning,
    stacklevel=2,
)
