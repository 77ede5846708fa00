"""Running numba's parallel kernels without disturbing torch's thread count, and at the
thread count of the thread they work for."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numba
import torch


def kernel_thread_count() -> int:
    """The threads gradzip's parallel kernels take when they work for the calling thread: its
    torch intra-op count, at most numba's count for it (each at least 1).

    [CHOICE] numba's count is per thread and starts at its pool's size, every core by default,
    whatever torch was told: ``torchrun`` with several ranks a machine sets one torch thread a
    rank (``OMP_NUM_THREADS=1``), and each rank's kernels would still run on every core. With
    four ranks on two cores that oversubscription made a ResNet-20 step with the integer
    all-reduce 1.37x slower, with gradzip's PowerSGD 3.1x (docs/performance.md). Taking torch's count follows what the user
    (or the launcher) chose for the rank; taking the minimum keeps a lower numba count the user
    set.

    Asking numba starts its threading layer, whose OpenMP form sets this thread's OpenMP count,
    which torch reads as its own: torch's count is put back (see :func:`call_parallel`)."""
    before = torch.get_num_threads()
    try:
        return max(1, min(before, numba.get_num_threads()))
    finally:
        _restore_torch_threads(before)


def use_kernel_threads(count: int) -> None:
    """Set the calling thread's numba thread count (numba keeps one per thread) to ``count``,
    capped at numba's pool size: for gradzip's own worker threads, which no user code runs on.
    The kernels' results do not depend on it (each is thread-count independent)."""
    before = torch.get_num_threads()
    try:
        pool = int(numba.config.NUMBA_NUM_THREADS)  # type: ignore[attr-defined]
        count = max(1, min(count, pool))
        if numba.get_num_threads() != count:
            numba.set_num_threads(count)
    finally:
        _restore_torch_threads(before)


def _restore_torch_threads(count: int) -> None:
    if torch.get_num_threads() != count:
        torch.set_num_threads(count)


def call_parallel(kernel: Callable[..., Any], *args: Any) -> Any:
    """``kernel(*args)`` for a ``parallel=True`` numba kernel, then torch's thread count as it
    was before.

    numba's OpenMP threading layer sets the OpenMP thread count of the calling thread to its own
    (``numba.get_num_threads()``) when it starts a parallel region, and torch reads that same
    setting: without the restore, a process pinned to one torch thread would silently run
    torch on every core afterwards (and change float reductions whose order depends on it).
    """
    before = torch.get_num_threads()
    try:
        return kernel(*args)
    finally:
        _restore_torch_threads(before)
