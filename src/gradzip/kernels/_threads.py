"""Running numba's parallel kernels without disturbing torch's thread count."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numba
import torch


def call_parallel(kernel: Callable[..., Any], *args: Any) -> Any:
    """``kernel(*args)`` for a ``parallel=True`` numba kernel on as many threads as torch's
    intra-op count (at most numba's pool), then torch's thread count as it was before.

    [CHOICE] numba's pool is sized at import from every core, and its count is per calling
    thread: left alone, a process that pins torch to ``cores / P`` threads (several ranks on one
    host; torchrun sets one thread a rank) still ran every kernel on every core, oversubscribing
    the machine (a PowerSGD step in the DDP hook took 90-330 ms against 7-24 ms at P = 2 on two
    cores). Following torch's count in the calling thread (the DDP hook's stages match the main
    thread's) keeps both libraries within one budget. The kernels' results do not depend on
    the thread count.

    numba's OpenMP threading layer sets the OpenMP thread count of the calling thread to its own
    (``numba.get_num_threads()``) when it starts a parallel region, and torch reads that same
    setting: without the restore, a process pinned to one torch thread would silently run
    torch on every core afterwards (and change float reductions whose order depends on it).
    """
    before = torch.get_num_threads()
    wanted = max(1, min(before, numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]
    if numba.get_num_threads() != wanted:
        numba.set_num_threads(wanted)
    try:
        return kernel(*args)
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
