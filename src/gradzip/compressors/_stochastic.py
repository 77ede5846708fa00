"""Stochastic rounding onto a symmetric level grid, shared by QSGD, TernGrad, Hou and LPC.

Every one of these quantizers does the same three things per bucket ``B`` with a step
``step_B`` (``scale_B / s`` for QSGD/TernGrad/Hou, ``delta`` for LPC):

* level ``q_i = floor(x_i / step_B + u_i)`` clamped to ``[-s, s]``, with ``u_i ~ U[0, 1)`` from
  :func:`gradzip.rng.local_uniform` (the sender's own randomness, deterministic given the key);
  this has the law of ``sign(x_i) * floor(|x_i| / step_B + u_i)`` that the papers write (each is
  the unique unbiased rounding to the two neighbouring levels). The clamp is spec 0.3's "float32
  followed by a clamp to the legal range", and for LPC it is also the projection of out-of-hull
  values onto ``+-s*delta``;
* symbol ``q_i + s`` in ``[0, 2s]``;
* decode ``(symbol - s) * step_B``.

A zero bucket multiplies by 0 instead of dividing by 0 (all its entries are 0, so the levels are
0 and it decodes to exact zeros), and its uniforms are still drawn so the stream stays aligned (spec 0.3).

The private base class :class:`ScaledStochastic` holds the common encode/decode for the
scale-based quantizers; its subclasses only say how the per-bucket scale is computed.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch

from gradzip.accounting import Encoded
from gradzip.codecs.symbols import (
    check_packing,
    unpack_symbols,
)
from gradzip.compressors._bucket_math import (
    add_scaled_,
    per_row,
    safe_factors,
    segments,
    truncate_to_uint8,
)
from gradzip.compressors._grid import CommonGrid
from gradzip.compressors.base import Body, Compressor, body_tensor
from gradzip.compressors.common import (
    bucket_absmax,
    check_bucket_size,
    check_scales,
    check_symbols,
    fresh_float32,
    num_buckets,
    read_scales,
    scaled_symbols_bits,
    scaled_symbols_body,
    scaled_symbols_floor_bits,
)
from gradzip.keys import StreamKey
from gradzip.payload import Header
from gradzip.rng import local_uniform_plus_one

FLOAT32_MAX = float(torch.finfo(torch.float32).max)
#: the largest s whose symbols [0, 2s] fit in a byte (the float32 fast path)
_BYTE_LEVELS = 127


def symbol_dtype(s: int) -> torch.dtype:
    """Smallest integer dtype holding symbols in ``[0, 2s]``."""
    return torch.uint8 if 2 * s < 256 else torch.int32


def stochastic_symbols(
    x: torch.Tensor,
    steps: torch.Tensor,
    s: int,
    key: StreamKey,
    bucket_size: int,
    may_overload: bool = False,
) -> torch.Tensor:
    """Symbols ``clamp(floor(x/step + u), -s, s) + s`` (one positive step per bucket).

    ``floor(v + u)`` with ``u ~ U[0, 1)`` rounds ``v`` up with probability ``frac(v)``, for either
    sign of ``v``: the same two-point law as rounding ``|v|`` and restoring the sign (the form
    the papers write), so it is the QSGD/TernGrad quantizer, computed without the sign split.
    ``u`` comes from ``local_uniform(key, n)``.

    Fast path: ``v = (1 + u) + x*(1/step) + (s - 1)`` is built in the uniform buffer by one fused
    multiply-add (plus one add for ``s > 1``); it is non-negative, so a truncating cast is its
    floor, and the clamp keeps float32 rounding inside the alphabet (spec 0.3). Alphabets beyond a
    byte, or steps so small that ``1/step`` overflows float32, use float64. ``may_overload``
    says ``|x/step|`` can exceed ``s`` (LPC with ``theta < 1``): ``v`` is then clamped to the
    grid before the cast, which projects those values onto ``+-s`` (the "gradient clipping").
    """
    n = x.numel()
    factors = safe_factors(1.0, steps)
    v = local_uniform_plus_one(key, n)
    if s > _BYTE_LEVELS or float(factors.max()) > FLOAT32_MAX:
        w = v.to(torch.float64).add_(s - 1)
        x64 = x.to(torch.float64)
        for elems, rows, buckets in segments(n, bucket_size):
            add_scaled_(
                w[elems].view(rows, -1), x64[elems].view(rows, -1), per_row(factors, rows, buckets)
            )
        w.floor_().clamp_(0, 2 * s)
        return w.to(symbol_dtype(s))
    f32 = factors.to(torch.float32)
    for elems, rows, buckets in segments(n, bucket_size):
        add_scaled_(v[elems].view(rows, -1), x[elems].view(rows, -1), per_row(f32, rows, buckets))
    if may_overload:
        v.clamp_(1 - s, s + 1)
    if s != 1:
        v.add_(s - 1)
    return truncate_to_uint8(v).clamp_(max=2 * s)


def symbols_to_values(
    symbols: torch.Tensor, steps: torch.Tensor, s: int, bucket_size: int
) -> torch.Tensor:
    """Decode ``(symbol - s) * step`` into a fresh float32 tensor.

    The subtraction is exact (small integers); NumPy's mixed integer/float32 ufunc into
    NumPy-allocated memory is several times faster than torch's conversion here.
    """
    out = fresh_float32(symbols.numel())
    np.subtract(symbols.numpy(), np.float32(s), out=out.numpy())
    for elems, rows, buckets in segments(out.numel(), bucket_size):
        out[elems].view(rows, -1).mul_(per_row(steps, rows, buckets))
    return out


def fit_dtype_(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Clamp decoded float32 values to the finite range of the tensor's own (narrower) dtype.

    [CHOICE] A reconstruction can exceed the original dtype's range (QSGD's l2 scale sends
    ``+-||g||_2``; a float16 tensor near 65504 rounds up): it is saturated rather than turned into
    an infinity by the final cast.
    """
    if dtype in (torch.float16, torch.bfloat16):
        top = float(torch.finfo(dtype).max)
        values.clamp_(-top, top)
    return values


def safe_steps(scales: torch.Tensor, s: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Encoder divisors and decoder multipliers ``step = scale / s`` for per-bucket scales.

    The step is computed in float64 and rounded once to float32, and both sides use that same
    float32 step. The encoder never divides by 0: a zero scale divides by 1 (its entries are 0),
    and a positive scale whose step underflows float32 divides by the smallest subnormal (its
    levels clamp to ``s``; the decoder's step is then 0).
    """
    steps = (scales.to(torch.float64) / s).to(torch.float32)
    tiny = torch.full_like(steps, float(torch.finfo(torch.float32).smallest_normal) * 2.0**-23)
    divisors = torch.where(steps > 0, steps, torch.where(scales > 0, tiny, torch.ones_like(steps)))
    return divisors, steps


class ScaledStochastic(Compressor, CommonGrid):
    """Common machinery of the per-bucket-scale stochastic quantizers (not registered).

    Subclasses set ``s`` (positive levels), ``_bucket``, ``packing`` and optionally override
    :meth:`_scales` (default: ``max|x_B|``) and :meth:`_decode_factor` (Hou's ``1/(1+omega)``).
    """

    s: int
    packing: str
    _bucket: int
    _forced_scale: float | None = None

    def __init__(self, s: int, bucket_size: int | None, packing: str) -> None:
        if isinstance(s, bool) or not isinstance(s, int) or s < 1:
            raise ValueError(f"{self.name}: the number of levels s must be an int >= 1, got {s!r}")
        if s > 2**15:
            raise ValueError(f"{self.name}: s = {s} is too large (at most 2**15 levels)")
        self.s = s
        self._bucket = check_bucket_size(bucket_size)
        self.packing = check_packing(packing)

    @property
    def bucket_size(self) -> int:
        return self._bucket

    @property
    def alphabet(self) -> int:
        """Symbols ``level*sign + s`` take ``2s + 1`` values."""
        return 2 * self.s + 1

    def _scales(self, x: torch.Tensor, absmax: float) -> torch.Tensor:
        """float32 scale per bucket, each ``>= max|x_B|`` (default: exactly ``max|x_B|``)."""
        return bucket_absmax(x, self._bucket, absmax)

    def _decode_factor(self, numel: int) -> float:
        """Extra factor applied on decode (1 except for Hou's scaled variant)."""
        return 1.0

    def _all_scales(self, x: torch.Tensor, absmax: float) -> torch.Tensor:
        if self._forced_scale is not None:
            nb = num_buckets(x.numel(), self._bucket)
            return torch.full((nb,), self._forced_scale, dtype=torch.float32)
        return self._scales(x, absmax)

    def _encode_flat(
        self, x: torch.Tensor, key: StreamKey, absmax: float, shape: tuple[int, ...]
    ) -> Body:
        scales = self._all_scales(x, absmax)
        divisors, _ = safe_steps(scales, self.s)
        symbols = stochastic_symbols(x, divisors, self.s, key, self._bucket)
        return scaled_symbols_body(scales, symbols, self.alphabet, self.packing)

    def _decode_flat(
        self, body: memoryview, header: Header, side: torch.Tensor | None
    ) -> torch.Tensor:
        n = header.numel
        scales, rest = read_scales(body, num_buckets(n, self._bucket))
        check_scales(scales, self.name)
        symbols = unpack_symbols(body_tensor(rest), n, self.alphabet, self.packing)
        check_symbols(symbols, 2 * self.s + 1, self.name)
        _, mults = safe_steps(scales, self.s)
        factor = self._decode_factor(n)
        if factor != 1.0:
            mults = (mults.to(torch.float64) * factor).to(torch.float32)
        return fit_dtype_(symbols_to_values(symbols, mults, self.s, self._bucket), header.dtype)

    def expected_body_bits(self, x: torch.Tensor) -> int | None:
        return scaled_symbols_bits(x.numel(), self._bucket, self.alphabet, self.packing)

    def min_body_bits(self, header: Header) -> int:
        return scaled_symbols_floor_bits(header.numel, self._bucket, self.alphabet, self.packing)

    # -- common grid (integer-sum schemes, see gradzip.compressors._grid) ----------------------
    def grid_supported(self) -> bool:
        return self._decode_factor(1) == 1.0

    def grid_levels(self) -> int:
        return self.s

    def grid_bucket_size(self, n: int) -> int:
        return self._bucket

    def grid_statistic(self, x: torch.Tensor) -> torch.Tensor:
        return self._scales(x, float(x.abs().max()) if x.numel() else 0.0)

    def grid_symbols(self, x: torch.Tensor, scales: torch.Tensor, key: StreamKey) -> torch.Tensor:
        divisors, _ = safe_steps(scales, self.s)
        return stochastic_symbols(x, divisors, self.s, key, self._bucket)

    def grid_steps(self, scales: torch.Tensor) -> torch.Tensor:
        return safe_steps(scales, self.s)[1].to(torch.float64)

    def encode_with_scale(
        self, tensor: torch.Tensor, key: StreamKey | None, scale: float
    ) -> Encoded:
        """Encode with an externally agreed scale (e.g. ``max`` over workers of ``||g||_inf``).

        Every bucket uses ``scale`` instead of its own; it must be finite and ``>= max|g|``
        (float32), else ``ValueError``. Sharing one scale lets a server sum the integer symbols
        of all workers (TernGrad's scale sharing); variance grows with ``scale^2``.
        """
        scale = float(scale)
        if not math.isfinite(scale) or scale < 0 or scale > FLOAT32_MAX:
            raise ValueError(f"{self.name}: external scale must be finite and >= 0, got {scale}")
        flat = tensor.detach().reshape(-1).to(torch.float32)
        need = float(flat.abs().max()) if flat.numel() else 0.0
        scale32 = float(torch.tensor(scale, dtype=torch.float32))
        clone = copy.copy(self)
        clone._forced_scale = scale32
        if not math.isfinite(need):  # NaN/Inf input: encode raises NonFiniteInputError
            return clone.encode(tensor, key)
        if scale32 < need:
            raise ValueError(
                f"{self.name}: external scale {scale} is smaller than max|g| = {need}; it must "
                f"bound every coordinate"
            )
        return clone.encode(tensor, key)
