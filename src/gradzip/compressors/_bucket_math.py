"""Bucket-wise float arithmetic shared by the dithered and stochastic quantizers.

Each helper works in place on a flat tensor split into buckets with one value (scale, factor,
step) per bucket: a Python float for a single bucket (the fast scalar kernels) or a column
that broadcasts over a ``(rows, bucket_size)`` view.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from gradzip.codecs.bitpack import check_packed
from gradzip.codecs.symbols import pack_symbols, symbol_bits, unpack_symbols
from gradzip.compressors.common import fresh_uint8, num_buckets
from gradzip.kernels.bitpack_torch import pack_bits_torch, unpack_bits_torch

_F32_MAX = float(np.finfo(np.float32).max)

Scalar = float | torch.Tensor


def segments(n: int, bucket_size: int) -> Iterator[tuple[slice, int, slice]]:
    """Split ``n`` elements into at most two rectangular pieces of whole buckets.

    Yields ``(elements, rows, buckets)``: ``x[elements].view(rows, -1)`` has one bucket per row,
    and ``scales[buckets]`` are their per-bucket values. One bucket gives ``rows == 1``.
    """
    nb = num_buckets(n, bucket_size)
    if nb <= 1:
        yield slice(0, n), 1, slice(0, 1)
        return
    full = n // bucket_size
    yield slice(0, full * bucket_size), full, slice(0, full)
    if full < nb:
        yield slice(full * bucket_size, n), 1, slice(full, nb)


def per_row(values: torch.Tensor, rows: int, buckets: slice) -> Scalar:
    """Per-bucket values for one segment: a Python float for one row (the fast scalar kernels),
    else a ``(rows, 1)`` column that broadcasts over the row."""
    if rows == 1:
        return float(values[buckets.start])
    return values[buckets].view(rows, 1)


def add_scaled_(dst: torch.Tensor, src: torch.Tensor, factor: Scalar) -> None:
    """``dst += src * factor`` in place, without a temporary."""
    if isinstance(factor, float):
        dst.add_(src, alpha=factor)
    else:
        dst.addcmul_(src, factor)


def shift_then_scale_(dst: torch.Tensor, offset: float, factor: Scalar) -> None:
    """``dst = (dst + offset) * factor`` in place; one pass (``offset*factor + factor*dst``) for
    a scalar factor, two for a per-row column."""
    if isinstance(factor, float):
        torch.add(torch.tensor(offset * factor, dtype=dst.dtype), dst, alpha=factor, out=dst)
    else:
        dst.add_(offset).mul_(factor)


def safe_factors(numerator: float, scales: torch.Tensor) -> torch.Tensor:
    """``numerator / scale`` per bucket in float64, and 0 for a zero bucket (no division by 0)."""
    s = scales.to(torch.float64)
    return torch.where(s > 0, numerator / torch.where(s > 0, s, 1.0), 0.0)


def truncate_to_uint8(values: torch.Tensor) -> torch.Tensor:
    """Truncating cast of float32 values in ``(-1, 256)`` to uint8: ``floor`` for ``v >= 0``.

    NumPy's cast is about twice as fast as torch's here; values in ``(-1, 0)`` truncate to 0.
    """
    out = fresh_uint8(values.numel())
    np.copyto(out.numpy(), values.numpy(), casting="unsafe")
    return out


def clamp_to_dtype_(v: torch.Tensor, dtype: torch.dtype, bound: float) -> None:
    """Keep a reconstruction finite in the tensor's own dtype.

    A dithered reconstruction may exceed the scale (by ``sigma/(2M)`` for DQSG), which overflows
    float16 near 65504 or float32 near 3.4e38; where ``bound`` (a bound on ``max|v|``) says that
    can happen, values are clamped to the largest finite number of ``dtype`` [CHOICE]: a tiny
    bias on those elements instead of an infinity.
    """
    limit = float(torch.finfo(dtype if dtype in (torch.float16, torch.bfloat16) else v.dtype).max)
    if limit == float(np.finfo(np.float64).max):
        limit = _F32_MAX
    if not bound < limit:
        v.clamp_(-limit, limit)


def zero_buckets_to_zero(v: torch.Tensor, scales: torch.Tensor, bucket_size: int) -> None:
    """Overwrite the elements of zero buckets with +0.0 (``0 * negative`` would give -0.0)."""
    zero = scales == 0
    if not bool(zero.any()):
        return
    n = v.numel()
    if scales.numel() == 1:
        v.zero_()
        return
    for elems, rows, buckets in segments(n, bucket_size):
        block = v[elems].view(rows, -1)
        block.masked_fill_(zero[buckets].view(rows, 1), 0.0)


def device_packed(symbols: torch.Tensor, alphabet: int, packing: str) -> torch.Tensor:
    """Symbols packed where they live for the fixed packing (torch operations, the layout of
    :mod:`gradzip.codecs.bitpack`); on the CPU for the dense and entropy packings."""
    if packing == "fixed":
        return pack_bits_torch(symbols, symbol_bits(alphabet))
    return pack_symbols(symbols.cpu(), alphabet, packing)


def device_unpacked(data: torch.Tensor, n: int, alphabet: int, packing: str) -> torch.Tensor:
    """Inverse of :func:`device_packed`, with the length and padding checks of
    :func:`gradzip.codecs.bitpack.unpack_bits`."""
    if packing == "fixed":
        bits = symbol_bits(alphabet)
        check_packed(data, n, bits)
        return unpack_bits_torch(data, n, bits)
    return unpack_symbols(data, n, alphabet, packing)
