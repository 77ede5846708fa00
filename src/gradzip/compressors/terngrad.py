"""TernGrad: stochastic ternary quantization (QSGD with one level), optional clipping."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from gradzip.codecs.symbols import Packing
from gradzip.compressors._scaled_stochastic import ScaledStochastic
from gradzip.compressors.base import Body
from gradzip.compressors.buckets import DEFAULT_BUCKET_SIZE, clip_to_std
from gradzip.compressors.registry import register
from gradzip.keys import StreamKey


@register
class TernGrad(ScaledStochastic):
    """TernGrad: ``g_hat_i = scale * sign(g_i) * b_i`` with ``b_i ~ Bern(|g_i|/scale)``.

    This is the stochastic quantizer of spec 1.1 with ``M = 1`` (QSG with one level): per bucket
    ``scale = ||g_B||_inf``, symbols ``{0, 1, 2}`` (level*sign + 1), local randomness from
    ``local_uniform(key, n)``.

    Bits: ``32*#buckets`` plus ``n`` ternary symbols (``2n`` bits with ``packing="fixed"``, about
    ``1.6n`` with ``"dense"``); ``paper_bits = n*log2(3) + 32*#buckets``, the same as DQSG and
    QSG with ``M = 1`` (seed 000, Table 1).

    Variance: unbiased (without clipping); per coordinate ``|g_i|(scale - |g_i|) <= scale^2/4``,
    in total ``<= scale*||g||_1 - ||g||_2^2``.

    Options (spec 1.9: TernGrad's own tricks are not in the seed, so both default off):

    * ``clip_sigma=c``: clip ``g`` to ``+-c*std(g)`` (population std over the whole tensor,
      computed in float64) before quantizing; Wen et al. use ``c = 2.5``. The DQSG authors'
      TernGrad (``quantizers/ternary_quantizer.py`` in their public code) does not clip, so
      the DQSG reproductions keep ``clip_sigma=None`` with one scale per tensor. Clipping makes the
      estimate biased for the clipped coordinates but shrinks the scale, hence the variance of
      the rest. A tensor with ``std == 0`` is not clipped [CHOICE].
    * max-scale sharing: every worker uses the same agreed scale (the maximum over workers of
      ``||g||_inf``), so that the ternary codes of all workers add up exactly; this is the
      common grid (:meth:`common_grid`) the integer-sum schemes use.

    Trade-offs: smaller buckets tighten the scale (lower variance) at 32 bits each. Default
    bucket: 512 entries (``buckets.DEFAULT_BUCKET_SIZE``, [CHOICE]; TernGrad's per-tensor scale
    is ``bucket_size=None``).

    Device resident (:attr:`device_resident`) without clipping and with ``packing="fixed"``
    (the default): a CUDA gradient is encoded into a device payload and decoded there, with
    nothing read back (:mod:`gradzip.compressors._device_stochastic`). ``clip_sigma`` (its
    float64 std depends on the reduction order, [CHOICE]) and the dense and entropy packings
    (sequential host coders) take the host path.

    References: Wen et al., "TernGrad: Ternary Gradients to Reduce Communication in Distributed
    Deep Learning", NeurIPS 2017; spec sections 1.1 and 1.9.
    """

    name = "terngrad"
    codec_id = 14
    example_params: ClassVar[dict[str, Any]] = {}

    def __init__(
        self,
        bucket_size: int | None = DEFAULT_BUCKET_SIZE,
        clip_sigma: float | None = None,
        packing: Packing = "fixed",
    ) -> None:
        super().__init__(1, bucket_size, packing)
        if clip_sigma is not None:
            clip_sigma = float(clip_sigma)
            if not clip_sigma > 0 or clip_sigma == float("inf"):
                raise ValueError(
                    f"terngrad: clip_sigma must be a finite float > 0, got {clip_sigma}"
                )
        self.clip_sigma = clip_sigma

    def wire_params(self) -> dict[str, int | float | bool | str]:
        # 0.0 stands for "no clipping" on the wire (clipping is the sender's business, but a
        # receiver configured differently is told so)
        return {"clip_sigma": self.clip_sigma or 0.0, "packing": self.packing}

    def _device_configuration(self) -> bool:
        # [CHOICE] clipping needs the float64 std, a sum whose order differs between a device's
        # reduction and the CPU's (its bound may differ in the last bit): kept on the host
        return self.clip_sigma is None

    def _scans_in_kernel(self, x: torch.Tensor) -> bool:
        return self.clip_sigma is None and super()._scans_in_kernel(x)

    def _encode_flat(
        self, x: torch.Tensor, key: StreamKey, absmax: float, shape: tuple[int, ...]
    ) -> Body:
        if self.clip_sigma is not None:
            x, absmax = clip_to_std(x, absmax, self.clip_sigma)
        return super()._encode_flat(x, key, absmax, shape)

    def grid_prepare(self, x: torch.Tensor) -> torch.Tensor:
        if self.clip_sigma is None or x.numel() == 0:
            return x
        return clip_to_std(x, float(x.abs().max()), self.clip_sigma)[0]
