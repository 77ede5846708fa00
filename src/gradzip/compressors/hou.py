"""Hou et al.'s b-bit max-norm stochastic quantizer (the compressor of DQGAN's experiments)."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch

from gradzip.codecs.symbols import Packing
from gradzip.compressors._device_scaled import read_scaled_device_body, scaled_device_body
from gradzip.compressors._scaled_stochastic import ScaledStochastic
from gradzip.compressors.base import Body
from gradzip.compressors.buckets import num_buckets
from gradzip.compressors.registry import register
from gradzip.kernels.dithered_device import (
    scales_device,
    symmetric_symbols_device,
    symmetric_values_device,
)
from gradzip.kernels.philox import LOCAL_UNIFORM
from gradzip.keys import StreamKey
from gradzip.payload import Header
from gradzip.rng import derive_seed


@register
class Hou(ScaledStochastic):
    """Hou et al.'s quantizer: QSGD with ``||v||_2`` replaced by ``||v||_inf``, ``b`` bits.

    ``Q(v)_i = ||v||_inf * sign(v_i) * xi_i`` with ``xi_i`` in ``{l/s, (l+1)/s}`` stochastically
    rounded from ``|v_i|/||v||_inf`` (local randomness), ``s = 2^(b-1) - 1`` (127 for the default
    ``b = 8``; [SEED-R]: symmetric, "the number of values b bits can represent"). One scale per
    tensor.

    Bits: ``32 + b*d`` with ``packing="fixed"`` (symbols ``level*sign + s`` in ``[0, 2^b - 2]``),
    a quarter of full precision for ``b = 8``; ``paper_bits = d*log2(2^b - 1) + 32``.

    Variance: unbiased; per coordinate ``||v||_inf^2 (a_i - l_i/s)((l_i+1)/s - a_i)`` with
    ``a_i = |v_i|/||v||_inf``; ``E||Q(v) - v||^2 <= omega ||v||^2`` with
    ``omega = min(d/(4 s^2), sqrt(d)/s)``.

    ``scaled=True`` [RECON, derived; spec 4.2] returns ``C(v) = Q(v)/(1 + omega)``, a
    delta-approximate compressor with ``delta = 1/(1 + omega)``:
    ``E||C(v) - v||^2 <= (1 - delta)||v||^2`` (biased). Default off, as in the experiments.
    Trade-offs: each extra bit halves the step (variance / 4) for ``d`` more bits.

    Device resident (:attr:`device_resident`) with ``packing="fixed"`` (every ``b``, scaled or
    not): a CUDA gradient is encoded and decoded where it lives, byte for byte the host path's
    payload (see :mod:`gradzip.device`). ``"dense"`` and ``"entropy"`` pack on the host
    [CHOICE: their coders are sequential].

    References: Hou et al., "Analysis of Quantized Models", ICLR 2019; Karimireddy et al.,
    "Error Feedback Fixes SignSGD", ICML 2019; spec section 4.2.
    """

    name = "hou"
    codec_id = 15
    example_params: ClassVar[dict[str, Any]] = {}

    def __init__(self, b: int = 8, scaled: bool = False, packing: Packing = "fixed") -> None:
        if isinstance(b, bool) or not isinstance(b, int) or not 2 <= b <= 16:
            raise ValueError(f"hou: b must be an int in [2, 16], got {b!r}")
        super().__init__(2 ** (b - 1) - 1, None, packing)
        self.b = b
        self.scaled = bool(scaled)

    @property
    def device_resident(self) -> bool:  # type: ignore[override]
        """Whether a gradient on a device is coded there: with the fixed packing only (the
        dense and entropy packings are coded on the host)."""
        return self.packing == "fixed"

    def _encode_device(self, x: torch.Tensor, key: StreamKey, shape: tuple[int, ...]) -> Body:
        """The fixed-packed body on ``x``'s device: the fused kernel's bytes (the scale
        ``max|x|``, the stochastic rounding of :func:`~gradzip.compressors._scaled_stochastic.
        stochastic_symbols`)."""
        scales = scales_device(x, self._bucket)
        seed = derive_seed(key, domain="local")
        symbols = symmetric_symbols_device(
            x, scales, self._bucket, self.s, self.s, seed, LOCAL_UNIFORM
        )
        return scaled_device_body(scales, symbols, self.alphabet, torch.isfinite(scales).all())

    def _decode_device(
        self, body: torch.Tensor, header: Header, side: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``f32(symbol - s) * mult`` with the host's multipliers (``f32(scale / s)``, times
        ``1/(1 + omega)`` in float64 when scaled), clamped to a half dtype's range as
        :func:`~gradzip.compressors._scaled_stochastic.fit_dtype_`; the base checks the
        values finite (where the host's bound would not prove them so, they are not)."""
        n = header.numel
        scales, symbols, ok = read_scaled_device_body(
            body, n, num_buckets(n, self._bucket), self.alphabet
        )
        mults = (scales.to(torch.float64) / self.s).to(torch.float32)
        factor = self._decode_factor(n)
        if factor != 1.0:
            mults = (mults.to(torch.float64) * factor).to(torch.float32)
        values = symmetric_values_device(symbols, mults, self._bucket, self.s)
        if header.dtype in (torch.float16, torch.bfloat16):
            top = float(torch.finfo(header.dtype).max)
            values = values.clamp(-top, top)
        return values, ok

    def wire_params(self) -> dict[str, int | float | bool | str]:
        return {"b": self.b, "scaled": self.scaled, "packing": self.packing}

    def omega(self, d: int) -> float:
        """Variance factor ``min(d/(4 s^2), sqrt(d)/s)`` for a tensor of ``d`` elements."""
        return min(d / (4.0 * self.s**2), math.sqrt(d) / self.s)

    def _decode_factor(self, numel: int) -> float:
        return 1.0 / (1.0 + self.omega(numel)) if self.scaled else 1.0

    def contraction_delta(self, d: int) -> float | None:
        """In expectation over the stochastic rounding: ``delta = 1/(1 + omega)`` when
        ``scaled`` [RECON, derived; spec 4.2]; unscaled, ``E||Q(x) - x||^2 <= omega ||x||^2``
        gives ``delta = 1 - omega`` when ``omega < 1`` (small tensors or many bits) and None
        otherwise [RECON, derived]: the seed's Theorem 2 constant for that case is lost."""
        omega = self.omega(d)
        if self.scaled:
            return 1.0 / (1.0 + omega)
        return 1.0 - omega if omega < 1 else None
