"""The scale-and-quantize body (:mod:`._scaled_body`) built and read on the gradient's device,
fixed packing only: float32 scales, then the fixed-width packed symbols (dqsg, ndqsg,
half_dither, hou). See :mod:`gradzip.device` for the rules.

The dithered quantizers' encode (:func:`dithered_device_body`) and affine decode
(:func:`affine_device_values`) run as one Triton launch each where
:func:`~gradzip.kernels.triton_device.use_triton` says so, and as the torch operations of
:mod:`gradzip.kernels.dithered_device` otherwise (the reference: the same bytes and values)."""

from __future__ import annotations

import math
from typing import Any

import torch

from gradzip.codecs.symbols import symbol_bits
from gradzip.compressors._device_stochastic import false_flag, scales_ok, split_scales
from gradzip.compressors.base import Body
from gradzip.kernels.bitpack_device import pack_bits_device, unpack_bits_device
from gradzip.kernels.buckets import num_buckets
from gradzip.kernels.dithered_device import decode_affine_device, encode_symbols_device
from gradzip.kernels.packed import packed_bytes
from gradzip.kernels.triton_device import dithered_packed, dithered_values, use_triton

_F32_MAX = float(torch.finfo(torch.float32).max)


def scaled_device_body(
    scales: torch.Tensor, symbols: torch.Tensor, alphabet: int, finite: torch.Tensor
) -> Body:
    """:func:`~gradzip.compressors._scaled_body.scaled_symbols_body` of the fixed packing, on
    the device: the symbol stream is unpacked from the packed bytes only if asked for."""
    packed = pack_bits_device(symbols, symbol_bits(alphabet))
    return packed_device_body(scales, packed, symbols.numel(), alphabet, symbols.dtype, finite)


def packed_device_body(
    scales: torch.Tensor,
    packed: torch.Tensor,
    n: int,
    alphabet: int,
    dtype: torch.dtype,
    finite: torch.Tensor,
) -> Body:
    """The body ``[scales, packed]`` of ``n`` symbols already packed; the symbol stream
    (``dtype``) is unpacked from the packed bytes only if asked for."""
    bits = symbol_bits(alphabet)

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


def dithered_device_body(
    x: torch.Tensor,
    scales: torch.Tensor,
    bucket_size: int,
    args: dict[str, Any],
    alphabet: int,
    finite: torch.Tensor,
) -> Body:
    """The fixed-packed body of :func:`~gradzip.kernels.dithered_device.encode_symbols_device`
    ``(x, scales, bucket_size, **args)``: quantized and packed in one Triton launch, or by the
    torch operations."""
    if use_triton(x):
        dtype = torch.uint8 if args["top"] <= 255 else torch.int32
        packed = dithered_packed(x, scales, bucket_size, args, symbol_bits(alphabet))
        return packed_device_body(scales, packed, x.numel(), alphabet, dtype, finite)
    symbols = encode_symbols_device(x, scales, bucket_size, **args)
    return scaled_device_body(scales, symbols, alphabet, finite)


def affine_device_values(
    body: torch.Tensor,
    n: int,
    alphabet: int,
    affine: tuple[int, float, float, bool, int, int, bool],
) -> tuple[torch.Tensor, torch.Tensor]:
    """The values of :func:`~gradzip.kernels.dithered_device.decode_affine_device` of a
    fixed-packed body and its flag (:func:`read_scaled_device_body`'s checks);
    ``affine``: ``(bucket_size, divisor, c, dithered, seed, stream, wide)``."""
    bucket_size = affine[0]
    if use_triton(body):
        scales, packed, exact = split_scales(body, n, bucket_size, symbol_bits(alphabet))
        if not exact:  # the host decoder raises (host sizes)
            return torch.zeros(n, dtype=torch.float32, device=body.device), false_flag(body.device)
        values, ok = dithered_values(packed, n, alphabet, scales, *affine)
        return values, ok & scales_ok(scales)
    nb = num_buckets(n, bucket_size)
    scales, symbols, ok = read_scaled_device_body(body, n, nb, alphabet)
    return decode_affine_device(symbols, scales, *affine), ok


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
