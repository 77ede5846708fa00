"""NDQSG: nested dithered quantization, decoded with the receiver's side information
(spec 1.5-1.8)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from gradzip.codecs.symbols import Packing, check_packing
from gradzip.compressors._decode_guards import check_finite_output
from gradzip.compressors._device_scaled import (
    clamp_to_dtype_device,
    dithered_device_body,
    read_scaled_device_body,
)
from gradzip.compressors._nested import (
    chebyshev_failure_bound,
    check_odd_k,
    failure_rate,
    nested_decode,
    nested_encode,
    nested_success_bound,
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
from gradzip.compressors.registry import register
from gradzip.errors import CorruptPayloadError
from gradzip.kernels.backend import use_torch_ops
from gradzip.kernels.device_buckets import scales_device
from gradzip.kernels.dithered import fused_decode_nested
from gradzip.kernels.dithered_device import decode_nested_device, encode_symbols_device
from gradzip.kernels.philox import SHARED_UNIFORM
from gradzip.keys import StreamKey
from gradzip.payload import Header
from gradzip.seed_schedule import SeedSchedule, SeedScheduleName

__all__ = [
    "NDQSG",
    "chebyshev_failure_bound",
    "failure_rate",
    "nested_decode",
    "nested_encode",
    "nested_success_bound",
]


@register
class NDQSG(Compressor):
    """NDQSG: nested dithered quantization; sends ``log2 k`` bits per entry, decodes with side
    information ``y`` (the receiver's running mean of the other workers' gradients).

    Per bucket (normalised by ``sigma = max|g_B|``, fine step ``c = sigma/L1``, coarse step
    ``C2 = k*c``), with the shared dither ``up = u01 - 1/2`` (as DQSG):
    ``q1 = floor(alpha*g/c + up + 1/2)`` and the symbol ``s + h = (q1 + h) mod k``,
    ``h = (k-1)/2``. Decoding: ``r = c*(s - up) - alpha*y``;
    ``g_hat = y + alpha*(r - C2*floor(r/C2 + 1/2))``; a zero bucket decodes to 0.

    Bits: ``32*#buckets + n*ceil(log2 k)`` on the wire (fixed packing), ``32*#buckets +
    n*log2 k`` paper bits (1.585 per entry for ``k = 3``, against ``log2(2*L1+1)`` for DQSG
    with the same fine step).

    Error (normalised units, ``z = (g - y)/sigma``, ``Delta1 = 1/L1``, ``Delta2 = k/L1``):
    decoding succeeds when ``|alpha*z*L1 - e| < k/2`` (``e`` the fine rounding error), surely
    when ``alpha*|z| < (Delta2 - Delta1)/2``. On success ``g_hat = g - alpha*c*e - (1 -
    alpha^2)*(g - y)`` [SEED-R, App. E], so ``E||g_hat - g||^2/(n*sigma^2) = alpha^2*Delta1^2/12
    + (1 - alpha^2)^2*sigma_z^2``; with ``alpha = 1`` the error is DQSG's ``U[-c/2, c/2]``.
    ``P(failure) <= Delta1^2/(3*Delta2^2) + 4*alpha^2*sigma_z^2/Delta2^2`` (Chebyshev, Thm 6);
    a failure shifts the error by a non-zero multiple of ``alpha*C2`` and is not detected.

    Parameters:
        L1: fine levels per sign, ``Delta1 = 1/L1``: larger is more accurate but needs closer
            side information (the coarse cell ``k/L1`` shrinks).
        k: odd nesting ratio ``Delta2/Delta1`` >= 3 [CHOICE: odd for symmetric indices]; larger
            ``k`` tolerates a larger ``|g - y|`` for ``log2 k`` bits.
        alpha: shrinkage in ``(0, 1]``; ``alpha < 1`` lowers the failure rate and, when ``y``
            is close, the MSE (optimum ``alpha^2 = 1 - Delta1^2/(24*sigma_z^2)``, derived).
        bucket_size: elements per float32 scale; default 512 entries
            (``buckets.DEFAULT_BUCKET_SIZE``, [CHOICE]: the paper's one scale per tensor is
            ``bucket_size=None``).
        packing: ``"fixed"``, ``"dense"`` or ``"entropy"`` symbol packing.
        seed_schedule, chain_draws: ``"keyed"`` (default) or the authors' ``"chain"`` with
            its draws per iteration, as for :class:`~gradzip.compressors.dqsg.DQSG` (spec 0.4).

    Device resident (:attr:`device_resident`) with ``packing="fixed"`` (every ``L1``, ``k``,
    ``alpha``, bucket size and seed schedule): a CUDA gradient is encoded where it lives, byte
    for byte the host path's payload, and decoded there with ``side`` on the same device (see
    :mod:`gradzip.device`). ``"dense"`` and ``"entropy"`` pack on the host [CHOICE: their
    coders are sequential].

    ``decode(payload, side=y)`` needs ``y`` of the input's shape. Pure scalar versions:
    :func:`nested_encode`, :func:`nested_decode`; simulations: :func:`failure_rate`.

    References: Abdi & Fekri, "Nested Dithered Quantization for Communication Reduction in
    Distributed Training" (ICLR 2019 submission), eqs. (6)-(7), Alg. 2, Thm 6, Appendix E.
    """

    computes_on_device = True
    #: the fused kernel checks its output tile by tile, other paths check it after the clamp
    checks_finite_output = True

    name = "ndqsg"
    codec_id = 12
    uses_shared_randomness = True
    needs_side_information = True
    example_params: ClassVar[dict[str, Any]] = {"L1": 3, "k": 3, "alpha": 1.0}

    def __init__(
        self,
        L1: int = 3,
        k: int = 3,
        alpha: float = 1.0,
        bucket_size: int | None = DEFAULT_BUCKET_SIZE,
        packing: Packing = "fixed",
        seed_schedule: SeedScheduleName = "keyed",
        chain_draws: int | None = None,
    ) -> None:
        if isinstance(L1, bool) or not isinstance(L1, int) or not 1 <= L1 <= 2**20:
            raise ValueError(f"L1 must be an int in [1, 2**20], got {L1!r}")
        if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 < alpha <= 1:
            raise ValueError(f"alpha must lie in (0, 1], got {alpha!r}")
        self.L1 = L1
        self.k = check_odd_k(k)
        self.alpha = float(alpha)
        self._bucket_size = check_bucket_size(bucket_size)
        self.packing = check_packing(packing)
        self.seed_schedule = SeedSchedule(seed_schedule, chain_draws)

    @property
    def bucket_size(self) -> int:
        return self._bucket_size

    @property
    def device_resident(self) -> bool:  # type: ignore[override]
        """Whether a gradient on a device is coded there: with the fixed packing only (the
        dense and entropy packings are coded on the host)."""
        return self.packing == "fixed"

    @property
    def h(self) -> int:
        """Largest ``|s|``: ``(k-1)/2``."""
        return (self.k - 1) // 2

    def wire_params(self) -> dict[str, ParamValue]:
        params: dict[str, ParamValue] = {
            "L1": self.L1,
            "k": self.k,
            "alpha": self.alpha,
            "packing": self.packing,
        }
        return params | self.seed_schedule.wire_params()

    def expected_body_bits(self, x: torch.Tensor) -> int | None:
        n = x.numel()
        return scaled_symbols_bits(n, self._bucket_size, self.k, self.packing)

    def min_body_bits(self, header: Header) -> int:
        return scaled_symbols_floor_bits(header.numel, self._bucket_size, self.k, self.packing)

    # -- encode --------------------------------------------------------------------------------
    def _encode_scanned(
        self, x: torch.Tensor, key: StreamKey, shape: tuple[int, ...]
    ) -> Body | None:
        """Fixed packing of several buckets on the CPU: the fused kernel's max-abs scales prove
        the input finite, with no separate scan."""
        n, bs = x.numel(), self._bucket_size
        if self.packing != "fixed" or use_torch_ops(x) or num_buckets(n, bs) == 1:
            return None
        return self._fused_body(x, key, None)

    def _fused_body(self, x: torch.Tensor, key: StreamKey, given: torch.Tensor | None) -> Body:
        """The fixed-packed body from the fused kernel (see :func:`fused_scaled_body`)."""
        args = self._encode_args(key)
        return fused_scaled_body(x, given, self._bucket_size, self.k, args, self.non_finite_input)

    def _encode_flat(
        self, x: torch.Tensor, key: StreamKey, absmax: float, shape: tuple[int, ...]
    ) -> Body:
        n, bs = x.numel(), self._bucket_size
        if self.packing == "fixed" and not use_torch_ops(x):
            one = num_buckets(n, bs) == 1
            given = torch.tensor([absmax], dtype=torch.float32) if one else None
            return self._fused_body(x, key, given)
        scales = bucket_absmax(x, bs, absmax)
        symbols = self._symbols(x, scales, key)
        packed = device_packed(symbols, self.k, self.packing)
        return scaled_symbols_body(scales, symbols, self.k, self.packing, packed)

    def _encode_args(self, key: StreamKey) -> dict[str, Any]:
        """``(floor(alpha*x/c + u01) + h) mod k`` as ``v = (1 + u01) + x*(alpha*L1/sigma)``,
        ``v = v + (shift - 1)``, truncated, clamped to ``top`` and reduced mod ``k``.

        ``shift = h + k*m`` with ``k*m >= L1 + 1`` keeps ``v`` non-negative (so truncation is
        floor) without changing the residue. Float32 while ``top <= 255`` and the bucket's
        factor fits float32, else float64 (see :mod:`gradzip.kernels.dithered`).
        """
        k = self.k
        shift = self.h + k * -(-(self.L1 + 1) // k)
        top = self.L1 + 1 + shift
        return {
            "numer": self.alpha * self.L1,
            "seed": self.seed_schedule.shared_seed(key),
            "stream": SHARED_UNIFORM,
            "nsum": 0,
            "c": float(shift - 1),
            "top": top,
            "modk": k,
            "fast_ok": top <= 255,
        }

    def _symbols(self, x: torch.Tensor, scales: torch.Tensor, key: StreamKey) -> torch.Tensor:
        """The symbols as torch operations on ``x``'s device (see :meth:`_encode_args`)."""
        return encode_symbols_device(x, scales, self._bucket_size, **self._encode_args(key))

    def _encode_device(self, x: torch.Tensor, key: StreamKey, shape: tuple[int, ...]) -> Body:
        """The fixed-packed body on ``x``'s device: the fused kernel's bytes."""
        scales = scales_device(x, self._bucket_size)
        args = self._encode_args(key)
        finite = torch.isfinite(scales).all()
        return dithered_device_body(x, scales, self._bucket_size, args, self.k, finite)

    def _decode_device(
        self, body: torch.Tensor, header: Header, side: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The fused kernel's values on the body's device, with ``side`` (already there). The
        clamp to the dtype is applied always (see
        :func:`~gradzip.compressors._device_scaled.clamp_to_dtype_device`); the base checks
        the output finite."""
        if side is None:  # the base class checks this already
            raise ValueError("ndqsg decoding needs side information (side=...)")
        n, bs = header.numel, self._bucket_size
        scales, symbols, ok = read_scaled_device_body(body, n, num_buckets(n, bs), self.k)
        numer, step_factor, K0 = self._decode_consts()
        seed = self.seed_schedule.shared_seed(header.key)
        out = decode_nested_device(
            symbols, scales, bs, numer, step_factor, self.k, K0, seed, SHARED_UNIFORM,
            side.reshape(-1),
        )  # fmt: skip
        return clamp_to_dtype_device(out, header.dtype), ok

    # -- decode --------------------------------------------------------------------------------
    def _decode_flat(
        self, body: memoryview, header: Header, side: torch.Tensor | None
    ) -> torch.Tensor:
        if side is None:  # the base class checks this already; keeps mypy and callers honest
            raise ValueError("ndqsg decoding needs side information (side=...)")
        if self.packing == "fixed" and not use_torch_ops():
            return self._fused_decode(body, header, side, None)
        n = header.numel
        scales, rest = read_scales(body, num_buckets(n, self._bucket_size))
        check_scales(scales, self.name)
        lo, hi = torch.aminmax(side)
        ymax = max(-float(lo), float(hi))
        symbols = device_unpacked(body_tensor(rest), n, self.k, self.packing)
        check_symbols(symbols, self.k, self.name)
        numer, step_factor, K0 = self._decode_consts()
        seed = self.seed_schedule.shared_seed(header.key)
        out = decode_nested_device(
            symbols, scales, self._bucket_size, numer, step_factor, self.k, K0, seed,
            SHARED_UNIFORM, side,
        )  # fmt: skip
        clamp_to_dtype_(out, header.dtype, self._reach(ymax, scales))
        check_finite_output(self.name, out)
        return out

    def _decode_into_flat(
        self, body: memoryview, header: Header, side: torch.Tensor | None, out: torch.Tensor
    ) -> bool:
        """Fixed packing on the CPU: decoded straight into ``out`` (no fresh output), unless
        ``out`` shares memory with the side information, which the kernel may read again after
        writing (the float64 re-decoding of a bucket)."""
        if side is None or self.packing != "fixed" or use_torch_ops():
            return False
        if out.untyped_storage().data_ptr() == side.untyped_storage().data_ptr():
            return False
        self._fused_decode(body, header, side, out)
        return True

    def _fused_decode(
        self, body: memoryview, header: Header, side: torch.Tensor, into: torch.Tensor | None
    ) -> torch.Tensor:
        """The fused kernel (:func:`fused_decode_nested`), which reads ``max|y|`` and checks its
        float32 output while each tile is in cache; where the bound on the output (``max|y|``
        plus the reconstruction's reach) is not below the dtype's largest value, the values are
        clamped and then checked in a pass of their own."""
        n = header.numel
        scales, rest = read_scales(body, num_buckets(n, self._bucket_size))
        check_scales(scales, self.name)
        decoded = fused_decode_nested(
            body_tensor(rest),
            n,
            self.k,
            scales,
            self._bucket_size,
            *self._decode_consts(),
            self.seed_schedule.shared_seed(header.key),
            SHARED_UNIFORM,
            side,
            self.name,
            into=into,
        )
        out, reach = decoded.values, self._reach(decoded.ymax, scales)
        small = header.dtype in (torch.float16, torch.bfloat16)
        if reach < float(torch.finfo(header.dtype if small else torch.float32).max):
            if decoded.nonfinite:
                raise CorruptPayloadError(
                    f"{self.name} payload decodes to non-finite values (NaN or Inf): its body "
                    f"is corrupt"
                )
            return out
        clamp_to_dtype_(out, header.dtype, reach)
        check_finite_output(self.name, out)
        return out

    def _reach(self, ymax: float, scales: torch.Tensor) -> float:
        """A bound on ``max|g_hat|``: ``max|y|`` plus the largest coarse cell's reach."""
        return ymax + float(scales.max()) * self.alpha * self.k / self.L1

    def _decode_consts(self) -> tuple[float, float, float]:
        """``(alpha*L1, alpha/L1, K0)`` of the decoder in fine units: with ``w = s + h - 1 -
        u01 - alpha*y/c`` (``s + h`` the symbol), the decoder's ``rn = s - up - alpha*y/c`` is
        ``w + K0``, ``K0 = 3/2 - h``; ``g_hat = y + alpha*c*(rn - k*floor(rn/k + 1/2))``, the
        coarse index taken as ``floor(w*(1/k) + (K0/k + 1/2))`` (see
        :func:`gradzip.kernels.dithered.decode_nested_tiles`)."""
        return self.alpha * self.L1, self.alpha / self.L1, 1.5 - self.h
