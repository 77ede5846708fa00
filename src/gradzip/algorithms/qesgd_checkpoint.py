"""Deprecated: moved to :mod:`gradzip.algorithms.qesgd.checkpoint`.

Kept for compatibility only (old imports keep working, with a ``DeprecationWarning``); it will be
removed. Import from :mod:`gradzip.algorithms.qesgd.checkpoint` instead.
"""

from __future__ import annotations

import warnings

from gradzip.algorithms.qesgd.checkpoint import (
    restore,
    save,
)

__all__ = [
    "restore",
    "save",
]

warnings.warn(
    "gradzip.algorithms.qesgd_checkpoint is deprecated; import from gradzip.algorithms.qesgd.checkpoint",
    DeprecationWarning,
    stacklevel=2,
)
