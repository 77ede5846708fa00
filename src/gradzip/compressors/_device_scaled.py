"""The scale-and-quantize body (:mod:`._scaled_body`) built and read on the gradient's device,
fixed packing only: float32 scales, then the fixed-width packed symbols (dqsg, ndqsg,
half_dither, hou). See :mod:`gradzip.device` for the rules."""

from __future__ import annotations

import math

import torch

from gradzip.codecs.symbols import symbol_bits
from gradzip.compressors.base import Body
from gradzip.kernels.dithered_device import pack_bits_device, unpack_bits_device
from gradzip.kernels.packed import packed_bytes

_F32_MAX = float(torch.finfo(torch.float32).max)


def scaled_device_body(
    scales: torch.Tensor, symbols: torch.Tensor, alphabet: int, finite: torch.Tensor
) -> Body:
    """:func:`~gradzip.compressors._scaled_body.scaled_symbols_body` of the fixed packing, on
    the device: the symbol stream is unpacked from the packed bytes only if asked for."""
    n, bits = symbols.numel(), symbol_bits(alphabet)
    packed = pack_bits_device(symbols, bits)
    dtype = symbols.dtype

    def streams() -> tuple[torch.Tensor, ...]:
        return (unpack_bits_device(packed, n, bits)[0].to(dtype),)

    side = 32 * scales.numel()
    return Body(
        pieces=[scales, packed],
        paper_bits=n * math.log2(alphabet) + side,
        streams=streams,
        side_bits=side,
        finite=finite,
    )


def read_scaled_device_body(
    body: torch.Tensor, n: int, num_scales: int, alphabet: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(scales, symbols, ok)`` of a fixed-packed device body: ``ok`` (0-d bool) holds when
    the body has the exact size, the scales are finite and non-negative, the padding bits are
    zero and every symbol lies in ``[0, alphabet)`` (the host decoder's checks)."""
    dev = body.device
    bits = symbol_bits(alphabet)
    size = 4 * num_scales
    if body.numel() != size + packed_bytes(n, bits):  # the host decoder raises (host sizes)
        bad = torch.zeros((), dtype=torch.bool, device=dev)
        zeros = torch.zeros(num_scales, dtype=torch.float32, device=dev)
        return zeros, torch.zeros(n, dtype=torch.int64, device=dev), bad
    scales = body.narrow(0, 0, size).view(torch.float32)
    symbols, ok = unpack_bits_device(body.narrow(0, size, body.numel() - size), n, bits)
    ok = ok & torch.isfinite(scales).all() & (scales >= 0).all()
    if alphabet < 1 << bits:
        ok = ok & (symbols < alphabet).all()
    return scales, symbols, ok


def clamp_to_dtype_device(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """:func:`~gradzip.compressors._scaled_body.clamp_to_dtype_` without its host bound:
    always clamped [CHOICE]. Where the host path skips the clamp its bound proves every
    ``|v|`` below the limit, so the clamp changes nothing there: the same values, no read."""
    small = dtype in (torch.float16, torch.bfloat16)
    limit = float(torch.finfo(dtype).max) if small else _F32_MAX
    return v.clamp(-limit, limit)
