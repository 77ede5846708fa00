"""Deprecated: moved to :mod:`gradzip.algorithms.qesgd.schedule`.

Kept for compatibility only (old imports keep working, with a ``DeprecationWarning``); it will be
removed. Import from :mod:`gradzip.algorithms.qesgd.schedule` instead.
"""

from __future__ import annotations

import warnings

from gradzip.algorithms.qesgd.schedule import (
    MAX_BITS,
    Batch,
    DeltaSchedule,
    EpochParameters,
    bucket_count,
    bucket_norms,
    check_bits,
    contraction_factor,
    corollary4,
    flatten,
    full_gradient,
    theory_delta,
    unflatten,
    write_flat,
)

__all__ = [
    "MAX_BITS",
    "Batch",
    "DeltaSchedule",
    "EpochParameters",
    "bucket_count",
    "bucket_norms",
    "check_bits",
    "contraction_factor",
    "corollary4",
    "flatten",
    "full_gradient",
    "theory_delta",
    "unflatten",
    "write_flat",
]

warnings.warn(
    "gradzip.algorithms.qesgd_schedule is deprecated; import from gradzip.algorithms.qesgd.schedule",
    DeprecationWarning,
    stacklevel=2,
)
