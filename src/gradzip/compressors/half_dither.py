"""Half-dithered quantization ``Q(x + u)``: the dither is the sender's own, never subtracted
(spec 1.1)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from gradzip.codecs.symbols import Packing, check_packing
from gradzip.compressors._device_scaled import (
    affine_device_values,
    clamp_to_dtype_device,
    dithered_device_body,
)
from gradzip.compressors._scaled_body import (
    check_scales,
    check_symbols,
    clamp_to_dtype_,
    device_packed,
    device_unpacked,
    fused_scaled_body,
    read_scales,
    scaled_symbols_bits,
    scaled_symbols_body,
    scaled_symbols_floor_bits,
)
from gradzip.compressors.base import Body, Compressor, ParamValue, body_tensor
from gradzip.compressors.buckets import (
    DEFAULT_BUCKET_SIZE,
    bucket_absmax,
    check_bucket_size,
    num_buckets,
)
from gradzip.compressors.dqsg import FLOAT32_LIMIT, rounded_bound
from gradzip.compressors.registry import register
from gradzip.kernels.backend import use_torch_ops
from gradzip.kernels.device_buckets import scales_device
from gradzip.kernels.dithered import fused_decode_affine
from gradzip.kernels.dithered_device import decode_affine_device, encode_symbols_device
from gradzip.kernels.philox import LOCAL_UNIFORM
from gradzip.keys import StreamKey
from gradzip.payload import Header
from gradzip.rng import derive_seed


@register
class HalfDither(Compressor):
    """Half-dithered quantizer ``g_hat = sigma * Q_{1/M}(g/sigma + u)``, dither not subtracted.

    Per bucket, ``sigma = max|g_B|`` and ``y = g_B/sigma``; the dither in grid units is
    ``w = sum_{j<k} (u_j - 1/2)`` with ``k = dither_sum`` iid uniforms from the sender's *local*
    stream (the receiver never needs them), and the index is ``q = floor(M*y + w + 1/2)``.

    * ``dither_sum=1`` (uniform dither): by Lemma 2 this *is* the stochastic (QSGD/TernGrad)
      quantizer with ``2M+1`` levels: ``P(q = l+1) = M*y - l`` for ``M*y`` in ``[l, l+1]``.
      Unbiased, variance ``(|y| - l/M)*((l+1)/M - |y|) <= 1/(4M^2)`` per coordinate (in units of
      ``sigma^2``), which depends on ``y``.
    * ``dither_sum=k >= 2`` (``k=2``: triangular): the first ``k`` moments of
      ``eps = Q(x+u) - x`` do not depend on ``x``; ``E[eps] = 0`` and
      ``E[eps^2] = (k+1)*Delta^2/12`` for every ``x`` [SEED-R], e.g. ``Delta^2/4`` for ``k=2``.

    Alphabet [CHOICE]: ``|M*y + w| < M + k/2``, so ``q`` lies in ``{-(M+h)..M+h}`` with
    ``h = floor(k/2)``; the alphabet has ``L = 2*(M+h)+1`` symbols (``q + M + h``) and nothing
    overloads (``L = 2M+1`` for ``k = 1``, ``2M+3`` for ``k = 2, 3``). Reconstructions may
    exceed ``sigma`` by up to ``h*sigma/M``.

    Bits: ``32*#buckets + n*ceil(log2 L)`` on the wire (fixed packing), ``32*#buckets +
    n*log2 L`` paper bits.

    Parameters:
        M: levels per sign (``Delta = 1/M``); larger M: less error, more bits.
        bucket_size: elements per float32 scale; default 512 entries
            (``buckets.DEFAULT_BUCKET_SIZE``, [CHOICE]: the paper's one scale per tensor is
            ``bucket_size=None``); smaller buckets lower
            the error for 32 bits each.
        dither_sum: ``k`` uniforms summed per dither. ``k >= 2`` makes the error's moments
            signal-independent at the price of a larger variance (``(k+1)/12`` vs at most
            ``1/4`` grid units squared) and a larger alphabet.
        packing: ``"fixed"``, ``"dense"`` or ``"entropy"`` symbol packing.

    Device resident (:attr:`device_resident`) with ``packing="fixed"`` (every ``M``, bucket
    size and ``dither_sum``): a CUDA gradient is encoded and decoded where it lives, byte for
    byte the host path's payload (see :mod:`gradzip.device`). ``"dense"`` and ``"entropy"``
    pack on the host [CHOICE: their coders are sequential].

    References: Abdi & Fekri, "Nested Dithered Quantization for Communication Reduction in
    Distributed Training" (ICLR 2019 submission), Section 2 and Lemma 2; Gray & Stockham,
    "Dithered quantizers" (IEEE Trans. Inf. Theory 1993) for the moments of half dithering.
    """

    computes_on_device = True
    checks_finite_output = True  # see _decode_flat

    name = "half_dither"
    codec_id = 11
    example_params: ClassVar[dict[str, Any]] = {"M": 1, "dither_sum": 2}

    def __init__(
        self,
        M: int = 1,
        bucket_size: int | None = DEFAULT_BUCKET_SIZE,
        dither_sum: int = 1,
        packing: Packing = "fixed",
    ) -> None:
        if isinstance(M, bool) or not isinstance(M, int) or not 1 <= M <= 2**20:
            raise ValueError(f"M must be an int in [1, 2**20], got {M!r}")
        if (
            isinstance(dither_sum, bool)
            or not isinstance(dither_sum, int)
            or not 1 <= dither_sum <= 16
        ):
            raise ValueError(f"dither_sum must be an int in [1, 16], got {dither_sum!r}")
        self.M = M
        self._bucket_size = check_bucket_size(bucket_size)
        self.dither_sum = dither_sum
        self.packing = check_packing(packing)

    @property
    def bucket_size(self) -> int:
        return self._bucket_size

    @property
    def device_resident(self) -> bool:  # type: ignore[override]
        """Whether a gradient on a device is coded there: with the fixed packing only (the
        dense and entropy packings are coded on the host)."""
        return self.packing == "fixed"

    @property
    def half_range(self) -> int:
        """Largest ``|q|``: ``M + floor(dither_sum/2)``."""
        return self.M + self.dither_sum // 2

    @property
    def alphabet(self) -> int:
        """Number of symbols, ``2*(M + floor(k/2)) + 1``."""
        return 2 * self.half_range + 1

    def wire_params(self) -> dict[str, ParamValue]:
        return {"M": self.M, "dither_sum": self.dither_sum, "packing": self.packing}

    def expected_body_bits(self, x: torch.Tensor) -> int | None:
        return scaled_symbols_bits(x.numel(), self._bucket_size, self.alphabet, self.packing)

    def min_body_bits(self, header: Header) -> int:
        n = header.numel
        return scaled_symbols_floor_bits(n, self._bucket_size, self.alphabet, self.packing)

    def _encode_args(self, key: StreamKey) -> dict[str, Any]:
        """``q + M + h = floor(M*y + sum_j u_j - k/2 + 1/2 + M + h)``.

        The argument is ``>= h - k/2 + 1/2 >= 0``, so a truncating cast is its floor. Float32
        (then clamped, spec 0.3) for ``k <= 2`` (a sum of two uniforms is exact in float32) and
        byte-sized alphabets, per bucket while ``M/sigma`` fits float32; float64 otherwise (see
        :mod:`gradzip.kernels.dithered`). Uniform ``j`` of element ``i`` is element ``i + j*n``
        of the local stream.
        """
        k = self.dither_sum
        return {
            "numer": float(self.M),
            "seed": derive_seed(key, domain="local"),
            "stream": LOCAL_UNIFORM,
            "nsum": k,
            "c": self.half_range - k / 2 + 0.5,
            "top": self.alphabet - 1,
            "modk": 0,
            "fast_ok": k <= 2 and self.alphabet <= 256,
        }

    def _encode_flat(
        self, x: torch.Tensor, key: StreamKey, absmax: float, shape: tuple[int, ...]
    ) -> Body:
        n, bs = x.numel(), self._bucket_size
        if self.packing == "fixed" and not use_torch_ops(x):
            given = torch.tensor([absmax], dtype=torch.float32) if num_buckets(n, bs) == 1 else None
            args = self._encode_args(key)
            return fused_scaled_body(x, given, bs, self.alphabet, args, self.non_finite_input)
        scales = bucket_absmax(x, bs, absmax)
        symbols = encode_symbols_device(x, scales, bs, **self._encode_args(key))
        packed = device_packed(symbols, self.alphabet, self.packing)
        return scaled_symbols_body(scales, symbols, self.alphabet, self.packing, packed)

    def _encode_device(self, x: torch.Tensor, key: StreamKey, shape: tuple[int, ...]) -> Body:
        """The fixed-packed body on ``x``'s device: the fused kernel's bytes."""
        scales = scales_device(x, self._bucket_size)
        args = self._encode_args(key)
        finite = torch.isfinite(scales).all()
        return dithered_device_body(x, scales, self._bucket_size, args, self.alphabet, finite)

    def _decode_device(
        self, body: torch.Tensor, header: Header, side: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        affine = self._affine_args(body)[1:]  # all but the scales, which are read from the body
        out, ok = affine_device_values(body, header.numel, self.alphabet, affine)
        return clamp_to_dtype_device(out, header.dtype), ok

    def _decode_flat(
        self, body: memoryview, header: Header, side: torch.Tensor | None
    ) -> torch.Tensor:
        """``g_hat = (symbol + (-(M + h))) * f32(sigma/M)`` in float32; zero buckets give +0.0.
        Finite: ``|symbol - (M + h)| <= M + h`` exactly (small integers), so ``|g_hat|`` stays
        within :func:`~gradzip.compressors.dqsg.rounded_bound` of ``sigma*(M + h)/M``, and the
        clamp to the dtype acts where that bound reaches float32's limit."""
        n, bs = header.numel, self._bucket_size
        scales, rest = read_scales(body, num_buckets(n, bs))
        check_scales(scales, self.name)
        args = self._affine_args(scales)
        if self.packing == "fixed" and not use_torch_ops():
            out = fused_decode_affine(body_tensor(rest), n, self.alphabet, *args, self.name)
        else:
            symbols = device_unpacked(body_tensor(rest), n, self.alphabet, self.packing)
            check_symbols(symbols, self.alphabet, self.name)
            out = decode_affine_device(symbols, *args)
        clamp_to_dtype_(out, header.dtype, self._reach(scales))
        return out

    def _decode_add_flat(
        self, body: memoryview, header: Header, side: torch.Tensor | None, out: torch.Tensor
    ) -> bool:
        """Fixed packing on the CPU: ``out + g_hat`` in the decoding pass (alphabet checked
        first, see :func:`gradzip.kernels.dithered.fused_decode_affine`); otherwise, or where
        the clamp may act, decode and add."""
        if self.packing != "fixed" or use_torch_ops():
            return False
        n, bs = header.numel, self._bucket_size
        scales, rest = read_scales(body, num_buckets(n, bs))
        check_scales(scales, self.name)
        if not self._reach(scales) < FLOAT32_LIMIT:
            return False
        args = self._affine_args(scales)
        fused_decode_affine(body_tensor(rest), n, self.alphabet, *args, self.name, out=out)
        return True

    def _reach(self, scales: torch.Tensor) -> float:
        return rounded_bound(float(scales.max()) * self.half_range / self.M)

    def _affine_args(
        self, scales: torch.Tensor
    ) -> tuple[torch.Tensor, int, float, float, bool, int, int, bool]:
        bs = self._bucket_size
        return (scales, bs, float(self.M), float(-self.half_range), False, 0, LOCAL_UNIFORM, False)
