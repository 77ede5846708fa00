"""The dithered quantizers' encode and decode as torch operations: the device path.

Bit-identical to the numba kernels of :mod:`gradzip.kernels.dithered` (same formulas, same order
of IEEE operations, one torch operation per product or sum, never ``addcmul``/``alpha=``, which
may fuse into an FMA), on any device. The compressors use it for tensors that are not on the
CPU, and for the dense and entropy packings (which pack the symbols afterwards). Per-bucket
values are gathered per element; a bucket needing float64 (see the module docstring of
:mod:`gradzip.kernels.dithered`) is computed in float64 and selected with ``torch.where``.
"""

from __future__ import annotations

import numpy as np
import torch

from gradzip.kernels.buckets import effective_bucket_size
from gradzip.kernels.philox_torch import philox_one_plus_uniform_torch

_F32_MAX = float(np.finfo(np.float32).max)


def bucket_of_elements(n: int, bucket_size: int, device: torch.device) -> torch.Tensor:
    """The bucket index of every element (``bucket_size`` 0: one bucket)."""
    bs = effective_bucket_size(n, bucket_size)
    if bs == 0:
        return torch.zeros(n, dtype=torch.int64, device=device)
    return torch.arange(n, dtype=torch.int64, device=device) // bs


def bucket_factors(numer: float, scales: torch.Tensor) -> torch.Tensor:
    """``numer / sigma`` per bucket in float64, 0 for a zero bucket."""
    s = scales.to(torch.float64)
    # a true division of two tensors: ``number / tensor`` is torch's ``reciprocal() * number``
    # (two roundings), and CUDA divides by a host scalar through its reciprocal too
    top = torch.full((), numer, dtype=torch.float64, device=s.device)
    return torch.where(s > 0, top / torch.where(s > 0, s, 1.0), 0.0)


def _symbol_dtype(top: int) -> torch.dtype:
    return torch.uint8 if top <= 255 else torch.int32


def encode_symbols_torch(
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
    """The symbols of :func:`gradzip.kernels.dithered.encode_tiles` (same arguments)."""
    n, dev = x.numel(), x.device
    scales = scales.to(dev)
    idx = bucket_of_elements(n, bucket_size, dev)
    fac = bucket_factors(numer, scales)[idx]
    fast = (fac <= _F32_MAX) if fast_ok else torch.zeros(n, dtype=torch.bool, device=dev)
    ones = philox_one_plus_uniform_torch(seed, stream, 0, max(nsum, 1) * n, dev).view(-1, n)
    q = torch.zeros(n, dtype=torch.int64, device=dev)
    if bool(fast.any()):
        if nsum == 0:
            base = ones[0]
        else:
            base = ones[0] - 1.0
            for j in range(1, nsum):
                base = base + (ones[j] - 1.0)
        f32 = torch.where(fast, fac, 0.0).to(torch.float32)
        v = base + x * f32
        v = v + torch.tensor(c, dtype=torch.float32, device=dev)
        q = torch.where(fast, v.to(torch.int64).clamp(max=top), q)
    if not bool(fast.all()):
        if nsum == 0:
            w = ones[0].to(torch.float64)
        else:
            w = torch.zeros(n, dtype=torch.float64, device=dev)
            for j in range(nsum):
                w = w + (ones[j] - 1.0).to(torch.float64)
        w = w + c
        w = w + x.to(torch.float64) * fac
        q = torch.where(fast, q, w.floor().clamp(0, top).to(torch.int64))
    if modk > 0:
        q = q.remainder(modk)
    return q.to(_symbol_dtype(top))


def decode_affine_torch(
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
    """:func:`gradzip.kernels.dithered.decode_affine_tiles` as torch operations."""
    n, dev = symbols.numel(), symbols.device
    scales = scales.to(dev)
    idx = bucket_of_elements(n, bucket_size, dev)
    dtype = torch.float64 if wide else torch.float32
    step = (scales.to(torch.float64) / divisor).to(dtype)[idx]
    v = symbols.to(dtype)
    if dithered:
        v = v - philox_one_plus_uniform_torch(seed, stream, 0, n, dev).to(dtype)
    v = v + torch.tensor(c, dtype=dtype, device=dev)
    v = (v * step).to(torch.float32)
    return torch.where(scales[idx] == 0, 0.0, v)


def decode_nested_torch(
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
    """:func:`gradzip.kernels.dithered.decode_nested_tiles` as torch operations (float32 where
    ``f * max|y|`` over the bucket's own ``y`` is below ``1e30``, NaN and Inf counting as too
    large)."""
    n, dev = symbols.numel(), symbols.device
    scales = scales.to(dev)
    y = y.to(dev)
    idx = bucket_of_elements(n, bucket_size, dev)
    fac = bucket_factors(numer, scales)
    y32 = y.to(torch.float32)
    size = torch.where(torch.isfinite(y32), y32.abs(), torch.inf).to(torch.float64)
    ymax = torch.zeros(fac.numel(), dtype=torch.float64, device=dev)
    ymax.scatter_reduce_(0, idx, size, "amax")
    fast = ((fac <= _F32_MAX) & (fac * ymax < 1e30))[idx] & (k <= 256)
    sigma = scales.to(torch.float64)
    ones = philox_one_plus_uniform_torch(seed, stream, 0, n, dev)
    inv_k, shift = 1.0 / k, K0 / k + 0.5
    out = torch.zeros(n, dtype=torch.float32, device=dev)
    for dtype, where in ((torch.float32, fast), (torch.float64, ~fast)):
        if not bool(where.any()):
            continue
        f = torch.where(fac <= _F32_MAX, fac, 0.0) if dtype == torch.float32 else fac
        neg = (-f).to(dtype)[idx]
        step = (sigma * step_factor).to(dtype)[idx]
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
    return torch.where(scales[idx] == 0, 0.0, out)
