"""fp16: half precision with a power-of-two tensor scale, so that it never overflows."""

from __future__ import annotations

import math
import struct
from typing import Any, ClassVar

import numpy as np
import torch

from gradzip.compressors.base import Body, Compressor, body_view, empty_output
from gradzip.compressors.registry import register
from gradzip.errors import CorruptPayloadError, TruncatedPayloadError
from gradzip.keys import StreamKey
from gradzip.payload import Deferred, Header

#: the scaled max|x| lies in [2**14, 2**15): far from float16's 65504, so rounding cannot overflow
_TOP = 15
#: exponents the encoder can emit for finite float32 input (max|x| from 2**-149 up to 2**128)
_E_MIN = -149 - _TOP
_E_MAX = 128 - _TOP
_F32_MAX = torch.finfo(torch.float32).max
_EXPONENT = struct.Struct("<h")
#: elements per block of the encoder: a float32 block (1 MiB) stays in the L2 cache
_BLOCK = 1 << 18
#: elements per block of the decoder's widen-and-check loop (fewer, larger calls measured best)
_DECODE_BLOCK = 1 << 20


def scale_exponent(absmax: float) -> int:
    """The tensor exponent ``e``: ``absmax / 2**e`` lies in ``[2**14, 2**15)`` (0 for zeros)."""
    if absmax == 0.0:
        return 0
    _, exp = math.frexp(absmax)  # absmax = m * 2**exp with m in [0.5, 1)
    return exp - _TOP


def to_half_scaled(x: torch.Tensor, e: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x / 2**e`` rounded once to float16 (the product is exact: a power of two).

    Works block by block through a cache-resident float32 buffer: a direct
    ``torch.mul(x, s, out=half)`` takes a slow mixed-dtype path (about 1.6x the time), and a
    whole-tensor float32 temporary costs a 4-byte-per-element allocation. ``out`` (float16,
    ``x.numel()`` elements) receives the values when given, e.g. the payload buffer itself.
    """
    # 2**-e beyond float32's range (e < -127) is applied in two exact steps: x * 2**127 < 2**15
    factors = (2.0**-e,) if e >= -127 else (2.0**127, 2.0 ** (-e - 127))
    n = x.numel()
    half = torch.empty(n, dtype=torch.float16) if out is None else out
    buf = torch.empty(min(n, _BLOCK), dtype=torch.float32)
    for start in range(0, n, _BLOCK):
        src = x[start : start + _BLOCK]
        block = buf[: src.numel()]
        torch.mul(src, factors[0], out=block)
        for factor in factors[1:]:
            block.mul_(factor)
        half[start : start + _BLOCK].copy_(block)
    return half


def _widen_checked(src: torch.Tensor, factor: float) -> torch.Tensor:
    """``src * factor`` in float32 (``factor`` a power of two), block by block, refusing NaN or
    Inf while each block is in cache (the decode's finiteness check without a second pass)."""
    n = src.numel()
    out = empty_output(n)
    for start in range(0, n, _DECODE_BLOCK):
        block = out[start : start + _DECODE_BLOCK]
        block.copy_(src[start : start + _DECODE_BLOCK])
        if factor != 1.0:
            block.mul_(factor)
        lo, hi = torch.aminmax(block)
        if not abs(float(lo)) < math.inf > abs(float(hi)):  # NaN fails both comparisons
            raise CorruptPayloadError("fp16 payload decodes to non-finite values: corrupt body")
    return out


@register
class FP16(Compressor):
    """Half precision (IEEE float16) with a power-of-two tensor scale: never overflows.

    [CHOICE] The sender picks ``e = frexp(max|x|).exponent - 15`` so that ``max|x| / 2**e`` lies
    in ``[2**14, 2**15)``, sends ``e`` as an int16 and the values ``x / 2**e`` as float16.
    Dividing by a power of two is exact, so each coordinate is rounded once (round to nearest
    even), and the largest magnitudes keep float16's full 11-bit precision whatever the range
    of ``x``: a plain cast would turn anything above 65504 into Inf and flush small gradients.

    Bits: ``16 + 16 n`` (body); paper bits the same.

    Error (deterministic, no variance): ``|x_hat_i - x_i| <= 2**-11 |x_i|`` for every
    ``|x_i| >= 2**(e-14)`` (about ``max|x| * 2**-29``, float16's normal range). Below that the
    values fall in float16's subnormal range: the absolute error is at most ``2**(e-25)``
    (at most ``max|x| * 2**-39``), and coordinates below it flush to 0. So fp16 is relative-error
    exact to 2**-11 near the top but loses values more than ~2**40 below ``max|x|``; use
    ``bf16`` (float32's exponent range, 2**-8 relative error) for such spreads.

    Parameters: none. Delta-approximate with ``delta >= 1 - 2**-22`` when every coordinate lies
    in the normal range.

    References: IEEE 754-2008 binary16; Micikevicius et al., "Mixed Precision Training"
    (ICLR 2018), whose loss scaling is the same power-of-two trick.
    """

    name = "fp16"
    codec_id = 2
    checks_finite_output = True
    device_resident = True
    example_params: ClassVar[dict[str, Any]] = {}

    def _encode_flat(
        self, x: torch.Tensor, key: StreamKey, absmax: float, shape: tuple[int, ...]
    ) -> Body:
        e = scale_exponent(absmax)
        n = x.numel()

        def write_halves(out: np.ndarray) -> None:
            # straight into the payload: the values are written once, never copied
            to_half_scaled(x, e, out=torch.from_numpy(out).view(torch.float16))

        bits = 16 + 16 * n
        return Body(
            pieces=[_EXPONENT.pack(e), Deferred(2 * n, write_halves)],
            paper_bits=float(bits),
            side_bits=bits,
        )

    def _decode_flat(
        self, body: memoryview, header: Header, side: torch.Tensor | None
    ) -> torch.Tensor:
        expected = 2 + 2 * header.numel
        if len(body) < expected:
            raise TruncatedPayloadError(f"fp16 body has {len(body)} bytes, needs {expected}")
        if len(body) > expected:
            raise CorruptPayloadError(f"fp16 body has {len(body)} bytes, expected {expected}")
        (e,) = _EXPONENT.unpack(body[:2])
        if not _E_MIN <= e <= _E_MAX:
            raise CorruptPayloadError(
                f"fp16 scale exponent {e} is outside the range [{_E_MIN}, {_E_MAX}] "
                "that an encoder emits"
            )
        half = body_view(body[2:], torch.float16)
        if -102 <= e <= 112:
            # every product is a normal float32 (|h| in [2**-24, 2**15]): exact, in place;
            # the body is read once, straight into the output
            return _widen_checked(half, 2.0**e)
        # rare extremes: a float32 subnormal result, or 2**15 * 2**113 beyond float32. Round once
        # from float64 and saturate, so max|x| near float32's max cannot decode to Inf.
        wide = half.to(torch.float64).mul_(2.0**e).clamp_(-_F32_MAX, _F32_MAX)
        return _widen_checked(wide, 1.0)

    def _encode_device(self, x: torch.Tensor, key: StreamKey, shape: tuple[int, ...]) -> Body:
        # the exponent of max|x| by frexp, as scale_exponent; the scaling is exact in float64,
        # and rounding to float32 and then to float16 rounds as the host path's float32
        # product and cast do (the float32 product is the exact product rounded once)
        absmax = x.abs().amax()
        _, exponent = torch.frexp(absmax)
        e = torch.where(absmax > 0, exponent - _TOP, 0).to(torch.int32)
        scaled = torch.ldexp(x.to(torch.float64), -e.to(torch.float64)).to(torch.float32)
        bits = 16 + 16 * x.numel()
        return Body(
            pieces=[e.to(torch.int16).reshape(1), scaled.to(torch.float16)],
            paper_bits=float(bits),
            side_bits=bits,
            finite=torch.isfinite(absmax),
        )

    def _decode_device(
        self, body: torch.Tensor, header: Header, side: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        e = body.narrow(0, 0, 2).view(torch.int16).to(torch.int32)
        half = body.narrow(0, 2, body.numel() - 2).view(torch.float16)
        # as the host path: one exact float64 product, rounded once and saturated to float32
        wide = torch.ldexp(half.to(torch.float64), e.to(torch.float64))
        values = wide.clamp(-_F32_MAX, _F32_MAX).to(torch.float32)
        valid = ((e >= _E_MIN) & (e <= _E_MAX)).all()
        return values, valid

    def expected_body_bits(self, x: torch.Tensor) -> int:
        return 16 + 16 * x.numel()

    def min_body_bits(self, header: Header) -> int:
        return 16 + 16 * header.numel
