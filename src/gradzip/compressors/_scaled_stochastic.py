"""Stochastic rounding onto a symmetric level grid, shared by QSGD, TernGrad, Hou and LPC.

Every one of these quantizers does the same three things per bucket ``B`` with a step
``step_B`` (``scale_B / s`` for QSGD/TernGrad/Hou, ``delta`` for LPC):

* level ``q_i = floor(x_i / step_B + u_i)`` clamped to ``[-s, s]``, with ``u_i ~ U[0, 1)`` from
  :func:`gradzip.rng.local_uniform` (the sender's own randomness, deterministic given the key);
  this has the law of ``sign(x_i) * floor(|x_i| / step_B + u_i)`` that the papers write (each is
  the unique unbiased rounding to the two neighbouring levels; the generator's ``u`` takes the
  ``2**16`` midpoints of equal cells of ``(0, 1)``, so the probability of rounding up is right
  to within ``2**-17``, see :mod:`gradzip.rng`). The clamp is spec 0.3's "float32
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

import math

import numpy as np
import torch

from gradzip.accounting import Encoded
from gradzip.buffers import fresh_array
from gradzip.codecs.symbols import Packing, check_packing, pack_symbols, symbol_bits, unpack_symbols
from gradzip.compressors._decode_guards import check_finite_output
from gradzip.compressors._device_stochastic import (
    false_flag,
    fit_dtype_device,
    scales_ok,
    split_scales,
    symmetric_device_body,
    symmetric_device_values,
)
from gradzip.compressors._scaled_body import (
    all_finite,
    check_scales,
    check_symbols,
    read_scales,
    scaled_symbols_bits,
    scaled_symbols_floor_bits,
)
from gradzip.compressors.base import Body, Compressor, body_tensor
from gradzip.compressors.buckets import (
    bucket_absmax,
    check_bucket_size,
    num_buckets,
    per_row,
    segments,
)
from gradzip.compressors.grid import CommonGrid, SymmetricGrid
from gradzip.device.mode import device_path
from gradzip.kernels.backend import use_torch_ops
from gradzip.kernels.bitpack_torch import pack_bits_torch, unpack_bits_torch
from gradzip.kernels.device_buckets import bucket_absmax_device
from gradzip.kernels.packed import check_packed
from gradzip.kernels.stochastic import (
    fused_symmetric_decode,
    fused_symmetric_encode,
    fused_twos_decode,
    fused_twos_encode,
    symmetric_residual,
)
from gradzip.kernels.stochastic_device import safe_steps_device
from gradzip.kernels.stochastic_torch import (
    bucket_absmax_torch,
    symmetric_symbols_torch,
    symmetric_values_torch,
    twos_symbols_torch,
    twos_values_torch,
)
from gradzip.keys import StreamKey
from gradzip.payload import MAX_ELEMENTS, Header
from gradzip.rng import derive_seed

FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def use_kernels(x: torch.Tensor) -> bool:
    """Whether ``x`` goes through the numba kernels (CPU tensors) or torch operations (other
    devices, or inside :func:`gradzip.kernels.backend.forced_torch_ops`)."""
    return not use_torch_ops(x)


def symbol_dtype(s: int) -> torch.dtype:
    """Smallest integer dtype holding symbols in ``[0, 2s]``."""
    return torch.uint8 if 2 * s < 256 else torch.int32


def stochastic_symbols(
    x: torch.Tensor,
    scales: torch.Tensor,
    per: int,
    s: int,
    key: StreamKey,
    bucket_size: int,
    may_overload: bool = False,
) -> torch.Tensor:
    """Symbols ``clamp(floor(x/step + u), -s, s) + s`` with ``step = scale/per`` per bucket.

    ``floor(v + u)`` with ``u ~ U[0, 1)`` rounds ``v`` up with probability ``frac(v)`` (within
    ``2**-17`` for the generator's 16-bit midpoint ``u``, see :mod:`gradzip.rng`), for either
    sign of ``v``: the same two-point law as rounding ``|v|`` and restoring the sign (the form
    the papers write), so it is the QSGD/TernGrad quantizer, computed without the sign split.
    ``u`` is ``local_uniform(key, n)``. The exact float arithmetic (float32, or float64 for
    alphabets beyond a byte and steps whose reciprocal overflows float32, decided per bucket) is
    the contract of :mod:`gradzip.kernels.stochastic`: numba kernels for CPU tensors, torch
    operations (:mod:`gradzip.kernels.stochastic_torch`) elsewhere, with the same bits.
    ``may_overload`` says ``|x/step|`` can exceed ``s`` (LPC with ``theta < 1``): the value is
    clamped to the grid, which projects it onto ``+-s`` (the "gradient clipping").
    """
    seed = derive_seed(key, domain="local")
    if use_kernels(x):
        return fused_symmetric_encode(x, scales, bucket_size, per, s, may_overload, seed, 0)[1]
    return symmetric_symbols_torch(x, scales, bucket_size, per, s, may_overload, seed)


def symmetric_body(
    x: torch.Tensor,
    scales: torch.Tensor | None,
    per: int,
    s: int,
    key: StreamKey,
    bucket_size: int,
    packing: str,
    may_overload: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(scales, symbols, packed)``: the body of a symmetric-grid quantizer.

    ``scales`` None: the per-bucket ``max|x_B|`` (computed inside the fused kernel on the CPU).
    The default fixed packing of a CPU tensor is one fused pass (scale, uniforms, rounding,
    packing); other packings and devices compute the same symbols and pack them afterwards.
    """
    seed = derive_seed(key, domain="local")
    alphabet = 2 * s + 1
    if use_kernels(x) and packing == "fixed":
        bits = symbol_bits(alphabet)
        return fused_symmetric_encode(x, scales, bucket_size, per, s, may_overload, seed, bits)
    if scales is None:
        scales = bucket_absmax_torch(x, bucket_size)
    symbols = stochastic_symbols(x, scales, per, s, key, bucket_size, may_overload)
    if packing == "fixed" and not use_kernels(x):
        packed = pack_bits_torch(symbols, symbol_bits(alphabet))
    else:
        packed = pack_symbols(symbols.cpu(), alphabet, packing)
    return scales, symbols, packed


def symmetric_values(
    data: torch.Tensor,
    n: int,
    mults: torch.Tensor,
    s: int,
    bucket_size: int,
    packing: str,
    what: str,
) -> torch.Tensor:
    """Decode packed symbols into ``f32(symbol - s) * mult`` per bucket (float32): one fused
    pass for the fixed packing, else unpacking then :func:`symbols_to_values`."""
    alphabet = 2 * s + 1
    if packing == "fixed":
        bits = symbol_bits(alphabet)
        if not use_torch_ops():
            return fused_symmetric_decode(data, n, bits, mults, bucket_size, s, what)
        check_packed(data, n, bits)
        symbols = unpack_bits_torch(data, n, bits)
        check_symbols(symbols, alphabet, what)
        return symmetric_values_torch(symbols, mults, bucket_size, s)
    symbols = unpack_symbols(data, n, alphabet, packing)
    check_symbols(symbols, alphabet, what)
    return symbols_to_values(symbols, mults, s, bucket_size)


def twos_body(
    x: torch.Tensor, steps: torch.Tensor, bits: int, key: StreamKey, bucket_size: int, packing: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(symbols, packed)`` of the two's complement grid ``k = clamp(floor(x/step + u),
    -2^(bits-1), 2^(bits-1) - 1)`` (QESGD, QSGD-l2; a zero step divides by 1), symbols ``k mod
    2^bits``; float32 for ``bits <= 8``, else float64. One fused pass for a CPU tensor with the
    fixed packing (:mod:`gradzip.kernels.stochastic`), torch operations elsewhere."""
    seed = derive_seed(key, domain="local")
    if use_kernels(x):
        symbols, packed = fused_twos_encode(x, steps, bucket_size, bits, seed, packing == "fixed")
        if packing != "fixed":
            packed = pack_symbols(symbols, 2**bits, packing)
        return symbols, packed
    symbols = twos_symbols_torch(x, steps, bucket_size, bits, seed)
    if packing == "fixed":
        return symbols, pack_bits_torch(symbols, bits)
    return symbols, pack_symbols(symbols.cpu(), 2**bits, packing)


def twos_values(
    data: torch.Tensor, n: int, steps: torch.Tensor, bits: int, bucket_size: int, packing: str
) -> torch.Tensor:
    """Decode two's complement codes into ``f32(k) * step`` per bucket (float32)."""
    if packing == "fixed":
        if not use_torch_ops():
            return fused_twos_decode(data, n, bits, steps, bucket_size)
        check_packed(data, n, bits)
        symbols = unpack_bits_torch(data, n, bits)
    else:
        symbols = unpack_symbols(data, n, 2**bits, packing)
    return twos_values_torch(symbols, steps, bucket_size, bits)


def symbols_to_values(
    symbols: torch.Tensor, steps: torch.Tensor, s: int, bucket_size: int
) -> torch.Tensor:
    """Decode ``(symbol - s) * step`` into a fresh float32 tensor.

    The subtraction is exact (small integers); NumPy's mixed integer/float32 ufunc into
    NumPy-allocated memory is several times faster than torch's conversion here.
    """
    out = torch.from_numpy(fresh_array(symbols.numel(), np.float32))
    np.subtract(symbols.numpy(), np.float32(s), out=out.numpy())
    for elems, rows, buckets in segments(out.numel(), bucket_size):
        out[elems].view(rows, -1).mul_(per_row(steps, rows, buckets))
    return out


def finite_by_bound(values: torch.Tensor, mults: torch.Tensor, s: int, what: str) -> torch.Tensor:
    """``values`` (``f32(k) * mult`` with ``|k| <= s`` and finite float32 ``mult >= 0``) after
    making sure they are finite, which :attr:`Compressor.checks_finite_output` promises.

    Proof: ``f32(k)`` is exact (``|k| <= s < 2**24``) and ``s * max(mult)``, computed in float64,
    is exact (24-bit by 24-bit mantissas); when it is at most the largest float32, every exact
    product ``|k| * mult`` is too, and rounding to nearest never takes a value at most the
    largest float32 to infinity. So the output is finite without looking at it; only where that
    O(#buckets) bound fails (scales within a factor ``s`` of float32's limit) is the output
    scanned.
    """
    if not finite_values_bound(mults, s):
        check_finite_output(what, values)
    return values


def finite_values_bound(mults: torch.Tensor, s: int) -> bool:
    """Whether :func:`finite_by_bound`'s O(#buckets) bound proves every value finite."""
    if not mults.numel():
        return True
    # host multipliers through NumPy: see check_scales (gradzip.compressors._scaled_body)
    top = mults.detach().numpy().max() if mults.device.type == "cpu" else mults.max()
    return float(top) * s <= FLOAT32_MAX


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


def decoder_steps(scales: torch.Tensor, s: int) -> torch.Tensor:
    """The decoder's float32 multipliers ``step = scale / s`` of per-bucket scales.

    The step is computed in float64 and rounded once to float32; the encoder's kernels
    (:mod:`gradzip.kernels.stochastic`) divide by that same float32 step. They never divide by
    0: a zero scale divides by 1 (its entries are 0), and a positive scale whose step underflows
    float32 divides by the smallest subnormal (its levels clamp to ``s``; the decoder's step is
    then 0). [CHOICE] Two roundings and no encoder divisors, in NumPy for host scales: this
    runs once per tensor and payload in every decode, where a small model's dozens of tensors
    made the operations' fixed cost, not the values, the price.
    """
    if scales.device.type == "cpu":
        # the same two roundings in NumPy (IEEE division in float64, then round to nearest
        # float32), without torch's fixed cost per operation
        steps = scales.detach().numpy().astype(np.float64) / s
        return torch.from_numpy(steps.astype(np.float32))
    return (scales.to(torch.float64) / s).to(torch.float32)


class ScaledStochastic(Compressor):
    """Common machinery of the per-bucket-scale stochastic quantizers (not registered).

    Subclasses set ``s`` (positive levels), ``_bucket``, ``packing`` and optionally override
    :meth:`_scales` (default: ``max|x_B|``) and :meth:`_decode_factor` (Hou's ``1/(1+omega)``).
    """

    computes_on_device = True
    checks_finite_output = True  # see finite_by_bound

    s: int
    packing: Packing
    _bucket: int

    def __init__(self, s: int, bucket_size: int | None, packing: Packing) -> None:
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

    def _scales(self, x: torch.Tensor, absmax: float | None) -> torch.Tensor:
        """float32 scale per bucket, each ``>= max|x_B|`` (default: exactly ``max|x_B|``);
        ``absmax`` is ``max|x|`` where the caller has it (None: computed only if needed)."""
        # abs: +0.0 for a zero tensor (the caller's max of an aminmax may be -0.0), so the bytes
        # do not depend on how a reduction signs its zeros (the device path sends +0.0)
        return bucket_absmax(x, self._bucket, None if absmax is None else abs(absmax))

    @property
    def device_resident(self) -> bool:  # type: ignore[override]
        """Whether this configuration encodes and decodes on the gradient's device: the fixed
        packing with max-abs scales, where the subclass says so (:meth:`_device_configuration`);
        the dense and entropy packings are host coders (see
        :mod:`gradzip.compressors._device_stochastic`)."""
        return self.packing == "fixed" and self._device_configuration()

    def _device_configuration(self) -> bool:
        """Whether the subclass's options allow the device path (none by default)."""
        return False

    def _encode_device(self, x: torch.Tensor, key: StreamKey, shape: tuple[int, ...]) -> Body:
        """The host body's bytes, on the device: max-abs scales (whose finiteness is the
        input's), symbols of :func:`gradzip.kernels.stochastic_device.symmetric_symbols_device`,
        fixed packing."""
        scales = bucket_absmax_device(x, self._bucket)
        seed = derive_seed(key, domain="local")
        finite = torch.isfinite(scales).all()
        return symmetric_device_body(x, scales, self.s, self.s, seed, self._bucket, False, finite)

    def _decode_device(
        self, body: torch.Tensor, header: Header, side: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`_decode_flat` on the device: ``f32(symbol - s) * mult`` with the host's
        multipliers; the flag checks the scales, the alphabet, the padding bits and the size."""
        n = header.numel
        bits = symbol_bits(self.alphabet)
        scales, packed, exact = split_scales(body, n, self._bucket, bits)
        mults = safe_steps_device(scales, self.s)
        factor = self._decode_factor(n)
        if factor != 1.0:
            mults = (mults.to(torch.float64) * factor).to(torch.float32)
        values, ok = symmetric_device_values(packed, n, mults, self.s, self._bucket)
        ok = ok & scales_ok(scales) if exact else false_flag(body.device)
        return fit_dtype_device(values, header.dtype), ok

    def _decode_factor(self, numel: int) -> float:
        """Extra factor applied on decode (1 except for Hou's scaled variant)."""
        return 1.0

    def _scales_in_kernel(self, n: int) -> bool:
        """Whether the fused kernel computes the scales itself: max-abs scales of several
        buckets (one bucket's scale is ``absmax``, known already)."""
        return self._max_abs_scales() and num_buckets(n, self._bucket) > 1

    def _max_abs_scales(self) -> bool:
        """Whether :meth:`_scales` is the per-bucket ``max|x_B|`` (QSGD's l2 norm is not)."""
        return type(self)._scales is ScaledStochastic._scales

    def _scans_in_kernel(self, x: torch.Tensor) -> bool:
        """Whether :meth:`_encode_scanned` applies: the fused kernel computes the max-abs
        scales of a fixed-packed CPU tensor, and :meth:`_encode_flat` would use nothing else of
        the input scan (subclasses that clip or code differently say no)."""
        return self.packing == "fixed" and use_kernels(x) and self._scales_in_kernel(x.numel())

    def _encode_scanned(
        self, x: torch.Tensor, key: StreamKey, shape: tuple[int, ...]
    ) -> Body | None:
        """The fused kernel's max-abs scales prove the input finite, with no separate scan."""
        if not self._scans_in_kernel(x):
            return None
        parts = symmetric_body(x, None, self.s, self.s, key, self._bucket, self.packing)
        if not all_finite(parts[0]):
            raise self.non_finite_input()
        return self._body(*parts)

    def _encode_flat(
        self, x: torch.Tensor, key: StreamKey, absmax: float, shape: tuple[int, ...]
    ) -> Body:
        scales = None if self._scales_in_kernel(x.numel()) else self._scales(x, absmax)
        return self._body(
            *symmetric_body(x, scales, self.s, self.s, key, self._bucket, self.packing)
        )

    def _body(self, scales: torch.Tensor, symbols: torch.Tensor, packed: torch.Tensor) -> Body:
        """The body of :func:`symmetric_body`'s scales, symbols and packed bytes."""
        side = 32 * scales.numel()
        return Body(
            pieces=[scales, packed],
            paper_bits=symbols.numel() * math.log2(self.alphabet) + side,
            streams=(symbols,),
            side_bits=side,
        )

    def _decode_flat(
        self, body: memoryview, header: Header, side: torch.Tensor | None
    ) -> torch.Tensor:
        """``f32(symbol - s) * mult`` per bucket, finite by :func:`finite_by_bound`."""
        mults, rest = self._decode_mults(body, header.numel)
        values = symmetric_values(
            body_tensor(rest), header.numel, mults, self.s, self._bucket, self.packing, self.name
        )
        return fit_dtype_(finite_by_bound(values, mults, self.s, self.name), header.dtype)

    def _decode_mults(self, body: memoryview, n: int) -> tuple[torch.Tensor, memoryview]:
        """The checked float32 multipliers of the buckets and the rest of the body."""
        scales, rest = read_scales(body, num_buckets(n, self._bucket))
        check_scales(scales, self.name)
        return self._mults_of(scales, n), rest

    def _mults_of(self, scales: torch.Tensor, n: int) -> torch.Tensor:
        """The decoder's float32 multiplier of each bucket of an ``n``-value tensor."""
        mults = decoder_steps(scales, self.s)
        factor = self._decode_factor(n)
        if factor != 1.0:
            mults = (mults.to(torch.float64) * factor).to(torch.float32)
        return mults

    def encode_with_feedback(
        self, v: torch.Tensor, key: StreamKey, *, reconstruct: bool = False
    ) -> tuple[Encoded, torch.Tensor | None] | None:
        """Error feedback's fused step (see :class:`gradzip.feedback.FusedFeedback`): encode
        ``v`` and turn ``v``, in place, into ``v - v_hat``; ``v_hat``, returned when
        ``reconstruct``, is bitwise what :meth:`decode` gives for the payload.

        ``v_hat`` comes from the encoder's own symbols and scales, ``f32(symbol - s) * mult``
        with the decoder's multipliers (:func:`decoder_steps`; the decoding kernel's float32
        operations, in one pass that also subtracts:
        :func:`gradzip.kernels.stochastic.symmetric_residual`), instead of parsing and
        decoding the payload just framed: on a small tensor the parse and its checks cost as
        much as the encoding, on a large one the unpacking pass is saved. The payload is
        :meth:`encode`'s. Serves a contiguous, non-empty float32 CPU ``v`` with the fixed
        packing of symbols (the numba path) whose reconstruction the multipliers' bound proves
        finite; returns None, ``v`` untouched, for anything else (the generic path decodes).
        Raises :class:`~gradzip.errors.NonFiniteInputError` (``v`` untouched) on NaN or Inf.
        """
        if not self._reconstructs_from_symbols(v):
            return None
        shape = tuple(v.shape)
        flat = v.view(-1)
        body = self._host_body(flat, key, shape)  # raises on non-finite v, v untouched
        scales, symbols = body.pieces[0], body.streams
        # the numba path's fixed packing always gives these (a silent fallback would encode twice)
        assert isinstance(scales, torch.Tensor) and isinstance(symbols, tuple)
        mults = self._mults_of(scales, flat.numel())
        if not finite_values_bound(mults, self.s):
            return None  # the generic path's decode checks the values
        encoded = self._framed(self.header_for(shape, v.dtype, key), body)
        v_hat = symmetric_residual(symbols[0], mults, self._bucket, self.s, flat, reconstruct)
        return encoded, None if v_hat is None else v_hat.view(shape)

    def _reconstructs_from_symbols(self, v: torch.Tensor) -> bool:
        """Whether :meth:`encode_with_feedback` serves ``v`` (see there)."""
        return (
            self.packing == "fixed"
            and getattr(self, "coding", "symbols") == "symbols"
            and v.dtype == torch.float32
            and v.is_contiguous()
            and 0 < v.numel() <= MAX_ELEMENTS
            and use_kernels(v)  # a CPU tensor, the numba path
            and not (self.device_resident and device_path(v))
        )

    def _decode_into_flat(
        self, body: memoryview, header: Header, side: torch.Tensor | None, out: torch.Tensor
    ) -> bool:
        """The fixed-packing symbols decoded straight into ``out`` where
        :meth:`_decode_add_flat` would add them."""
        return self._fused_decode(body, header, out, add=False)

    def _decode_add_flat(
        self, body: memoryview, header: Header, side: torch.Tensor | None, out: torch.Tensor
    ) -> bool:
        """The fixed-packing symbols added into ``out`` in the decoding pass itself
        (:func:`gradzip.kernels.stochastic.fused_symmetric_decode` with ``out``: alphabet
        checked first, then ``out + f32(symbol - s) * mult``), when the values are provably
        finite; other packings and codings (QSGD's Elias records), torch operations and
        scales near float32's limit decode and add."""
        return self._fused_decode(body, header, out, add=True)

    def _fused_decode(
        self, body: memoryview, header: Header, out: torch.Tensor, *, add: bool
    ) -> bool:
        if self.packing != "fixed" or getattr(self, "coding", "symbols") != "symbols":
            return False
        if use_torch_ops():
            return False
        mults, rest = self._decode_mults(body, header.numel)
        if not finite_values_bound(mults, self.s):
            return False
        bits = symbol_bits(2 * self.s + 1)
        fused_symmetric_decode(
            body_tensor(rest), header.numel, bits, mults, self._bucket, self.s, self.name, out, add
        )
        return True

    def expected_body_bits(self, x: torch.Tensor) -> int | None:
        return scaled_symbols_bits(x.numel(), self._bucket, self.alphabet, self.packing)

    def min_body_bits(self, header: Header) -> int:
        return scaled_symbols_floor_bits(header.numel, self._bucket, self.alphabet, self.packing)

    # -- common grid (integer-sum schemes, see gradzip.compressors.grid) -----------------------
    def common_grid(self) -> CommonGrid | None:
        """Levels on the agreed scale, except for Hou's scaled variant (its decode factor)."""
        return self if self._decode_factor(1) == 1.0 else None

    def grid_levels(self) -> int:
        return self.s

    def grid_bucket_size(self, n: int) -> int:
        return self._bucket

    def grid_prepare(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def grid_statistic(self, x: torch.Tensor) -> torch.Tensor:
        return self._scales(x, None)  # max|x| is computed only for a single bucket

    def grid_symbols(self, x: torch.Tensor, scales: torch.Tensor, key: StreamKey) -> torch.Tensor:
        return stochastic_symbols(x, scales, self.s, self.s, key, self._bucket)

    def grid_steps(self, scales: torch.Tensor) -> torch.Tensor:
        return decoder_steps(scales, self.s).to(torch.float64)

    def grid_offsets(self, key: StreamKey, n: int) -> torch.Tensor | None:
        return None

    def grid_offset_seed(self, key: StreamKey) -> int | None:
        return None

    def grid_symmetric(self) -> SymmetricGrid | None:
        """The symmetric grid of :meth:`grid_symbols` where the scales are ``max|x_B|`` (see
        :meth:`_max_abs_scales`)."""
        if not self._max_abs_scales():
            return None
        return SymmetricGrid(per=self.s, s=self.s, clip=False, bucket_size=self._bucket)
