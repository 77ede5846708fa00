"""The device bodies of the stochastic-rounding quantizers (QSGD, TernGrad, LPC, QESGD): built
and decoded where the gradient lives, byte for byte the host path's (see :mod:`gradzip.device`
and :mod:`gradzip.kernels.stochastic_device`).

Only the fixed packing stays on the device [CHOICE]: the dense and entropy packings (and QSGD's
Elias records) are sequential coders that run on the host, so those configurations are not
device resident and take the host path (their codecs say which).
"""

from __future__ import annotations

import math

import torch

from gradzip.compressors.base import Body
from gradzip.compressors.buckets import num_buckets
from gradzip.kernels.bitpack_device import pack_bits_device, unpack_bits_device
from gradzip.kernels.packed import packed_bytes, symbol_bits
from gradzip.kernels.stochastic_device import (
    symmetric_symbols_device,
    symmetric_values_device,
    twos_symbols_device,
    twos_values_device,
)
from gradzip.kernels.triton_device import symmetric_encoded, symmetric_values, use_triton

_HALF_TOPS = {
    torch.float16: float(torch.finfo(torch.float16).max),
    torch.bfloat16: float(torch.finfo(torch.bfloat16).max),
}


def symmetric_device_body(
    x: torch.Tensor,
    scales: torch.Tensor,
    per: int,
    s: int,
    seed: int,
    bucket_size: int,
    clip: bool,
    finite: torch.Tensor | None,
) -> Body:
    """The fixed-packed body ``[float32 scales, packed symbols]`` of the symmetric grid (the
    host path's :func:`~gradzip.compressors._scaled_stochastic.symmetric_body`); ``finite``:
    the input's finiteness flag where the scales already say it (max-abs scales). One fused
    Triton launch where :func:`~gradzip.kernels.triton_device.use_triton` says so, else the
    torch operations (the reference)."""
    alphabet = 2 * s + 1
    if use_triton(x):
        symbols, packed = symmetric_encoded(x, scales, bucket_size, per, s, clip, seed)
    else:
        symbols = symmetric_symbols_device(x, scales, bucket_size, per, s, clip, seed)
        packed = pack_bits_device(symbols, symbol_bits(alphabet))
    side = 32 * scales.numel()
    return Body(
        pieces=[scales.to(torch.float32), packed],
        paper_bits=x.numel() * math.log2(alphabet) + side,
        streams=lambda: (symbols.to(torch.uint8 if 2 * s <= 255 else torch.int32),),
        side_bits=side,
        finite=finite,
    )


def scales_ok(scales: torch.Tensor) -> torch.Tensor:
    """0-d flag: every scale finite and not negative (the host's ``check_scales``)."""
    return (torch.isfinite(scales) & (scales >= 0)).all()


def false_flag(device: torch.device) -> torch.Tensor:
    """A 0-d False on ``device``: a malformed body, diagnosed by the host decoder."""
    return torch.zeros((), dtype=torch.bool, device=device)


def split_scales(
    body: torch.Tensor, n: int, bucket_size: int, bits: int
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """``(float32 scales, packed bytes, exact)`` of a ``[scales, packed]`` body; ``exact``
    (host arithmetic) whether its size is the one the header implies."""
    nb = num_buckets(n, bucket_size)
    expected = 4 * nb + packed_bytes(n, bits)
    if body.numel() != expected:
        empty = torch.zeros(nb, dtype=torch.float32, device=body.device)
        return (
            empty,
            torch.zeros(packed_bytes(n, bits), dtype=torch.uint8, device=body.device),
            False,
        )
    scales = body.narrow(0, 0, 4 * nb).view(torch.float32)
    return scales, body.narrow(0, 4 * nb, body.numel() - 4 * nb), True


def symmetric_device_values(
    packed: torch.Tensor, n: int, mults: torch.Tensor, s: int, bucket_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``f32(symbol - s) * mult`` per bucket and the flag: padding bits zero and every symbol in
    the alphabet ``[0, 2s]``. One Triton launch where
    :func:`~gradzip.kernels.triton_device.use_triton` says so, else the torch operations."""
    if use_triton(packed):
        return symmetric_values(packed, n, mults, s, bucket_size)
    symbols, clean = unpack_bits_device(packed, n, symbol_bits(2 * s + 1))
    ok = clean & (symbols.amax() <= 2 * s)
    return symmetric_values_device(symbols, mults, bucket_size, s), ok


def twos_device_symbols(
    x: torch.Tensor, steps: torch.Tensor, bits: int, seed: int, bucket_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(symbols, packed)`` of the two's complement grid (the host's ``twos_body``)."""
    symbols = twos_symbols_device(x, steps, bucket_size, bits, seed)
    return symbols, pack_bits_device(symbols, bits)


def twos_device_values(
    packed: torch.Tensor, n: int, steps: torch.Tensor, bits: int, bucket_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``f32(k) * step`` of the packed ``bits``-bit codes and the padding flag."""
    symbols, clean = unpack_bits_device(packed, n, bits)
    return twos_values_device(symbols, steps, bucket_size, bits), clean


def fit_dtype_device(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """:func:`~gradzip.compressors._scaled_stochastic.fit_dtype_` out of place: saturate to a
    narrower float dtype's finite range."""
    top = _HALF_TOPS.get(dtype)
    return values if top is None else values.clamp(-top, top)
