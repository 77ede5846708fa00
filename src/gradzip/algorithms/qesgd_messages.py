"""Deprecated: moved to :mod:`gradzip.algorithms.qesgd.messages`.

Kept for compatibility only (old imports keep working, with a ``DeprecationWarning``); it will be
removed. Import from :mod:`gradzip.algorithms.qesgd.messages` instead.
"""

from __future__ import annotations

import warnings

from gradzip.algorithms.qesgd.messages import (
    ANCHOR,
    CALIBRATE,
    CODES,
    GRAD,
    ServerLink,
)

__all__ = [
    "ANCHOR",
    "CALIBRATE",
    "CODES",
    "GRAD",
    "ServerLink",
]

warnings.warn(
    "gradzip.algorithms.qesgd_messages is deprecated; import from gradzip.algorithms.qesgd.messages",
    DeprecationWarning,
    stacklevel=2,
)
