"""The running mean of the nested scheme's decoded tensors, updated in one pass.

``mean[i] = mean[i] + (g[i] - mean[i]) / cnt``: three float32 operations per element, each its
own IEEE operation in this order (no fused multiply-add, no reassociation: numba without
``fastmath``), so the bits are those of the torch expression
``mean += (g - mean) / cnt`` that the scheme runs for other dtypes and devices (tested). Why:
the expression's three passes (and their temporaries) read and wrote the tensor six times; the
kernel reads two arrays and writes one. Elements are independent, so splitting them between
threads changes no bit.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

from gradzip.kernels._threads import call_parallel

#: elements per parallel task
_TASK = 1 << 16


@njit(nogil=True, cache=True, parallel=True)
def _update(mean, g, cnt):  # type: ignore[no-untyped-def]
    n = mean.size
    c = np.float32(cnt)
    for t in prange((n + _TASK - 1) // _TASK):
        lo = t * _TASK
        m = mean[lo : min(n, lo + _TASK)]
        x = g[lo : min(n, lo + _TASK)]
        for r in range(m.size):
            d = x[r] - m[r]
            d = d / c
            m[r] = m[r] + d


def update_running_mean_(mean: torch.Tensor, g: torch.Tensor, cnt: int) -> torch.Tensor:
    """``mean += (g - mean) / cnt`` in place, bitwise; one pass for contiguous float32 CPU
    tensors of the same shape, the torch expression otherwise. Returns ``mean``."""
    if (
        mean.dtype == g.dtype == torch.float32
        and mean.device.type == g.device.type == "cpu"
        and mean.is_contiguous()
        and g.is_contiguous()
        and mean.shape == g.shape
    ):
        call_parallel(_update, mean.view(-1).numpy(), g.view(-1).numpy(), cnt)
        return mean
    return mean.add_((g.to(mean.dtype) - mean) / cnt)
