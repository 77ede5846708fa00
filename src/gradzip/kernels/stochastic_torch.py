"""The stochastic-rounding quantizers' encode, decode and fixed packing as torch operations.

The device twin of :mod:`gradzip.kernels.stochastic`: the same formulas in the same order of
IEEE operations (one torch operation per product or sum, never ``addcmul`` or ``alpha=``, which
may fuse into an FMA), on any device, so a CUDA gradient is compressed where it lives and its
bytes equal the CPU kernel's. The compressors also use the symbol functions for the dense and
entropy packings. Per-bucket values are gathered per element; buckets needing float64 are
computed in float64 and selected with ``torch.where``.
"""

from __future__ import annotations

import numpy as np
import torch

from gradzip.kernels.buckets import effective_bucket_size, num_buckets
from gradzip.kernels.device_buckets import bucket_of_elements
from gradzip.kernels.philox import LOCAL_UNIFORM
from gradzip.kernels.philox_torch import philox_one_plus_uniform_torch

_F32_MAX = float(np.finfo(np.float32).max)
_TINY32 = 2.0**-149


def bucket_absmax_torch(x: torch.Tensor, bucket_size: int) -> torch.Tensor:
    """``max|x_B|`` per bucket (float32) on ``x``'s device."""
    n = x.numel()
    if effective_bucket_size(n, bucket_size) == 0:
        return x.abs().amax().view(1)
    nb = num_buckets(n, bucket_size)
    padded = torch.zeros(nb * bucket_size, dtype=x.dtype, device=x.device)
    padded[:n] = x.abs()
    return padded.view(nb, bucket_size).amax(dim=1)


def symmetric_divisors(scales: torch.Tensor, per: int) -> torch.Tensor:
    """Encoder divisor per bucket: ``f32(f64(c)/per)``, or the smallest subnormal where that
    underflows for ``c > 0``, or 1 for ``c == 0`` (float32)."""
    step = (scales.to(torch.float64) / per).to(torch.float32)
    fallback = torch.where(scales > 0, _TINY32, 1.0).to(torch.float32)
    return torch.where(step > 0, step, fallback)


def symmetric_symbols_torch(
    x: torch.Tensor, scales: torch.Tensor, bucket_size: int, per: int, s: int, clip: bool, seed: int
) -> torch.Tensor:
    """The symbols of :func:`gradzip.kernels.stochastic.encode_symmetric` (uint8 for ``2s <
    256``, else int32) for float32 ``x`` on any device."""
    n, dev = x.numel(), x.device
    idx = bucket_of_elements(n, bucket_size, dev)
    f = 1.0 / symmetric_divisors(scales.to(dev), per).to(torch.float64)  # per bucket
    fast = (f <= _F32_MAX) & (s <= 127)
    ones = philox_one_plus_uniform_torch(seed, LOCAL_UNIFORM, 0, n, dev)
    q = torch.zeros(n, dtype=torch.int64, device=dev)
    fast_e = fast[idx]
    if bool(fast.any()):
        f32 = torch.where(fast, f, 0.0).to(torch.float32)[idx]
        v = ones + x * f32
        if clip:
            v = v.clamp(1 - s, 1 + s)
        if s != 1:
            v = v + torch.tensor(s - 1, dtype=torch.float32, device=dev)
        q = torch.where(fast_e, v.to(torch.int64).clamp(0, 2 * s), q)
    if not bool(fast.all()):
        w = ones.to(torch.float64) + float(s - 1)
        w = w + x.to(torch.float64) * f[idx]
        q = torch.where(fast_e, q, w.floor().clamp(0, 2 * s).to(torch.int64))
    return q.to(torch.uint8 if 2 * s <= 255 else torch.int32)


def symmetric_values_torch(
    symbols: torch.Tensor, mults: torch.Tensor, bucket_size: int, s: int
) -> torch.Tensor:
    """``f32(symbol - s) * mult`` per element (float32), on the symbols' device."""
    n, dev = symbols.numel(), symbols.device
    idx = bucket_of_elements(n, bucket_size, dev)
    levels = (symbols.to(torch.int64) - s).to(torch.float32)
    return levels * mults.to(device=dev, dtype=torch.float32)[idx]


def twos_symbols_torch(
    x: torch.Tensor, steps: torch.Tensor, bucket_size: int, bits: int, seed: int
) -> torch.Tensor:
    """The symbols of :func:`gradzip.kernels.stochastic.encode_twos` (uint8 up to 8 bits)."""
    n, dev = x.numel(), x.device
    idx = bucket_of_elements(n, bucket_size, dev)
    steps = steps.to(device=dev, dtype=torch.float32)
    d = torch.where(steps > 0, steps, 1.0)[idx]
    u = philox_one_plus_uniform_torch(seed, LOCAL_UNIFORM, 0, n, dev) - 1.0
    work = torch.float64 if bits > 8 else torch.float32
    k = x.to(work) / d.to(work)
    k = k + u.to(work)
    k = k.floor().clamp(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    codes: torch.Tensor = k.to(torch.int64) & (2**bits - 1)
    return codes.to(torch.uint8 if bits <= 8 else torch.int32)


def twos_values_torch(
    symbols: torch.Tensor, steps: torch.Tensor, bucket_size: int, bits: int
) -> torch.Tensor:
    """``f32(k) * step`` with ``k`` the sign-extended ``bits``-bit code of each symbol."""
    n, dev = symbols.numel(), symbols.device
    idx = bucket_of_elements(n, bucket_size, dev)
    k = symbols.to(torch.int64)
    k = torch.where(k >= 2 ** (bits - 1), k - 2**bits, k)
    return k.to(torch.float32) * steps.to(device=dev, dtype=torch.float32)[idx]
