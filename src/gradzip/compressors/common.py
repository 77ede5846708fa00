"""Deprecated: moved to :mod:`gradzip.compressors.buckets`.

Kept for compatibility only (old imports keep working, with a ``DeprecationWarning``); it will be
removed. Import from :mod:`gradzip.compressors.buckets` instead.
"""

from __future__ import annotations

import warnings

from gradzip.compressors.buckets import (
    BUCKETED_BY_DEFAULT,
    DEFAULT_BUCKET_SIZE,
    bucket_absmax,
    check_bucket_size,
    clip_to_std,
    num_buckets,
    papers_scales,
    per_element,
)

__all__ = [
    "BUCKETED_BY_DEFAULT",
    "DEFAULT_BUCKET_SIZE",
    "bucket_absmax",
    "check_bucket_size",
    "clip_to_std",
    "num_buckets",
    "papers_scales",
    "per_element",
]

warnings.warn(
    "gradzip.compressors.common is deprecated; import from gradzip.compressors.buckets",
    DeprecationWarning,
    stacklevel=2,
)
