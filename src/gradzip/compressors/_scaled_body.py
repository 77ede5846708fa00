"""The body of the scale-and-quantize codecs: float32 scales, one per bucket, then the packed
symbols; how it is built, sized, read back and checked (dqsg, ndqsg, half_dither, the
stochastic quantizers of :mod:`._scaled_stochastic`, lpc, onebit, qesgd)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from gradzip.codecs.symbols import pack_symbols, packed_symbol_bits, symbol_bits, unpack_symbols
from gradzip.compressors.base import Body, body_tensor
from gradzip.compressors.buckets import num_buckets
from gradzip.errors import CorruptPayloadError, TruncatedPayloadError
from gradzip.kernels.bitpack_torch import pack_bits_torch, unpack_bits_torch
from gradzip.kernels.dithered import fused_encode
from gradzip.kernels.packed import check_packed, packed_bytes
from gradzip.payload import Deferred

_F32_MAX = float(np.finfo(np.float32).max)


# -- checks of what a receiver reads ----------------------------------------------------------
def check_scales(scales: torch.Tensor, what: str) -> None:
    """Reject scales a correct sender cannot produce (negative, NaN, Inf)."""
    if scales.device.type == "cpu":
        # [CHOICE] NumPy on host scales: a few of them per tensor and payload, where torch's
        # fixed cost per operation (about 5 us, four operations) was most of a small model's
        # decode (every payload of every parameter, every step)
        values = scales.detach().numpy()
        good = bool(np.isfinite(values).all()) and bool((values >= 0).all())
    else:
        good = bool(torch.isfinite(scales).all()) and not bool((scales < 0).any())
    if not good:
        raise CorruptPayloadError(f"{what} payload holds a negative or non-finite scale")


def all_finite(scales: torch.Tensor | np.ndarray) -> bool:
    """Whether every scale is finite: for max-abs scales computed by a fused kernel, whether the
    whole input was (see :meth:`gradzip.compressors.base.Compressor._encode_scanned`)."""
    values = scales.numpy() if isinstance(scales, torch.Tensor) else scales
    return bool(np.isfinite(values).all())


def check_symbols(symbols: torch.Tensor, alphabet: int, what: str) -> None:
    """Reject symbols outside ``[0, alphabet)`` (possible in a corrupt fixed-width stream)."""
    if not symbols.numel():
        return
    lo, hi = (0, symbols.max()) if symbols.dtype == torch.uint8 else torch.aminmax(symbols)
    if int(hi) >= alphabet or int(lo) < 0:
        raise CorruptPayloadError(
            f"{what} payload holds a symbol outside the alphabet [0, {alphabet})"
        )


def read_scales(body: memoryview, count: int) -> tuple[torch.Tensor, memoryview]:
    """Split ``count`` float32 scales off the front of a body."""
    size = 4 * count
    if len(body) < size:
        raise TruncatedPayloadError(f"body has {len(body)} bytes; its {count} scales need {size}")
    return body_tensor(body[:size], torch.float32), body[size:]


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


# -- the symbols, packed where they live ------------------------------------------------------
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


# -- building the body ------------------------------------------------------------------------
def scaled_symbols_body(
    scales: torch.Tensor,
    symbols: torch.Tensor,
    alphabet: int,
    packing: str,
    packed: torch.Tensor | None = None,
) -> Body:
    """The body of a scale-and-quantize codec: float32 scales, then the packed symbols.

    ``paper_bits = n*log2(L) + 32*#scales`` (spec 0.5); the scales are the side data.
    ``packed``: the symbols already packed (by a fused kernel), else they are packed here.
    """
    side = 32 * scales.numel()
    if packed is None:
        packed = pack_symbols(symbols, alphabet, packing)
    return Body(
        pieces=[scales, packed],
        paper_bits=symbols.numel() * math.log2(alphabet) + side,
        streams=(symbols,),
        side_bits=side,
    )


def fused_scaled_body(
    x: torch.Tensor,
    given: torch.Tensor | None,
    bucket_size: int,
    alphabet: int,
    encode_args: Mapping[str, Any],
    refuse: Callable[[], Exception],
) -> Body:
    """:func:`scaled_symbols_body`'s body (float32 scales, then the fixed-packed symbols) from
    :func:`~gradzip.kernels.dithered.fused_encode` (``encode_args``: its arithmetic), as one
    :class:`~gradzip.payload.Deferred` piece the kernel writes straight into the payload.
    ``given``: the scale of a one-bucket tensor, or None: the kernel computes every bucket's,
    and a non-finite one (the input was not finite) raises ``refuse()``. Nothing is copied, and
    no symbol array of the tensor's size exists: the symbol stream is unpacked from the
    payload's bytes only if ``entropy_bits`` asks for it."""
    n, bits = x.numel(), symbol_bits(alphabet)
    num_scales = num_buckets(n, bucket_size)
    written: list[np.ndarray] = []

    def write(out: np.ndarray) -> None:
        scales, _ = fused_encode(x, given, bucket_size, **encode_args, bits=bits, out=out)
        if given is None and not all_finite(scales):
            raise refuse()
        written.append(out)

    def streams() -> tuple[torch.Tensor, ...]:
        packed = torch.from_numpy(written[0][4 * num_scales :])
        return (unpack_symbols(packed, n, alphabet, "fixed"),)

    side = 32 * num_scales
    return Body(
        pieces=[Deferred(4 * num_scales + packed_bytes(n, bits), write)],
        paper_bits=n * math.log2(alphabet) + side,
        streams=streams,
        side_bits=side,
    )


# -- its size ---------------------------------------------------------------------------------
def symbols_floor_bits(n: int, alphabet: int, packing: str) -> int:
    """The fewest bits ``n > 0`` packed symbols can take: exact for the fixed and dense packings;
    for the entropy coder its model, at least two bytes (the coded data may be empty)."""
    bits = packed_symbol_bits(n, alphabet, packing)
    return 16 if bits is None else bits


def scaled_symbols_floor_bits(n: int, bucket_size: int, alphabet: int, packing: str) -> int:
    """The fewest body bits of :func:`scaled_symbols_body` for ``n > 0`` elements (a
    ``min_body_bits``): ``32*#buckets`` plus :func:`symbols_floor_bits`."""
    return 32 * num_buckets(n, bucket_size) + symbols_floor_bits(n, alphabet, packing)


def scaled_symbols_bits(n: int, bucket_size: int, alphabet: int, packing: str) -> int | None:
    """Body bits of :func:`scaled_symbols_body`: ``32*#buckets`` + the packed symbols (None when
    entropy-coded)."""
    symbols = packed_symbol_bits(n, alphabet, packing)
    return None if symbols is None else 32 * num_buckets(n, bucket_size) + symbols
