"""Hou et al.'s b-bit max-norm stochastic quantizer (the compressor of DQGAN's experiments)."""

from __future__ import annotations

import math
from typing import Any, ClassVar

from gradzip.codecs.symbols import Packing
from gradzip.compressors._scaled_stochastic import ScaledStochastic
from gradzip.compressors.registry import register


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

    def _device_configuration(self) -> bool:
        """Every ``b``, scaled or not: max-abs scales (one bucket), the decode factor applied
        to the multipliers as on the host, so the generic device path of
        :class:`~gradzip.compressors._scaled_stochastic.ScaledStochastic` serves."""
        return True

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
