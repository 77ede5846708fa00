"""QSGD: stochastic quantization to ``s`` levels per sign, with optional Elias coding."""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

import torch

from gradzip.choices import check_choice, choices_of
from gradzip.codecs import elias
from gradzip.codecs.symbols import Packing
from gradzip.compressors._scaled_body import check_scales, read_scales
from gradzip.compressors._scaled_stochastic import (
    FLOAT32_MAX,
    ScaledStochastic,
    decoder_steps,
    finite_by_bound,
    fit_dtype_,
    stochastic_symbols,
    symbol_dtype,
    symbols_to_values,
)
from gradzip.compressors.base import Body, body_tensor
from gradzip.compressors.buckets import DEFAULT_BUCKET_SIZE, num_buckets
from gradzip.compressors.registry import register
from gradzip.errors import CorruptPayloadError, TruncatedPayloadError
from gradzip.keys import StreamKey
from gradzip.payload import Header

#: the norm that scales QSGD's levels: the bucket's max-abs, or its l2 norm (the paper)
Norm = Literal["max", "l2"]
NORMS: tuple[Norm, ...] = choices_of(Norm)
#: how QSGD's levels travel: packed symbols, or the paper's Elias-coded runs
QsgdCoding = Literal["symbols", "elias"]
CODINGS: tuple[QsgdCoding, ...] = choices_of(QsgdCoding)


@register
class QSGD(ScaledStochastic):
    """QSGD: unbiased stochastic rounding of ``|g_i|/scale`` to ``s`` levels, per bucket.

    Per bucket ``B`` with ``scale = ||g_B||_inf`` (``norm="max"``, the seed's QSG, [CODE]) or
    ``||g_B||_2`` (``norm="l2"``, Alistarh et al.): level ``l_i = floor(s|g_i|/scale + u_i)``
    with ``u_i ~ U[0,1)`` local randomness (spec 1.1), symbol ``l_i*sign(g_i) + s``.
    Decode ``g_hat_i = sign * l_i * scale / s``.

    Bits (``coding="symbols"``): ``32*#buckets`` plus the packed symbols of an alphabet of
    ``2s+1`` (``n*ceil(log2(2s+1))`` for ``packing="fixed"``); ``paper_bits =
    n*log2(2s+1) + 32*#buckets`` (spec 0.5; ``s = 1`` equals DQSG ``M = 1``).
    ``coding="elias"`` (QSGD's sparse code, [CHOICE] on the exact layout): the float32 scales, a
    uint64 count of non-zero levels, then per non-zero coordinate, in index order, the Elias-delta
    code of its gap (index minus the previous non-zero index; the first gap is index + 1), one
    sign bit (1 = negative) and the Elias-gamma code of its level ``1..s``, padded to a byte:
    ``32*#buckets + 64 + 8*ceil(sum_i (delta_bits(gap_i) + 1 + gamma_bits(l_i)) / 8)``. Its size
    depends on the random levels, so ``expected_body_bits`` is None for it (see
    :meth:`elias_body_bits`); ``paper_bits`` is the Elias bits plus ``32*#buckets``.

    Variance: unbiased, per coordinate ``(|y| - l/s)((l+1)/s - |y|) * scale^2 <= scale^2/(4s^2)``
    with ``y = g_i/scale``; in total ``<= min(n/s^2, sqrt(n)/s) ||g||_2^2`` for the l2 norm.
    Default bucket: 512 entries (``buckets.DEFAULT_BUCKET_SIZE``, [CHOICE], as QSGD's own code);
    ``bucket_size=None`` gives the per-tensor scale.

    Trade-offs: larger ``s`` lowers the variance by ``s^2`` for ``log2`` more bits; smaller buckets
    cost 32 bits each but tighten the scale; ``"l2"`` with Elias coding and small ``s`` is the
    sparse regime of the QSGD paper, ``"max"`` has lower variance at equal ``s``.

    Device resident (:attr:`device_resident`) with ``norm="max"``, ``coding="symbols"`` and
    ``packing="fixed"`` (the default): a CUDA gradient is encoded into a device payload and
    decoded there, with nothing read back (:mod:`gradzip.compressors._device_stochastic`).
    ``norm="l2"`` (a float64 sum whose rounding depends on the reduction order, [CHOICE]),
    ``coding="elias"`` and the dense and entropy packings (sequential host coders) take the
    host path.

    References: Alistarh et al., "QSGD: Communication-Efficient SGD via Gradient Quantization and
    Encoding", NeurIPS 2017; spec sections 1.1 and 1.9.
    """

    name = "qsgd"
    codec_id = 13
    example_params: ClassVar[dict[str, Any]] = {"s": 1}

    def __init__(
        self,
        s: int = 1,
        bucket_size: int | None = DEFAULT_BUCKET_SIZE,
        norm: Norm = "max",
        packing: Packing = "fixed",
        coding: QsgdCoding = "symbols",
    ) -> None:
        super().__init__(s, bucket_size, packing)
        check_choice("norm", norm, NORMS, "qsgd")
        check_choice("coding", coding, CODINGS, "qsgd")
        self.norm = norm
        self.coding = coding

    def wire_params(self) -> dict[str, int | float | bool | str]:
        return {"s": self.s, "norm": self.norm, "packing": self.packing, "coding": self.coding}

    def _scales(self, x: torch.Tensor, absmax: float | None) -> torch.Tensor:
        if self.norm == "max":
            return super()._scales(x, absmax)
        n, bs = x.numel(), self._bucket
        nb = num_buckets(n, bs)
        if nb == 1:
            norms = torch.linalg.vector_norm(x, dtype=torch.float64).view(1)
        else:
            full = n // bs
            norms = torch.linalg.vector_norm(
                x[: full * bs].view(full, bs), dim=1, dtype=torch.float64
            )
            if full < nb:
                tail = torch.linalg.vector_norm(x[full * bs :], dtype=torch.float64).view(1)
                norms = torch.cat((norms, tail))
        # the float64 norm is >= every |x_i| (float32), so rounding to float32 keeps it >= them
        scales: torch.Tensor = norms.clamp_(max=FLOAT32_MAX).to(torch.float32)
        return scales

    def _device_configuration(self) -> bool:
        # [CHOICE] the l2 norm is a float64 sum whose order differs between a device's
        # reduction and the CPU's, so its scale may differ in the last bit: kept on the host
        return self.coding == "symbols" and self.norm == "max"

    def _max_abs_scales(self) -> bool:
        return self.norm == "max"

    def _scans_in_kernel(self, x: torch.Tensor) -> bool:
        return self.coding == "symbols" and super()._scans_in_kernel(x)

    def _encode_flat(
        self, x: torch.Tensor, key: StreamKey, absmax: float, shape: tuple[int, ...]
    ) -> Body:
        if self.coding == "symbols":
            return super()._encode_flat(x, key, absmax, shape)
        scales = self._scales(x, absmax)
        symbols = stochastic_symbols(x, scales, self.s, self.s, key, self._bucket).cpu()
        stream, bits = self._elias_stream(symbols)
        count = int(stream[0])
        side = 32 * scales.numel()
        header = torch.tensor([count], dtype=torch.int64)
        return Body(
            pieces=[scales, header, stream[1]],
            paper_bits=bits + side,
            streams=(symbols,),
            side_bits=side,
        )

    def _elias_stream(self, symbols: torch.Tensor) -> tuple[tuple[int, torch.Tensor], int]:
        """((count, Elias bytes), Elias bits) of the non-zero levels in ``symbols``."""
        signed = symbols.to(torch.int64) - self.s
        idx = torch.nonzero(signed).view(-1)
        gaps = torch.diff(idx, prepend=torch.tensor([-1]))
        vals = signed[idx]
        columns = [("delta", gaps), ("bit", (vals < 0).to(torch.int64)), ("gamma", vals.abs())]
        return (idx.numel(), elias.encode_records(columns)), elias.record_bits(columns)

    def elias_body_bits(self, symbols: torch.Tensor, numel: int) -> int:
        """Body bits of ``coding="elias"`` for the given symbols (the documented formula)."""
        _, bits = self._elias_stream(symbols)
        return 32 * num_buckets(numel, self._bucket) + 64 + 8 * math.ceil(bits / 8)

    def _decode_flat(
        self, body: memoryview, header: Header, side: torch.Tensor | None
    ) -> torch.Tensor:
        if self.coding == "symbols":
            return super()._decode_flat(body, header, side)
        n = header.numel
        scales, rest = read_scales(body, num_buckets(n, self._bucket))
        check_scales(scales, self.name)
        if len(rest) < 8:
            raise TruncatedPayloadError("qsgd elias body ends inside its count of non-zeros")
        count = int.from_bytes(bytes(rest[:8]), "little")
        if count > n:
            raise CorruptPayloadError(f"qsgd elias body claims {count} non-zeros in {n} values")
        gaps, neg, levels = elias.decode_records(
            body_tensor(rest[8:]), count, ("delta", "bit", "gamma")
        )
        if count and (int(gaps.max()) > n or int(levels.max()) > self.s):
            raise CorruptPayloadError("qsgd elias body has a gap or a level out of range")
        idx = torch.cumsum(gaps, 0) - 1
        if count and int(idx[-1]) >= n:
            raise CorruptPayloadError(f"qsgd elias body indexes past the {n} values")
        symbols = torch.full((n,), self.s, dtype=symbol_dtype(self.s))
        symbols[idx] = (torch.where(neg.bool(), -levels, levels) + self.s).to(symbols.dtype)
        mults = decoder_steps(scales, self.s)
        values = symbols_to_values(symbols, mults, self.s, self._bucket)
        return fit_dtype_(finite_by_bound(values, mults, self.s, self.name), header.dtype)

    def expected_body_bits(self, x: torch.Tensor) -> int | None:
        if self.coding == "elias":
            return None
        return super().expected_body_bits(x)

    def min_body_bits(self, header: Header) -> int:
        if self.coding == "elias":  # the scales and the count of non-zeros
            return 32 * num_buckets(header.numel, self._bucket) + 64
        return super().min_body_bits(header)
