"""Deprecated: moved to :mod:`gradzip.algorithms.qesgd.state`.

Kept for compatibility only (old imports keep working, with a ``DeprecationWarning``); it will be
removed. Import from :mod:`gradzip.algorithms.qesgd.state` instead.
"""

from __future__ import annotations

import warnings

from gradzip.algorithms.qesgd.state import (
    OUTPUTS,
    EpochState,
    check_output,
)

__all__ = [
    "OUTPUTS",
    "EpochState",
    "check_output",
]

warnings.warn(
    "gradzip.algorithms.qesgd_state is deprecated; import from gradzip.algorithms.qesgd.state",
    DeprecationWarning,
    stacklevel=2,
)
