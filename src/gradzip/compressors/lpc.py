"""LPC-SVRG's low-precision representation with clipping: b bits, step theta*||u||_inf/s."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch

from gradzip.codecs.symbols import Packing, check_packing, packed_symbol_bits, symbol_bits
from gradzip.compressors._device_stochastic import (
    false_flag,
    fit_dtype_device,
    scales_ok,
    split_scales,
    symmetric_device_body,
    symmetric_device_values,
)
from gradzip.compressors._scaled_body import check_scales, read_scales, symbols_floor_bits
from gradzip.compressors._scaled_stochastic import (
    finite_by_bound,
    finite_values_bound,
    fit_dtype_,
    stochastic_symbols,
    symmetric_body,
    symmetric_values,
)
from gradzip.compressors.base import Body, Compressor, body_tensor
from gradzip.compressors.grid import CommonGrid, SymmetricGrid
from gradzip.compressors.registry import register
from gradzip.kernels.backend import use_torch_ops
from gradzip.kernels.device_division import divided
from gradzip.kernels.stochastic import fused_symmetric_decode
from gradzip.keys import StreamKey
from gradzip.payload import Header
from gradzip.rng import derive_seed

_SMALLEST_SUBNORMAL = float(torch.finfo(torch.float32).smallest_normal) * 2.0**-23
#: widest code: codes ``< 2^24`` stay exact integers in the float32 decoder (see :class:`LPC`)
MAX_BITS = 24
#: widest code the "dense" and "entropy" packings take (alphabets up to ``2^16``)
MAX_CODED_BITS = 16


@register
class LPC(Compressor):
    """LPC: ``Q_(delta,b)`` on the codebook ``{-s..s}*delta``, ``delta = theta*||u||_inf/s``.

    ``s = 2^(b-1) - 1`` positive levels (the paper's "quantization levels": 7 levels is
    ``b = 4``, the default; 3 levels is ``b = 3``). Inside the hull ``|u_i| <= s*delta`` a value
    is rounded stochastically to its two neighbours (unbiased, local randomness); outside it is
    projected to ``sign(u_i)*s*delta`` ("the gradient clipping"). Codes are ``index + s`` in
    ``b`` bits. [SEED-R: codebook, scale (eq. 3) and clipping are pinned down by the seed's
    lemmas; spec 3.2.]

    Bits: ``b*d + 32`` (float32 ``delta`` then the codes, ``packing="fixed"``);
    ``paper_bits = d*log2(2s+1) + 32``. A zero vector sends ``delta = 0`` and decodes to zeros.

    Width ``b`` in ``[2, 24]`` [CHOICE]. ``b = 24`` is the spec's "32-bit-like precision"
    (spec 3.7): a level then has the resolution of a float32 mantissa. The limit is where the
    arithmetic stays exact: levels are formed in float64 (spec 0.3) and codes up to
    ``2^24 - 2`` are integers a float32 holds exactly, so the decoder's ``(code - s) * delta``
    is one float32 rounding; the stochastic rounding's uniforms are the midpoints of ``2^16``
    equal cells (spec 0.4), so its bias is at most ``2^-17`` of a level. ``packing="dense"`` and ``"entropy"`` handle alphabets
    up to ``2^16``, i.e. ``b <= 16``; wider codes travel at fixed width.

    Variance: inside the hull ``E(Q(v) - v)^2 = (v - a)(a + delta - v) <= delta^2/4`` (Lemma 3);
    ``E||Q(u) - u||^2 <= [(d - kc) theta^2/(4 s^2) + kc (1 - theta)^2] ||u||_inf^2`` with
    ``kc = #{i : |u_i| > theta ||u||_inf}`` (Lemma 4). ``theta = 1`` is unbiased (the
    QSGD/TernGrad special case; TernGrad is ``b = 2``); ``theta < 1`` shrinks the in-range error
    by ``theta^2`` but biases the ``kc`` clipped coordinates.

    Device resident (:attr:`device_resident`) with ``packing="fixed"`` (the default), every
    ``b`` and ``theta``: a CUDA gradient is encoded into a device payload and decoded there,
    with nothing read back (:mod:`gradzip.compressors._device_stochastic`); the dense and
    entropy packings (sequential host coders) take the host path.

    References: Yu, Wu and Huang, "Exploring Fast and Communication-Efficient Algorithms in
    Large-scale Distributed Networks" (LPC-SVRG), AISTATS 2019; spec section 3.2.
    """

    name = "lpc"
    codec_id = 16
    checks_finite_output = True  # see gradzip.compressors._scaled_stochastic.finite_by_bound
    example_params: ClassVar[dict[str, Any]] = {}

    def __init__(self, b: int = 4, theta: float = 1.0, packing: Packing = "fixed") -> None:
        if isinstance(b, bool) or not isinstance(b, int) or not 2 <= b <= MAX_BITS:
            raise ValueError(f"lpc: b must be an int in [2, {MAX_BITS}], got {b!r}")
        theta = float(theta)
        if not 0.0 < theta <= 1.0:
            raise ValueError(f"lpc: theta must lie in (0, 1], got {theta}")
        self.packing = check_packing(packing)
        if packing != "fixed" and b > MAX_CODED_BITS:
            raise ValueError(
                f"lpc: packing={packing!r} codes alphabets of up to 2^{MAX_CODED_BITS} symbols, "
                f"so b <= {MAX_CODED_BITS}; b = {b} needs packing='fixed'"
            )
        self.b = b
        self.s = 2 ** (b - 1) - 1
        self.theta = theta

    def wire_params(self) -> dict[str, int | float | bool | str]:
        return {"b": self.b, "theta": self.theta, "packing": self.packing}

    def delta(self, absmax: float) -> float:
        """The float32 step ``theta*||u||_inf/s`` (rounded once from float64).

        A positive ``||u||_inf`` whose step underflows float32 gets the smallest subnormal, so a
        non-zero vector never sends ``delta = 0``.
        """
        # abs: +0.0 for a zero vector (the caller's max of an aminmax may be -0.0), so the bytes
        # do not depend on how a reduction signs its zeros (the device path sends +0.0)
        absmax = abs(absmax)
        d32 = float(torch.tensor(self.theta * absmax / self.s, dtype=torch.float32))
        return _SMALLEST_SUBNORMAL if absmax > 0 and d32 == 0 else d32

    def _encode_flat(
        self, x: torch.Tensor, key: StreamKey, absmax: float, shape: tuple[int, ...]
    ) -> Body:
        delta = torch.tensor([self.delta(absmax)], dtype=torch.float32)
        # the step is delta itself (per = 1); clamping the level to s after stochastic rounding
        # is exactly the projection outside the hull: |u|/delta >= s gives
        # floor(|u|/delta + u01) >= s
        _, symbols, packed = symmetric_body(
            x, delta, 1, self.s, key, 0, self.packing, may_overload=self.theta < 1
        )
        paper = x.numel() * math.log2(2 * self.s + 1) + 32
        return Body(
            pieces=[delta, packed],
            paper_bits=paper,
            streams=(symbols,),
            side_bits=32,
        )

    def _decode_flat(
        self, body: memoryview, header: Header, side: torch.Tensor | None
    ) -> torch.Tensor:
        delta, rest = read_scales(body, 1)
        check_scales(delta, f"{self.name} delta")
        values = symmetric_values(
            body_tensor(rest), header.numel, delta, self.s, 0, self.packing, self.name
        )
        return fit_dtype_(finite_by_bound(values, delta, self.s, self.name), header.dtype)

    @property
    def device_resident(self) -> bool:  # type: ignore[override]
        """The fixed packing encodes and decodes on the gradient's device; the dense and
        entropy packings are host coders."""
        return self.packing == "fixed"

    def _encode_device(self, x: torch.Tensor, key: StreamKey, shape: tuple[int, ...]) -> Body:
        """:meth:`_encode_flat` on the device: :meth:`delta` as the host computes it (float64
        ``theta * absmax / s`` by a true division, rounded once), the same symbols and bytes."""
        absmax = x.abs().amax()
        d32 = divided(absmax.to(torch.float64) * self.theta, float(self.s)).to(torch.float32)
        tiny = torch.full_like(d32, _SMALLEST_SUBNORMAL)
        delta = torch.where((absmax > 0) & (d32 == 0), tiny, d32).reshape(1)
        seed = derive_seed(key, domain="local")
        finite = torch.isfinite(absmax)
        return symmetric_device_body(x, delta, 1, self.s, seed, 0, self.theta < 1, finite)

    def _decode_device(
        self, body: torch.Tensor, header: Header, side: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`_decode_flat` on the device: ``f32(symbol - s) * delta``; the flag checks
        ``delta``, the alphabet, the padding bits and the size."""
        n = header.numel
        delta, packed, exact = split_scales(body, n, 0, symbol_bits(2 * self.s + 1))
        values, ok = symmetric_device_values(packed, n, delta, self.s, 0)
        ok = ok & scales_ok(delta) if exact else false_flag(body.device)
        return fit_dtype_device(values, header.dtype), ok

    def _decode_add_flat(
        self, body: memoryview, header: Header, side: torch.Tensor | None, out: torch.Tensor
    ) -> bool:
        """Fixed packing: ``out + f32(symbol - s) * delta`` in the decoding pass (alphabet
        checked first), where :func:`finite_values_bound` proves the values finite."""
        if self.packing != "fixed" or use_torch_ops():
            return False
        delta, rest = read_scales(body, 1)
        check_scales(delta, f"{self.name} delta")
        if not finite_values_bound(delta, self.s):
            return False
        bits = symbol_bits(2 * self.s + 1)
        fused_symmetric_decode(
            body_tensor(rest), header.numel, bits, delta, 0, self.s, self.name, out
        )
        return True

    # -- common grid (integer-sum schemes: LPC schemes (b) and (c), spec 3.3) -----------------
    def common_grid(self) -> CommonGrid:
        return self

    def grid_levels(self) -> int:
        return int(self.s)

    def grid_bucket_size(self, n: int) -> int:
        return 0

    def grid_statistic(self, x: torch.Tensor) -> torch.Tensor:
        """``||u||_inf``: the common step is ``theta * max_alpha ||u_alpha||_inf / s``."""
        return torch.tensor([float(x.abs().max()) if x.numel() else 0.0], dtype=torch.float32)

    def grid_symbols(self, x: torch.Tensor, scales: torch.Tensor, key: StreamKey) -> torch.Tensor:
        delta = torch.tensor([self.delta(float(scales[0]))], dtype=torch.float32)
        return stochastic_symbols(x, delta, 1, self.s, key, 0, may_overload=self.theta < 1)

    def grid_steps(self, scales: torch.Tensor) -> torch.Tensor:
        return torch.tensor([self.delta(float(scales[0]))], dtype=torch.float64)

    def grid_prepare(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def grid_offsets(self, key: StreamKey, n: int) -> torch.Tensor | None:
        return None

    def grid_symmetric(self) -> SymmetricGrid | None:
        return None  # its own statistic and symbols: quantized tensor by tensor

    def grid_offset_seed(self, key: StreamKey) -> int | None:
        return None

    def expected_body_bits(self, x: torch.Tensor) -> int | None:
        bits = packed_symbol_bits(x.numel(), 2 * self.s + 1, self.packing)
        return None if bits is None else 32 + bits

    def min_body_bits(self, header: Header) -> int:
        return 32 + symbols_floor_bits(header.numel, 2 * self.s + 1, self.packing)
