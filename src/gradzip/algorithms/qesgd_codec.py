"""Deprecated: moved to :mod:`gradzip.algorithms.qesgd.codec`.

Kept for compatibility only (old imports keep working, with a ``DeprecationWarning``); it will be
removed. Import from :mod:`gradzip.algorithms.qesgd.codec` instead.
"""

from __future__ import annotations

import warnings

from gradzip.algorithms.qesgd.codec import (
    OffsetCodec,
    deltas_digest,
)

__all__ = [
    "OffsetCodec",
    "deltas_digest",
]

warnings.warn(
    "gradzip.algorithms.qesgd_codec is deprecated; import from gradzip.algorithms.qesgd.codec",
    DeprecationWarning,
    stacklevel=2,
)
