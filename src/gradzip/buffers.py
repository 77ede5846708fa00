"""Large output arrays recycled between steps instead of allocated afresh.

Why [CHOICE]: a training step produces the same large temporaries every time (decoded tensors,
error-feedback sums ``g + e`` and reconstructions, packed symbols). A fresh array of tens of MB
is mapped anew by the C allocator, and its first touch costs page faults: on the development
machine a fresh 64 MB float32 output took 7-10 ms to fault in with one thread and up to 75 ms
when two threads wrote it first (the kernel zeroes the huge pages NumPy asks for), against
3 ms to write an array already mapped; an error-feedback round trip of one-bit quantization
on 2^24 values went from 33 ms (one thread) to 100 ms (two) for that reason alone.

So :func:`fresh_array` hands out arrays of at least :data:`MIN_POOLED_BYTES` from a pool keyed
by length and dtype. An array is free again once nothing but the pool refers to it: every
tensor made from it with ``torch.from_numpy`` (and every view of those) holds a reference to it
until its storage is released, so the reference count says exactly when the memory is no
longer in use, and a recycled array is never visible to anyone else. Idle arrays beyond
:data:`MAX_IDLE_BYTES` are released when a new one is allocated. Thread-safe. The contents of
a recycled array are arbitrary, as ``np.empty``'s are.
"""

from __future__ import annotations

import sys
import threading

import numpy as np
import numpy.typing as npt

#: smaller arrays come from ``np.empty`` (the allocator's free lists serve them well)
MIN_POOLED_BYTES = 1 << 20
#: the most bytes of idle pooled arrays kept; more are released
MAX_IDLE_BYTES = 1 << 30
#: references to an idle array while it is examined: the pool's list, the loop variable and
#: ``sys.getrefcount``'s own argument
_IDLE_REFS = 3

_lock = threading.Lock()
_pool: dict[tuple[int, str], list[npt.NDArray[np.generic]]] = {}


def fresh_array(n: int, dtype: npt.DTypeLike) -> npt.NDArray[np.generic]:
    """An uninitialised 1-D array of ``n`` elements of ``dtype``: a recycled idle one of that
    length and dtype where there is one, else a new one (kept for reuse when large)."""
    kind = np.dtype(dtype)
    if n * kind.itemsize < MIN_POOLED_BYTES:
        return np.empty(n, dtype=kind)
    key = (n, kind.str)
    with _lock:
        for arr in _pool.get(key, ()):
            if sys.getrefcount(arr) == _IDLE_REFS:
                return arr
        _release_idle(MAX_IDLE_BYTES)
        arr = np.empty(n, dtype=kind)
        _pool.setdefault(key, []).append(arr)
        return arr


def idle_bytes() -> int:
    """Bytes held by idle pooled arrays."""
    with _lock:
        return sum(a.nbytes for _, a in _idle())


def release_idle(keep: int = 0) -> None:
    """Release idle pooled arrays until at most ``keep`` bytes of them remain."""
    with _lock:
        _release_idle(keep)


def _idle() -> list[tuple[tuple[int, str], npt.NDArray[np.generic]]]:
    return [
        (key, arr)
        for key, arrays in _pool.items()
        for arr in arrays
        if sys.getrefcount(arr) == _IDLE_REFS
    ]


def _release_idle(keep: int) -> None:
    idle = sorted(_idle(), key=lambda item: -item[1].nbytes)
    total = sum(arr.nbytes for _, arr in idle)
    for key, arr in idle:
        if total <= keep:
            break
        _pool[key] = [a for a in _pool[key] if a is not arr]
        total -= arr.nbytes
    for key in [k for k, arrays in _pool.items() if not arrays]:
        del _pool[key]
