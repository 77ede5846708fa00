"""Deprecated: moved to :mod:`gradzip.models.charlstm`.

Kept for compatibility only (old imports keep working, with a ``DeprecationWarning``); it will be
removed. Import from :mod:`gradzip.models.charlstm` instead.
"""

from __future__ import annotations

import warnings

from gradzip.models.charlstm import (
    CharLSTM,
    State,
    char_lstm,
)

__all__ = [
    "CharLSTM",
    "State",
    "char_lstm",
]

warnings.warn(
    "gradzip.experiments.charlstm is deprecated; import from gradzip.models.charlstm",
    DeprecationWarning,
    stacklevel=2,
)
