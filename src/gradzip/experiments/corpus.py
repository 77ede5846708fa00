"""Deprecated: moved to :mod:`gradzip.data.corpus`.

Kept for compatibility only (old imports keep working, with a ``DeprecationWarning``); it will be
removed. Import from :mod:`gradzip.data.corpus` instead.
"""

from __future__ import annotations

import warnings

from gradzip.data.corpus import (
    CharBatches,
    Corpus,
    encode_text,
    pydoc_corpus,
)

__all__ = [
    "CharBatches",
    "Corpus",
    "encode_text",
    "pydoc_corpus",
]

warnings.warn(
    "gradzip.experiments.corpus is deprecated; import from gradzip.data.corpus",
    DeprecationWarning,
    stacklevel=2,
)
