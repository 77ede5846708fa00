"""The dithered and stochastic-rounding quantizers on the gradient's device, for device payloads.

The twins of :mod:`gradzip.kernels.dithered_torch` and :mod:`gradzip.kernels.stochastic_torch`
(same formulas, same order of IEEE operations, so the bytes equal the numba kernels'), written
for the rules of :mod:`gradzip.device`: no Python indexing or slicing of a tensor (``narrow``,
``select``, ``index_select``, ``pad``), and no value read back to the host. Where the torch
twins ask the host whether any bucket needs the float32 (or float64) arithmetic
(``bool(fast.any())``), these compute both and select per element with ``torch.where``
[CHOICE]: a second pass over the tensor on the device instead of a stall for one flag.
The fixed-width packing is :mod:`gradzip.kernels.bitpack_torch`'s layout; its unpacking
returns a validity flag (padding bits zero) instead of raising.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn.functional import pad

from gradzip.kernels.buckets import effective_bucket_size, num_buckets
from gradzip.kernels.dithered_torch import bucket_factors, bucket_of_elements
from gradzip.kernels.philox_torch import one_plus_uniform_from_halves, philox4x32_10_torch

_F32_MAX = float(np.finfo(np.float32).max)
_TINY32 = 2.0**-149
_LOW16 = 0xFFFF
_LOW32 = 0xFFFFFFFF


# -- randomness ------------------------------------------------------------------------------
def one_plus_uniform_device(seed: int, stream: int, n: int, device: torch.device) -> torch.Tensor:
    """:func:`gradzip.kernels.philox_torch.philox_one_plus_uniform_torch` from offset 0 (``n >
    0`` float32 ``1 + u``), with ``narrow`` for its slicing."""
    words = -(-n // 2)
    blocks = torch.arange(-(-words // 4), dtype=torch.int64, device=device)
    four = philox4x32_10_torch(
        blocks & _LOW32,
        blocks >> 32,
        torch.full_like(blocks, stream),
        torch.zeros_like(blocks),
        seed & _LOW32,
        seed >> 32,
    )
    flat = torch.stack(four, dim=1).reshape(-1).narrow(0, 0, words)
    halves = torch.stack((flat & _LOW16, flat >> 16), dim=1).reshape(-1).narrow(0, 0, n)
    return one_plus_uniform_from_halves(halves)


# -- buckets ---------------------------------------------------------------------------------
def per_element(values: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """One value per bucket spread to the elements of bucket index ``idx``."""
    return values.index_select(0, idx)


def single_absmax(x: torch.Tensor) -> torch.Tensor:
    """The host path's one-bucket scale ``max(-min(x), max(x))`` with Python's ``max`` (the
    first argument unless the second is larger: which zero a zero tensor gets), as a float32
    tensor of one element."""
    lo, hi = torch.aminmax(x)
    neg = -lo
    return torch.where(hi > neg, hi, neg).reshape(1)


def bucket_absmax_device(x: torch.Tensor, bucket_size: int) -> torch.Tensor:
    """``max|x_B|`` of each of several buckets (float32, +0.0 for a zero bucket; NaN where a
    bucket holds NaN): the fused kernels' scales."""
    n = x.numel()
    nb = num_buckets(n, bucket_size)
    padded = pad(x.abs(), (0, nb * bucket_size - n))
    return padded.view(nb, bucket_size).amax(dim=1)


def scales_device(x: torch.Tensor, bucket_size: int) -> torch.Tensor:
    """The per-bucket max-abs scales of the host path (see :func:`single_absmax`)."""
    if effective_bucket_size(x.numel(), bucket_size) == 0:
        return single_absmax(x)
    return bucket_absmax_device(x, bucket_size)


# -- fixed-width packing ---------------------------------------------------------------------
def pack_bits_device(symbols: torch.Tensor, bits: int) -> torch.Tensor:
    """:func:`gradzip.kernels.bitpack_torch.pack_bits_torch` (LSB-first, ``bits <= 32``)."""
    n = symbols.numel()
    groups = -(-n // 8)
    s = pad(symbols.to(torch.int64) & ((1 << bits) - 1), (0, groups * 8 - n)).view(groups, 8)
    columns: list[torch.Tensor | None] = [None] * bits
    for j in range(8):
        first = j * bits
        sym = s.select(1, j)
        for byte in range(first // 8, (first + bits - 1) // 8 + 1):
            shift = first - 8 * byte
            part = ((sym << shift) if shift >= 0 else (sym >> -shift)) & 0xFF
            column = columns[byte]
            columns[byte] = part if column is None else column | part
    stacked = torch.stack([c for c in columns if c is not None], dim=1)
    return stacked.to(torch.uint8).reshape(-1).narrow(0, 0, (n * bits + 7) // 8)


def unpack_bits_device(data: torch.Tensor, n: int, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`pack_bits_device` for a stream of exactly ``ceil(n*bits/8)`` bytes:
    the int64 symbols and whether the padding bits are zero (0-d bool)."""
    groups = -(-n // 8)
    raw = pad(data.to(torch.int64), (0, groups * bits - data.numel())).view(groups, bits)
    columns = []
    for j in range(8):
        first = j * bits
        column = None
        for byte in range(first // 8, (first + bits - 1) // 8 + 1):
            shift = first - 8 * byte
            b = raw.select(1, byte)
            part = (b >> shift) if shift >= 0 else (b << -shift)
            column = part if column is None else column | part
        assert column is not None
        columns.append(column)
    symbols = (torch.stack(columns, dim=1) & ((1 << bits) - 1)).reshape(-1).narrow(0, 0, n)
    tail = (n * bits) % 8
    if tail:
        ok = (data.narrow(0, data.numel() - 1, 1).to(torch.int64) >> tail == 0).all()
    else:
        ok = torch.ones((), dtype=torch.bool, device=data.device)
    return symbols, ok


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
    """:func:`gradzip.kernels.dithered_torch.encode_symbols_torch` (same arguments) on the
    device: both arithmetics where ``fast_ok``, selected per element."""
    n, dev = x.numel(), x.device
    idx = bucket_of_elements(n, bucket_size, dev)
    fac = per_element(bucket_factors(numer, scales), idx)
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
    """:func:`gradzip.kernels.dithered_torch.decode_affine_torch` on the device."""
    n, dev = symbols.numel(), symbols.device
    idx = bucket_of_elements(n, bucket_size, dev)
    dtype = torch.float64 if wide else torch.float32
    # divided by a device scalar: CUDA divides by a host scalar through its reciprocal
    wide_div = torch.full((), divisor, dtype=torch.float64, device=dev)
    step = per_element((scales.to(torch.float64) / wide_div).to(dtype), idx)
    v = symbols.to(dtype)
    if dithered:
        v = v - one_plus_uniform_device(seed, stream, n, dev).to(dtype)
    v = v + torch.tensor(c, dtype=dtype, device=dev)
    v = (v * step).to(torch.float32)
    return torch.where(per_element(scales, idx) == 0, 0.0, v)


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
    """:func:`gradzip.kernels.dithered_torch.decode_nested_torch` on the device: float32 for
    the buckets where ``f * max|y|`` is below ``1e30``, float64 for the others, both computed
    and selected per element."""
    n, dev = symbols.numel(), symbols.device
    idx = bucket_of_elements(n, bucket_size, dev)
    fac = bucket_factors(numer, scales)
    y32 = y.to(torch.float32)
    size = torch.where(torch.isfinite(y32), y32.abs(), torch.inf).to(torch.float64)
    nb = fac.numel()
    if nb == 1:
        ymax = size.amax().clamp(min=0.0).reshape(1)
    else:
        ymax = pad(size, (0, nb * bucket_size - n)).view(nb, bucket_size).amax(dim=1)
    fast = per_element((fac <= _F32_MAX) & (fac * ymax < 1e30), idx) & (k <= 256)
    sigma = scales.to(torch.float64)
    ones = one_plus_uniform_device(seed, stream, n, dev)
    inv_k, shift = 1.0 / k, K0 / k + 0.5
    out = torch.zeros(n, dtype=torch.float32, device=dev)
    for dtype, where in ((torch.float32, fast), (torch.float64, ~fast)):
        f = torch.where(fac <= _F32_MAX, fac, 0.0) if dtype == torch.float32 else fac
        neg = per_element((-f).to(dtype), idx)
        step = per_element((sigma * step_factor).to(dtype), idx)
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
    return torch.where(per_element(scales, idx) == 0, 0.0, out)


# -- stochastic rounding on a symmetric grid (Hou) -------------------------------------------
def symmetric_symbols_device(
    x: torch.Tensor,
    scales: torch.Tensor,
    bucket_size: int,
    per: int,
    s: int,
    seed: int,
    stream: int,
) -> torch.Tensor:
    """:func:`gradzip.kernels.stochastic_torch.symmetric_symbols_torch` without clipping, on
    the device (both arithmetics where ``s <= 127``, selected per element)."""
    n, dev = x.numel(), x.device
    idx = bucket_of_elements(n, bucket_size, dev)
    # divided by a device scalar: CUDA divides by a host scalar through its reciprocal
    step = (scales.to(torch.float64) / torch.full((), per, dtype=torch.float64, device=dev)).to(
        torch.float32
    )
    fallback = torch.where(scales > 0, _TINY32, 1.0).to(torch.float32)
    f = 1.0 / torch.where(step > 0, step, fallback).to(torch.float64)
    ones = one_plus_uniform_device(seed, stream, n, dev)
    w = ones.to(torch.float64) + float(s - 1)
    w = w + x.to(torch.float64) * per_element(f, idx)
    q = w.floor().clamp(0, 2 * s).to(torch.int64)
    if s <= 127:
        fast = per_element(f <= _F32_MAX, idx)
        f32 = per_element(torch.where(f <= _F32_MAX, f, 0.0).to(torch.float32), idx)
        v = ones + x * f32
        if s != 1:
            v = v + torch.tensor(s - 1, dtype=torch.float32, device=dev)
        q = torch.where(fast, v.to(torch.int64).clamp(0, 2 * s), q)
    return q.to(torch.uint8 if 2 * s <= 255 else torch.int32)


def symmetric_values_device(
    symbols: torch.Tensor, mults: torch.Tensor, bucket_size: int, s: int
) -> torch.Tensor:
    """``f32(symbol - s) * mult`` per element (float32), on the symbols' device."""
    idx = bucket_of_elements(symbols.numel(), bucket_size, symbols.device)
    levels = (symbols.to(torch.int64) - s).to(torch.float32)
    return levels * per_element(mults.to(torch.float32), idx)
