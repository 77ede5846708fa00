"""QESGD's quantizer Q_{delta,b}: a fixed, externally scheduled two's complement grid."""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

import torch

from gradzip.codecs.symbols import Packing, check_packing, pack_symbols, packed_symbol_bits
from gradzip.compressors._device_stochastic import (
    false_flag,
    fit_dtype_device,
    twos_device_symbols,
    twos_device_values,
)
from gradzip.compressors._scaled_body import symbols_floor_bits
from gradzip.compressors._scaled_stochastic import fit_dtype_, twos_body, twos_values
from gradzip.compressors.base import Body, Compressor, body_tensor
from gradzip.compressors.registry import register
from gradzip.kernels.bitpack_device import pack_bits_device
from gradzip.kernels.packed import packed_bytes
from gradzip.keys import StreamKey
from gradzip.payload import Header
from gradzip.rng import derive_seed


@register
class QESGD(Compressor):
    """QESGD's ``Q_{delta,b}``: stochastic rounding onto ``{delta*k : -2^(b-1) <= k < 2^(b-1)}``.

    The grid is asymmetric two's complement (spec 2.1): ``lo = -delta*2^(b-1)``,
    ``hi = delta*(2^(b-1) - 1)``. Per coordinate ``k = clamp(floor(v/delta + u), lo/delta,
    hi/delta)`` with ``u ~ U[0,1)`` local randomness, i.e. ``k = a + Bern(v/delta - a)`` inside
    the range and the nearest end outside it: values outside the grid are *clipped* on purpose
    (the method's only bias). ``delta`` comes from the schedule (spec 2.3) on both sides and is
    not sent; it is applied as a float32 [CHOICE]. ``delta == 0`` decodes everything to 0 and
    warns once (at construction).

    Bits: ``b*d`` (``k`` as a ``b``-bit two's complement integer, ``packing="fixed"``);
    ``paper_bits = b*d``.

    Variance: inside ``[lo, hi]`` unbiased with ``(a' - v)(v - a' + delta) <= delta^2/4``
    (``a' = delta*ceil(v/delta)``). Lemma 1: for any ``v`` in the hull of the grid and any
    ``v'``, ``E[(Q(v') - v)^2] <= (v' - v)^2 + delta^2/4``. Trade-offs: ``delta`` sets the
    resolution and, with ``b``, the clipping range ``delta*2^(b-1)``; the schedule shrinks it as
    ``1/sqrt(t)``. The index ``floor(v/delta + u)`` is computed in float32 for ``b <= 8`` and in
    float64 above, where float32 would round ``v/delta + u`` too coarsely near ``2^(b-1)`` and
    bias the rounding probabilities (spec 0.3).

    Device resident (:attr:`device_resident`) with ``packing="fixed"`` (the default), every
    ``bits`` and ``delta``: a CUDA gradient is encoded into a device payload and decoded there,
    with nothing read back (:mod:`gradzip.compressors._device_stochastic`); the dense and
    entropy packings (sequential host coders) take the host path.

    References: "Quantized Epoch-SGD for Communication-Efficient Distributed Learning" (QESGD),
    eqs. (3)-(4); spec sections 2.1-2.3.
    """

    name = "qesgd"
    codec_id = 17
    example_params: ClassVar[dict[str, Any]] = {"delta": 1e-3}

    def __init__(self, delta: float, bits: int = 8, packing: Packing = "fixed") -> None:
        delta = float(delta)
        if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 16:
            raise ValueError(f"qesgd: bits must be an int in [1, 16], got {bits!r}")
        if not delta >= 0:
            raise ValueError(f"qesgd: delta must be a float >= 0, got {delta}")
        self.delta32 = float(torch.tensor(delta, dtype=torch.float32))
        if self.delta32 == float("inf") or (delta > 0 and self.delta32 == 0):
            raise ValueError(f"qesgd: delta {delta} is outside the float32 range")
        if delta == 0:
            warnings.warn(
                "qesgd: delta == 0, every value quantizes to 0 (check the delta schedule)",
                stacklevel=2,
            )
        self.delta = delta
        self.bits = bits
        self.packing = check_packing(packing)
        self.k_min = -(2 ** (bits - 1))
        self.k_max = 2 ** (bits - 1) - 1

    def wire_params(self) -> dict[str, int | float | bool | str]:
        return {"delta": self.delta, "bits": self.bits, "packing": self.packing}

    def _encode_flat(
        self, x: torch.Tensor, key: StreamKey, absmax: float, shape: tuple[int, ...]
    ) -> Body:
        n = x.numel()
        if self.delta32 != 0:
            step = torch.tensor([self.delta32], dtype=torch.float32)
            symbols, packed = twos_body(x, step, self.bits, key, 0, self.packing)
        else:
            symbols = torch.zeros(n, dtype=torch.uint8 if self.bits <= 8 else torch.int32)
            packed = pack_symbols(symbols, 2**self.bits, self.packing)
        return Body(pieces=[packed], paper_bits=float(self.bits * n), streams=(symbols,))

    def _decode_flat(
        self, body: memoryview, header: Header, side: torch.Tensor | None
    ) -> torch.Tensor:
        step = torch.tensor([self.delta32], dtype=torch.float32)
        values = twos_values(body_tensor(body), header.numel, step, self.bits, 0, self.packing)
        return fit_dtype_(values, header.dtype)

    @property
    def device_resident(self) -> bool:  # type: ignore[override]
        """The fixed packing encodes and decodes on the gradient's device; the dense and
        entropy packings are host coders."""
        return self.packing == "fixed"

    def _encode_device(self, x: torch.Tensor, key: StreamKey, shape: tuple[int, ...]) -> Body:
        """:meth:`_encode_flat` on the device (the step a float32 on the device, so that the
        division is the host's true division); finiteness is the base's scan of ``x``."""
        n = x.numel()
        if self.delta32 != 0:
            step = torch.full((1,), self.delta32, dtype=torch.float32, device=x.device)
            seed = derive_seed(key, domain="local")
            symbols, packed = twos_device_symbols(x, step, self.bits, seed, 0)
        else:
            symbols = torch.zeros(n, dtype=torch.int64, device=x.device)
            packed = pack_bits_device(symbols, self.bits)
        dtype = torch.uint8 if self.bits <= 8 else torch.int32
        return Body(
            pieces=[packed],
            paper_bits=float(self.bits * n),
            streams=lambda: (symbols.to(dtype),),
        )

    def _decode_device(
        self, body: torch.Tensor, header: Header, side: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`_decode_flat` on the device: ``f32(k) * delta``; the flag checks the padding
        bits and the size."""
        n = header.numel
        step = torch.full((1,), self.delta32, dtype=torch.float32, device=body.device)
        if body.numel() != packed_bytes(n, self.bits):
            zeros = torch.zeros(n, dtype=torch.float32, device=body.device)
            return zeros, false_flag(body.device)
        values, ok = twos_device_values(body, n, step, self.bits, 0)
        return fit_dtype_device(values, header.dtype), ok

    def expected_body_bits(self, x: torch.Tensor) -> int | None:
        return packed_symbol_bits(x.numel(), 2**self.bits, self.packing)

    def min_body_bits(self, header: Header) -> int:
        return symbols_floor_bits(header.numel, 2**self.bits, self.packing)
