"""DQSG: dithered quantization with a shared, subtracted dither (spec 1.2-1.3)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from gradzip.codecs.bitpack import unpack_bits
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
    clip_to_std,
    num_buckets,
)
from gradzip.compressors.grid import CommonGrid, SymmetricGrid
from gradzip.compressors.registry import register
from gradzip.kernels.backend import use_torch_ops
from gradzip.kernels.device_buckets import scales_device, single_absmax
from gradzip.kernels.dithered import fused_decode_affine, fused_encode
from gradzip.kernels.dithered_device import decode_affine_device, encode_symbols_device
from gradzip.kernels.packed import packed_bytes
from gradzip.kernels.philox import SHARED_UNIFORM
from gradzip.keys import StreamKey
from gradzip.payload import Header
from gradzip.rng import shared_uniform_plus_one_from_seed
from gradzip.seed_schedule import SeedSchedule, SeedScheduleName

#: the largest finite float32
FLOAT32_LIMIT = float(torch.finfo(torch.float32).max)


def rounded_bound(exact: float) -> float:
    """``exact`` (a bound on the exact value of a decoded ``|g_hat|``) widened to bound the
    computed float32 value too, so that ``rounded_bound(...) < FLOAT32_LIMIT`` proves the
    output finite (:attr:`~gradzip.compressors.base.Compressor.checks_finite_output`).

    The dithered decoders compute ``((symbol - base) + c) * step`` with ``step = f32(sigma /
    divisor)``: four roundings (the difference, the sum, the step, the product), each within a
    relative ``2**-24`` of its operands' magnitude; the difference's error, ``<= 2**-24 * (2M +
    2)``, is at most ``2**-22`` of the ``M + 1/2`` the sum may reach, so the computed value is
    within ``(1 + 2**-22)(1 + 2**-24)**3 < 1 + 2**-20`` of the exact bound (float64 steps are
    closer still). A value below the largest float32 never rounds to infinity.
    """
    return exact * (1.0 + 2.0**-20)


# float32 index arithmetic is exact enough (error <= (2M+1) * 2**-24 grid units, then clamped,
# spec 0.3) while the symbols fit in a byte; larger alphabets use float64
_FLOAT32_MAX_LEVEL = 127


@register
class DQSG(Compressor):
    """DQSG: dithered quantization, ``g_hat = sigma * (q - u) / M`` with a shared dither.

    Per bucket, ``sigma = max|g_B|`` (float32), ``y = g_B / sigma`` and, with the shared dither
    ``up = u01 - 1/2`` that the receiver regenerates from the key, ``q = clamp(floor(M*y + up +
    1/2), -M, M)``; the receiver subtracts the dither again (Alg. 1, eq. 2). Because
    ``|M*y + up| <= M + 1/2`` nothing overloads, so by Schuchman's theorem the error
    ``g_hat - g`` is ``U[-sigma/(2M), sigma/(2M)]`` per coordinate, independent of ``g``.

    Bits: ``32*#buckets + n*ceil(log2(2M+1))`` on the wire (fixed packing; the symbols are
    ``q + M``), ``32*#buckets + n*log2(2M+1)`` paper bits (spec 0.5); ``packing="dense"`` gets
    within 1% of the paper bits and ``"entropy"`` near the empirical entropy.

    Variance: unbiased, ``E||g_hat - g||^2 = (Delta^2/12) * sum_b n_b*sigma_b^2`` with
    ``Delta = 1/M``; ``<= n*Delta^2/12 * ||g||_inf^2``.

    Parameters:
        M: levels per sign (``Delta = 1/M``, ``2M+1`` symbols). Larger M: quadratically less
            error, ``log2`` more bits. ``M=1`` reproduces the paper's Table 1.
        bucket_size: elements per scale; smaller buckets give smaller ``sigma_b`` (less error)
            for 32 more bits each. Default 512 (``DEFAULT_BUCKET_SIZE``, [CHOICE]: one scale
            per tensor, the paper's setting and ``bucket_size=None``, diverges on wide layers);
            the scales then cost ``32*ceil(n/512)`` bits, 0.0625 bits per coordinate.
        partitions: split each tensor into ``K`` sub-vectors of ``ceil(n/K)`` elements (the last
            one shorter, fewer than ``K`` when ``n`` is small) with one scale each (eq. 4,
            [CHOICE] for the rounding). Replaces the default bucket size; exclusive with any
            other ``bucket_size``.
        clip_std: clip ``g`` to ``+-clip_std*std(g)`` (population std) before encoding [CODE];
            this trades a bias for a smaller scale. Skipped when ``std(g) == 0`` [CHOICE]. The
            receiver does not need it, so it is not a wire parameter.
        packing: ``"fixed"``, ``"dense"`` or ``"entropy"`` symbol packing.
        seed_schedule: ``"keyed"`` (default, [CHOICE]) or ``"chain"``, the authors' chained
            seeds [CODE] for faithful reproduction (:mod:`gradzip.seed_schedule`, spec 0.4);
            ``"chain"`` needs ``chain_draws``, the dither uniforms per iteration in the
            authors' code (the model's number of gradient elements).

    Randomness: one shared uniform per element from ``shared_uniform(key, n)``; buckets are
    consecutive slices of the tensor's stream, and zero buckets consume theirs too (spec 0.3).
    Indices are computed in float32 and clamped (spec 0.3) for ``M <= 127``, else in float64.
    A decoded value that would overflow the tensor's dtype (``|g_hat|`` may reach
    ``1.5*sigma``, e.g. near float16's 65504) is clamped to its largest finite value [CHOICE].
    Error feedback is not part of this class (see :mod:`gradzip.feedback`).

    Device resident (:attr:`device_resident`) with ``packing="fixed"`` (every ``M``, bucket
    size, ``partitions``, ``clip_std`` and seed schedule): a CUDA gradient is encoded and
    decoded where it lives, byte for byte the host path's payload (see :mod:`gradzip.device`).
    ``"dense"`` and ``"entropy"`` pack on the host [CHOICE: their coders are sequential].

    References: Abdi & Fekri, "Nested Dithered Quantization for Communication Reduction in
    Distributed Training" (ICLR 2019 submission), eq. (2), (4), Alg. 1, Lemma 3, Thm 1.
    """

    computes_on_device = True
    #: finite checked scales, symbols checked in range, ``|g_hat| <= 1.5*sigma`` then the
    #: clamp to the dtype: see :func:`rounded_bound`
    checks_finite_output = True

    name = "dqsg"
    codec_id = 10
    uses_shared_randomness = True
    example_params: ClassVar[dict[str, Any]] = {"M": 1}

    def __init__(
        self,
        M: int = 1,
        bucket_size: int | None = DEFAULT_BUCKET_SIZE,
        partitions: int | None = None,
        clip_std: float | None = None,
        packing: Packing = "fixed",
        seed_schedule: SeedScheduleName = "keyed",
        chain_draws: int | None = None,
    ) -> None:
        if isinstance(M, bool) or not isinstance(M, int) or not 1 <= M <= 2**30:
            raise ValueError(f"M must be an int in [1, 2**30], got {M!r}")
        if partitions is not None:
            if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
                raise ValueError(f"partitions must be a positive int, got {partitions!r}")
            if bucket_size == DEFAULT_BUCKET_SIZE:  # the default gives way to partitions
                bucket_size = None
            elif bucket_size is not None:
                raise ValueError("give either bucket_size or partitions, not both")
        if clip_std is not None and not (isinstance(clip_std, int | float) and clip_std > 0):
            raise ValueError(f"clip_std must be None or a positive number, got {clip_std!r}")
        self.M = M
        self._bucket_size = check_bucket_size(bucket_size)
        self.partitions = partitions
        self.clip_std = None if clip_std is None else float(clip_std)
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
    def alphabet(self) -> int:
        """Number of symbols, ``2M + 1``."""
        return 2 * self.M + 1

    def wire_params(self) -> dict[str, ParamValue]:
        params: dict[str, ParamValue] = {
            "M": self.M,
            "partitions": self.partitions or 0,
            "packing": self.packing,
        }
        return params | self.seed_schedule.wire_params()

    def bucket_size_for(self, n: int) -> int:
        """Elements per bucket for a tensor of ``n`` elements (0: one bucket)."""
        if self.partitions is not None and self.partitions > 1:
            return -(-n // self.partitions)
        return self._bucket_size

    def expected_body_bits(self, x: torch.Tensor) -> int | None:
        n = x.numel()
        return scaled_symbols_bits(n, self.bucket_size_for(n), self.alphabet, self.packing)

    def min_body_bits(self, header: Header) -> int:
        n = header.numel
        return scaled_symbols_floor_bits(n, self.bucket_size_for(n), self.alphabet, self.packing)

    # -- encode --------------------------------------------------------------------------------
    def _encode_scanned(
        self, x: torch.Tensor, key: StreamKey, shape: tuple[int, ...]
    ) -> Body | None:
        """Fixed packing of several buckets on the CPU: the fused kernel's max-abs scales prove
        the input finite, with no separate scan."""
        n = x.numel()
        bs = self.bucket_size_for(n)
        if (
            self.packing != "fixed"
            or self.clip_std is not None
            or use_torch_ops(x)
            or num_buckets(n, bs) == 1
        ):
            return None
        return self._fused_body(x, key, None)

    def _fused_body(self, x: torch.Tensor, key: StreamKey, given: torch.Tensor | None) -> Body:
        """The fixed-packed body from the fused kernel (see :func:`fused_scaled_body`)."""
        bs = self.bucket_size_for(x.numel())
        args = _encode_args(self.M, self.seed_schedule.shared_seed(key))
        return fused_scaled_body(x, given, bs, self.alphabet, args, self.non_finite_input)

    def _encode_flat(
        self, x: torch.Tensor, key: StreamKey, absmax: float, shape: tuple[int, ...]
    ) -> Body:
        n = x.numel()
        if self.clip_std is not None:
            x, absmax = clip_to_std(x, absmax, self.clip_std)
        bs = self.bucket_size_for(n)
        if self.packing == "fixed" and not use_torch_ops(x):
            one = num_buckets(n, bs) == 1
            given = torch.tensor([absmax], dtype=torch.float32) if one else None
            return self._fused_body(x, key, given)
        scales = bucket_absmax(x, bs, absmax)
        symbols = dither_symbols(x, scales, bs, self.M, self.seed_schedule.shared_seed(key))
        return scaled_symbols_body(
            scales,
            symbols,
            self.alphabet,
            self.packing,
            device_packed(symbols, self.alphabet, self.packing),
        )

    def _encode_device(self, x: torch.Tensor, key: StreamKey, shape: tuple[int, ...]) -> Body:
        """The fixed-packed body on ``x``'s device (the fused kernel's bytes): the scales, the
        clipping to ``clip_std`` standard deviations (decided per element, see
        :func:`clip_to_std_device`) and the symbols of :func:`dither_symbols`."""
        n = x.numel()
        bs = self.bucket_size_for(n)
        one = num_buckets(n, bs) == 1
        if self.clip_std is not None:
            absmax = single_absmax(x)
            finite = torch.isfinite(absmax).all()
            x, clipped = clip_to_std_device(x, absmax, self.clip_std)
            scales = clipped if one else scales_device(x, bs)
        else:
            scales = scales_device(x, bs)
            finite = torch.isfinite(scales).all()
        args = _encode_args(self.M, self.seed_schedule.shared_seed(key))
        return dithered_device_body(x, scales, bs, args, self.alphabet, finite)

    def _decode_device(
        self, body: torch.Tensor, header: Header, side: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        n = header.numel
        bs = self.bucket_size_for(n)
        seed = self.seed_schedule.shared_seed(header.key)
        wide = self.M > _FLOAT32_MAX_LEVEL
        affine = (bs, float(self.M), 1.5 - self.M, True, seed, SHARED_UNIFORM, wide)
        out, ok = affine_device_values(body, n, self.alphabet, affine)
        return clamp_to_dtype_device(out, header.dtype), ok

    # -- decode --------------------------------------------------------------------------------
    def _decode_flat(
        self, body: memoryview, header: Header, side: torch.Tensor | None
    ) -> torch.Tensor:
        """``g_hat = ((symbol - (1 + u01)) + (3/2 - M)) * f32(sigma/M)``, finite: see
        :func:`rounded_bound`."""
        n = header.numel
        bs = self.bucket_size_for(n)
        scales, rest = read_scales(body, num_buckets(n, bs))
        check_scales(scales, self.name)
        if self.packing == "fixed" and not use_torch_ops():
            out = fused_decode_affine(body_tensor(rest), n, *self._affine_args(scales, bs, header))
        else:
            symbols = device_unpacked(body_tensor(rest), n, self.alphabet, self.packing)
            check_symbols(symbols, self.alphabet, self.name)
            seed = self.seed_schedule.shared_seed(header.key)
            out = dither_reconstruct(symbols, scales, bs, self.M, seed)
        clamp_to_dtype_(out, header.dtype, self._reach(scales))
        return out

    def _decode_into_flat(
        self, body: memoryview, header: Header, side: torch.Tensor | None, out: torch.Tensor
    ) -> bool:
        """Decoded straight into ``out`` where :meth:`_decode_add_flat` would add."""
        return self._fused_decode(body, header, out, add=False)

    def _decode_add_flat(
        self, body: memoryview, header: Header, side: torch.Tensor | None, out: torch.Tensor
    ) -> bool:
        """Fixed packing on the CPU: the decoded values added into ``out`` in the decoding pass
        (:func:`gradzip.kernels.dithered.fused_decode_affine` with ``out``: alphabet checked
        first, then ``out + v``); where the values may need the clamp (scales near float32's
        limit), or on other packings and devices, decode and add."""
        return self._fused_decode(body, header, out, add=True)

    def _fused_decode(
        self, body: memoryview, header: Header, out: torch.Tensor, *, add: bool
    ) -> bool:
        if self.packing != "fixed" or use_torch_ops():
            return False
        n = header.numel
        bs = self.bucket_size_for(n)
        scales, rest = read_scales(body, num_buckets(n, bs))
        check_scales(scales, self.name)
        if not self._reach(scales) < FLOAT32_LIMIT:
            return False
        args = self._affine_args(scales, bs, header)
        fused_decode_affine(body_tensor(rest), n, *args, out=out, add=add)
        return True

    def _reach(self, scales: torch.Tensor) -> float:
        """A bound on every computed ``|g_hat|`` of these scales (:func:`rounded_bound`)."""
        return rounded_bound(float(scales.max()) * (1 + 0.5 / self.M))

    def _affine_args(
        self, scales: torch.Tensor, bs: int, header: Header
    ) -> tuple[int, torch.Tensor, int, float, float, bool, int, int, bool, str]:
        """The arguments of :func:`fused_decode_affine` after the element count."""
        return (
            self.alphabet,
            scales,
            bs,
            float(self.M),
            1.5 - self.M,
            True,
            self.seed_schedule.shared_seed(header.key),
            SHARED_UNIFORM,
            self.M > _FLOAT32_MAX_LEVEL,
            self.name,
        )

    # -- common grid (integer-sum schemes, see gradzip.compressors.grid) -----------------------
    def common_grid(self) -> CommonGrid:
        return self

    def grid_levels(self) -> int:
        return self.M

    def grid_bucket_size(self, n: int) -> int:
        return self.bucket_size_for(n)

    def grid_prepare(self, x: torch.Tensor) -> torch.Tensor:
        if self.clip_std is None or x.numel() == 0:
            return x
        return clip_to_std(x, float(x.abs().max()), self.clip_std)[0]

    def grid_statistic(self, x: torch.Tensor) -> torch.Tensor:
        return bucket_absmax(x, self.bucket_size_for(x.numel()))  # max|x| only if one bucket

    def grid_symbols(self, x: torch.Tensor, scales: torch.Tensor, key: StreamKey) -> torch.Tensor:
        seed = self.seed_schedule.shared_seed(key)
        return dither_symbols(x, scales, self.bucket_size_for(x.numel()), self.M, seed)

    def grid_steps(self, scales: torch.Tensor) -> torch.Tensor:
        return scales.to(torch.float64) / self.M

    def grid_offsets(self, key: StreamKey, n: int) -> torch.Tensor | None:
        """The subtractive dither ``up = u01 - 1/2`` of rank ``key.rank``, as ``(1 + u01) - 3/2``
        in one pass: exact in float32 (``1 + u01 = 1 + (h + 1/2) 2**-16``, so ``u01 - 1/2`` is a
        multiple of ``2**-17`` below 1/2 in size), the same bits as ``(1 + u01) - 1 - 1/2``."""
        seed = self.seed_schedule.shared_seed(key)
        return shared_uniform_plus_one_from_seed(seed, n).sub_(1.5)

    def grid_symmetric(self) -> SymmetricGrid | None:
        return None  # its own statistic and symbols: quantized tensor by tensor

    def grid_offset_seed(self, key: StreamKey) -> int | None:
        return self.seed_schedule.shared_seed(key)


def clip_to_std_device(
    x: torch.Tensor, absmax: torch.Tensor, c: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`~gradzip.compressors.buckets.clip_to_std` on the device: the same float64
    population std and float32 bound, the host's conditions (finite, positive, below
    ``max|x|``) applied per element with ``torch.where`` instead of read. Returns the clipped
    values and their ``max|x|`` as a float32 tensor of one element."""
    n = x.numel()
    if n > 1:
        std = x.to(torch.float64).std(correction=0)
    else:
        std = torch.zeros((), dtype=torch.float64, device=x.device)
    bound = (std * c).to(torch.float32).reshape(1)
    use = torch.isfinite(bound) & (bound > 0) & (bound < absmax)
    clipped = torch.where(use, torch.clamp(x, -bound, bound), x)
    return clipped, torch.where(use, bound, absmax)


def dither_symbols(
    x: torch.Tensor, scales: torch.Tensor, bucket_size: int, M: int, seed: int
) -> torch.Tensor:
    """DQSG symbols ``clamp(floor(M*x/sigma + u01), -M, M) + M`` with the shared dither of
    ``seed`` (the message's :meth:`~gradzip.seed_schedule.SeedSchedule.shared_seed`),
    as torch operations on ``x``'s device (the fused kernel's twin).

    In float32 (``M <= 127``): ``v = (1 + u01) + x*f32(M/sigma)``, ``v = v + (M - 1)``, a
    truncating cast (``v >= 0`` up to rounding, truncation of ``(-1, 0)`` gives 0) clamped to
    ``2M``; in float64 for larger ``M`` and for buckets whose factor overflows float32 (see
    :mod:`gradzip.kernels.dithered`).
    """
    if not use_torch_ops(x):
        # [CHOICE] on the CPU the fused numba kernel (the torch operations' twin: same bits),
        # packed at the alphabet's width and unpacked: several times faster than the torch
        # Philox, which dominated the integer-sum schemes' step
        bits = max(1, (2 * M).bit_length())
        n = x.numel()
        nb = max(1, num_buckets(n, bucket_size))
        out = np.empty(4 * nb + packed_bytes(n, bits), dtype=np.uint8)
        _, packed = fused_encode(
            x.to(torch.float32), scales, bucket_size, bits=bits, out=out, **_encode_args(M, seed)
        )
        return unpack_bits(torch.from_numpy(packed), n, bits)
    return encode_symbols_device(x, scales, bucket_size, **_encode_args(M, seed))


def _encode_args(M: int, seed: int) -> dict[str, Any]:
    return {
        "numer": float(M),
        "seed": seed,
        "stream": SHARED_UNIFORM,
        "nsum": 0,
        "c": float(M - 1),
        "top": 2 * M,
        "modk": 0,
        "fast_ok": M <= _FLOAT32_MAX_LEVEL,
    }


def dither_reconstruct(
    symbols: torch.Tensor, scales: torch.Tensor, bucket_size: int, M: int, seed: int
) -> torch.Tensor:
    """``g_hat = sigma/M * (q - up)`` with ``q = symbol - M`` and the regenerated dither ``up``,
    as torch operations on the symbols' device.

    Computed as ``((symbol - (1 + u01)) + (3/2 - M)) * f32(sigma/M)`` in float32 (``M <= 127``)
    or float64. Zero buckets decode to exact (+0.0) zeros.
    """
    return decode_affine_device(
        symbols,
        scales,
        bucket_size,
        float(M),
        1.5 - M,
        True,
        seed,
        SHARED_UNIFORM,
        M > _FLOAT32_MAX_LEVEL,
    )
