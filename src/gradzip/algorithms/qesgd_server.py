"""Deprecated: moved to :mod:`gradzip.algorithms.qesgd.server`.

Kept for compatibility only (old imports keep working, with a ``DeprecationWarning``); it will be
removed. Import from :mod:`gradzip.algorithms.qesgd.server` instead.
"""

from __future__ import annotations

import warnings

from gradzip.algorithms.qesgd.server import (
    DistributedQESGD,
)

__all__ = [
    "DistributedQESGD",
]

warnings.warn(
    "gradzip.algorithms.qesgd_server is deprecated; import from gradzip.algorithms.qesgd.server",
    DeprecationWarning,
    stacklevel=2,
)
