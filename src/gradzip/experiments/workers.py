"""Deprecated: moved to :mod:`gradzip.simulation.workers`.

Kept for compatibility only (old imports keep working, with a ``DeprecationWarning``); it will be
removed. Import from :mod:`gradzip.simulation.workers` instead.
"""

from __future__ import annotations

import warnings

from gradzip.simulation.workers import (
    PerWorkerGradients,
    Randomness,
    WorkerGradients,
    WorkerStep,
    one_intra_op_thread,
    per_worker_gradients,
    worker_gradient,
)

__all__ = [
    "PerWorkerGradients",
    "Randomness",
    "WorkerGradients",
    "WorkerStep",
    "one_intra_op_thread",
    "per_worker_gradients",
    "worker_gradient",
]

warnings.warn(
    "gradzip.experiments.workers is deprecated; import from gradzip.simulation.workers",
    DeprecationWarning,
    stacklevel=2,
)
