"""Running numba's parallel kernels without disturbing torch's thread count."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


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
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
