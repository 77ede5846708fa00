"""Which implementation a compressor runs: numba kernels on the CPU, torch operations elsewhere.

Both give the same bytes and values (see :mod:`gradzip.kernels.dithered_device`), so the choice is
about speed only: CPU tensors go through the fused numba kernels, tensors on other devices
(CUDA) are compressed where they live with torch operations. :func:`forced_torch_ops` runs the
torch operations on CPU tensors too, which is how the tests compare the two.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

#: how many :func:`forced_torch_ops` blocks are open, in any thread (a count: blocks of several
#: threads may close in any order)
_force_torch_ops = 0
_lock = threading.Lock()


def use_torch_ops(t: torch.Tensor | None = None) -> bool:
    """True when ``t`` is not on the CPU, or inside :func:`forced_torch_ops`."""
    return _force_torch_ops > 0 or (t is not None and t.device.type != "cpu")


@contextmanager
def forced_torch_ops() -> Iterator[None]:
    """Run the torch-operations path even for CPU tensors (tests, comparisons)."""
    global _force_torch_ops
    with _lock:
        _force_torch_ops += 1
    try:
        yield
    finally:
        with _lock:
            _force_torch_ops -= 1
