"""The dithered quantizers' encode and decode as torch operations, on any device: the one torch
implementation behind the device payloads and the torch-ops path of CPU and GPU tensors.

Bit-identical to the numba kernels of :mod:`gradzip.kernels.dithered` (same formulas, same
order of IEEE operations, one torch operation per product or sum, never ``addcmul``/``alpha=``,
which may fuse into an FMA; see that module's docstring for which buckets need float64).
Written for the rules of :mod:`gradzip.device`: no Python indexing or slicing of a tensor
(``index_select``, ``select``, ``narrow``, ``pad``), no value read back to the host, and every
division by a constant a division by a device tensor (:mod:`gradzip.kernels.device_division`).
Where a bucket may need either the float32 or the float64 arithmetic, both are computed and
selected per element with ``torch.where`` [CHOICE]: a second pass over the tensor on the device
instead of a stall for one flag (``bool(fast.any())``) on every call. The fixed-width packing
is :mod:`gradzip.kernels.bitpack_device`'s.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn.functional import pad

from gradzip.kernels.device_buckets import bucket_of_elements
from gradzip.kernels.device_division import device_scalar, divided
from gradzip.kernels.philox_torch import one_plus_uniform_device

_F32_MAX = float(np.finfo(np.float32).max)


def bucket_factors(numer: float, scales: torch.Tensor) -> torch.Tensor:
    """``numer / sigma`` per bucket in float64, 0 for a zero bucket."""
    s = scales.to(torch.float64)
    # a true division of two tensors: ``number / tensor`` is torch's ``reciprocal() * number``
    # (two roundings), and CUDA divides by a host scalar through its reciprocal too
    top = device_scalar(numer, s)
    return torch.where(s > 0, top / torch.where(s > 0, s, 1.0), 0.0)


# -- the dithered quantizers -----------------------------------------------------------------
def encode_symbols_device(
    x: torch.Tensor,
    scales: torch.Tensor,
    bucket_size: int,
    numer: float,
    seed: int,
    stream: int,
    nsum: int,
    c: float,
    top: int,
    modk: int,
    fast_ok: bool,
) -> torch.Tensor:
    """The symbols of :func:`gradzip.kernels.dithered.encode_tiles` (same arguments; uint8 for
    ``top <= 255``, else int32): both arithmetics where ``fast_ok``, selected per element."""
    n, dev = x.numel(), x.device
    scales = scales.to(dev)
    idx = bucket_of_elements(n, bucket_size, dev)
    fac = bucket_factors(numer, scales).index_select(0, idx)
    ones = one_plus_uniform_device(seed, stream, max(nsum, 1) * n, dev).view(-1, n)
    if nsum == 0:
        w = ones.select(0, 0).to(torch.float64)
    else:
        w = torch.zeros(n, dtype=torch.float64, device=dev)
        for j in range(nsum):
            w = w + (ones.select(0, j) - 1.0).to(torch.float64)
    w = w + c
    w = w + x.to(torch.float64) * fac
    q = w.floor().clamp(0, top).to(torch.int64)
    if fast_ok:
        fast = fac <= _F32_MAX
        if nsum == 0:
            base = ones.select(0, 0)
        else:
            base = ones.select(0, 0) - 1.0
            for j in range(1, nsum):
                base = base + (ones.select(0, j) - 1.0)
        f32 = torch.where(fast, fac, 0.0).to(torch.float32)
        v = base + x * f32
        v = v + torch.tensor(c, dtype=torch.float32, device=dev)
        q = torch.where(fast, v.to(torch.int64).clamp(max=top), q)
    if modk > 0:
        q = q.remainder(modk)
    return q.to(torch.uint8 if top <= 255 else torch.int32)


def decode_affine_device(
    symbols: torch.Tensor,
    scales: torch.Tensor,
    bucket_size: int,
    divisor: float,
    c: float,
    dithered: bool,
    seed: int,
    stream: int,
    wide: bool,
) -> torch.Tensor:
    """:func:`gradzip.kernels.dithered.decode_affine_tiles` as torch operations (the step
    ``f64(sigma) / divisor`` divides by a device scalar)."""
    n, dev = symbols.numel(), symbols.device
    scales = scales.to(dev)
    idx = bucket_of_elements(n, bucket_size, dev)
    dtype = torch.float64 if wide else torch.float32
    step = divided(scales.to(torch.float64), divisor).to(dtype).index_select(0, idx)
    v = symbols.to(dtype)
    if dithered:
        v = v - one_plus_uniform_device(seed, stream, n, dev).to(dtype)
    v = v + torch.tensor(c, dtype=dtype, device=dev)
    v = (v * step).to(torch.float32)
    return torch.where(scales.index_select(0, idx) == 0, 0.0, v)


def decode_nested_device(
    symbols: torch.Tensor,
    scales: torch.Tensor,
    bucket_size: int,
    numer: float,
    step_factor: float,
    k: int,
    K0: float,
    seed: int,
    stream: int,
    y: torch.Tensor,
) -> torch.Tensor:
    """:func:`gradzip.kernels.dithered.decode_nested_tiles` as torch operations: float32 for
    the buckets where ``f * max|y|`` over the bucket's own ``y`` is below ``1e30`` (NaN and Inf
    counting as too large), float64 for the others, both computed and selected per element."""
    n, dev = symbols.numel(), symbols.device
    scales = scales.to(dev)
    y = y.to(dev)
    idx = bucket_of_elements(n, bucket_size, dev)
    fac = bucket_factors(numer, scales)
    y32 = y.to(torch.float32)
    size = torch.where(torch.isfinite(y32), y32.abs(), torch.inf).to(torch.float64)
    nb = fac.numel()
    if nb == 1:
        ymax = size.amax().clamp(min=0.0).reshape(1)
    else:
        ymax = pad(size, (0, nb * bucket_size - n)).view(nb, bucket_size).amax(dim=1)
    fast = ((fac <= _F32_MAX) & (fac * ymax < 1e30)).index_select(0, idx) & (k <= 256)
    sigma = scales.to(torch.float64)
    ones = one_plus_uniform_device(seed, stream, n, dev)
    inv_k, shift = 1.0 / k, K0 / k + 0.5
    out = torch.zeros(n, dtype=torch.float32, device=dev)
    for dtype, where in ((torch.float32, fast), (torch.float64, ~fast)):
        f = torch.where(fac <= _F32_MAX, fac, 0.0) if dtype == torch.float32 else fac
        neg = (-f).to(dtype).index_select(0, idx)
        step = (sigma * step_factor).to(dtype).index_select(0, idx)
        yd = y.to(dtype)

        def const(value: float, dtype: torch.dtype = dtype) -> torch.Tensor:
            return torch.tensor(value, dtype=dtype, device=dev)

        v = symbols.to(dtype) - ones.to(dtype)
        v = v + yd * neg
        q = (v * const(inv_k) + const(shift)).floor()
        v = v - q * const(k)
        v = (v + const(K0)) * step
        v = v + yd
        out = torch.where(where, v.to(torch.float32), out)
    return torch.where(scales.index_select(0, idx) == 0, 0.0, out)
