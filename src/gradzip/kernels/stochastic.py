"""Fused numba kernels of the stochastic-rounding quantizers (QSGD, TernGrad, Hou, LPC, QESGD,
QSGD-l2): scale, local Philox uniforms, rounding and fixed-width packing in one pass per side.

The tensor is cut into tiles of whole buckets (a multiple of 8 elements, so every tile starts on
a byte of the packed stream); tiles run in parallel (``prange``). Per tile the encoder computes
its buckets' max-abs scales (or reads given ones), draws its local uniforms into an L2-sized
scratch buffer, rounds and packs; the decoder unpacks and rescales. Every element depends only on
its own value, index, bucket scale and Philox uniform, so the bytes depend neither on the thread
count nor on the tiling. No ``fastmath``: numba never contracts a multiply and an add into an
FMA, so the results do not depend on the CPU's instruction set.

Arithmetic contract, shared with :mod:`gradzip.kernels.stochastic_torch` (the device path, which
the compressors also use for the dense and entropy packings) [CHOICE]:

*Symmetric grid* (:func:`encode_symmetric`, QSGD/TernGrad/Hou/LPC), per bucket with float32 scale
``c`` and divisor count ``per`` (``s`` for the scale-based codecs, 1 for LPC whose scale is its
step): ``step = f32(f64(c) / per)``; divisor ``d = step`` if ``step > 0``, else the smallest
subnormal if ``c > 0``, else 1; ``f = 1 / f64(d)``. With ``o = 1 + u`` (float32, exact):

* float32, when ``s <= 127`` and ``f`` fits float32 (decided per bucket): ``v = o + x*f32(f)``
  (two roundings), ``v = clamp(v, 1 - s, 1 + s)`` when ``clip``, ``v = v + f32(s - 1)``,
  symbol ``min(max(trunc(v), 0), 2s)``;
* float64 otherwise: ``w = f64(o) + (s - 1)``, ``w = w + f64(x)*f``, symbol
  ``clamp(floor(w), 0, 2s)``.

Decoding: ``f32(symbol - s) * m`` with the per-bucket float32 multiplier ``m``.

*Two's complement grid* (:func:`encode_twos`, QESGD/QSGD-l2), per bucket with float32 step ``d``
(1 where the step is 0): in float32 (``bits <= 8``) or float64, ``k = x / d``, ``k = k + u``
(``u = o - 1``, exact), ``k = clamp(floor(k), -2^(b-1), 2^(b-1) - 1)``, symbol ``k mod 2^b``.

Packing is :mod:`gradzip.codecs.bitpack`'s LSB-first layout; the pack and unpack helpers here
are the fused kernels' own [CHOICE: written for these kernels; the same layout as the shared
building blocks].
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

from gradzip.buffers import fresh_array
from gradzip.errors import CorruptPayloadError
from gradzip.kernels._threads import call_parallel
from gradzip.kernels.bitpack import pack_tile, unpack_tile, unpack_tile_narrow
from gradzip.kernels.buckets import effective_bucket_size, num_buckets
from gradzip.kernels.dithered import (
    TILE,
    accumulator,
    bucket_absmax_bits,
    check_alphabet,
    tile_elements,
    tile_scales,
)
from gradzip.kernels.packed import check_packed, packed_bytes
from gradzip.kernels.philox import LOCAL_UNIFORM, fill_uniform

_F32_MAX = float(np.finfo(np.float32).max)
_TINY32 = np.float32(2.0**-149)
#: buckets larger than this get their scales from a separate pass and tiles of TILE elements
_LARGE_BUCKET = 1 << 13


@njit(nogil=True, cache=True, parallel=True)
def bucket_absmax(xbits, bucket_size, scale_bits):  # type: ignore[no-untyped-def]
    """``max|x_B|`` per bucket (bit patterns of finite float32 in, of the scales out)."""
    n = xbits.size
    for b in prange(scale_bits.size):
        scale_bits[b] = bucket_absmax_bits(xbits, b * bucket_size, min(n, (b + 1) * bucket_size))


# -- symmetric grid ----------------------------------------------------------------------------


@njit(nogil=True, cache=True, parallel=True)
def encode_symmetric(  # type: ignore[no-untyped-def]
    x, scales, compute_scales, bucket_size, unit, per, s, clip, k0, k1, symbols, packed, bits
):
    """Symbols (and, when ``bits > 0``, packed bytes) of the symmetric grid; see the module
    docstring. ``compute_scales``: fill ``scales`` with each bucket's ``max|x_B|`` here."""
    n = x.size
    xbits = x.view(np.uint32)
    scale_bits = scales.view(np.uint32)
    tiles = (n + unit - 1) // unit
    for t in prange(tiles):
        lo = t * unit
        hi = min(n, lo + unit)
        if compute_scales and bucket_size > 0:
            tile_scales(xbits, scale_bits, lo, hi, bucket_size)
        symmetric_tile(x, scales, bucket_size, lo, hi, per, s, clip, k0, k1, symbols)
        if bits > 0:
            pack_tile(symbols, lo, hi - lo, bits, packed)


@njit(inline="always", nogil=True, cache=True)
def symmetric_tile(x, scales, bucket_size, lo, hi, per, s, clip, k0, k1, symbols):  # type: ignore[no-untyped-def]
    """The symbols of ``x[lo:hi]`` on the symmetric grid of the per-bucket ``scales`` (bucket
    ``i // bucket_size``; ``bucket_size`` 0: one bucket) into ``symbols[lo:hi]``, the local
    uniforms of stream ``(k0, k1)`` drawn from index ``lo``: the arithmetic of the module
    docstring, shared by :func:`encode_symmetric` and the batched kernels of
    :mod:`gradzip.kernels.grid_segments` so that both give the same bits."""
    top = np.int32(2 * s)
    zero = np.int32(0)
    lo32 = np.float32(1 - s)
    hi32 = np.float32(1 + s)
    sm1_32 = np.float32(s - 1)
    sm1 = np.float64(s - 1)
    words = np.empty(hi - lo, dtype=np.uint32)
    fill_uniform(k0, k1, LOCAL_UNIFORM, lo, words)
    ones_tile = words.view(np.float32)  # 1 + u, exactly
    a = lo
    while a < hi:
        if bucket_size == 0:
            b = 0
            e = hi
        else:
            b = a // bucket_size
            e = min(hi, (b + 1) * bucket_size)
        c = scales[b]
        step = np.float32(np.float64(c) / per)
        if step > 0:
            d = step
        elif c > 0:
            d = _TINY32
        else:
            d = np.float32(1.0)
        f = 1.0 / np.float64(d)
        xs = x[a:e]
        os = ones_tile[a - lo : e - lo]
        ss = symbols[a:e]
        if s <= 127 and f <= _F32_MAX:
            f32 = np.float32(f)
            if clip:
                for j in range(e - a):
                    v = os[j] + xs[j] * f32
                    v = min(max(v, lo32), hi32) + sm1_32
                    ss[j] = min(max(np.int32(v), zero), top)
            elif s == 1:
                for j in range(e - a):
                    v = os[j] + xs[j] * f32
                    ss[j] = min(max(np.int32(v), zero), top)
            else:
                for j in range(e - a):
                    v = os[j] + xs[j] * f32
                    v = v + sm1_32
                    ss[j] = min(max(np.int32(v), zero), top)
        else:
            for j in range(e - a):
                w = np.float64(os[j]) + sm1
                w = w + np.float64(xs[j]) * f
                ss[j] = np.int32(min(max(np.floor(w), 0.0), np.float64(top)))
        a = e


@njit(nogil=True, cache=True, parallel=True)
def decode_symmetric(packed, bits, mults, bucket_size, unit, s, out, tops, accumulate):  # type: ignore[no-untyped-def]
    """``f32(symbol - s) * mults[bucket]`` of the unpacked symbols into ``out``, or added to it
    (``out[i] + v``, one float32 add) when ``accumulate``; ``tops[t]`` is the largest symbol of
    tile ``t`` (the caller checks the alphabet, before the call when it accumulates)."""
    n = out.size
    tiles = (n + unit - 1) // unit
    s32 = np.float32(s)  # symbol and s are exact in float32 (below 2**24), so is their difference
    for t in prange(tiles):
        lo = t * unit
        hi = min(n, lo + unit)
        m = hi - lo
        if bits <= 8:  # a uint8 scratch buffer: a quarter of the bytes, the narrow unpackers
            sym8 = np.empty(m, dtype=np.uint8)
            tops[t] = unpack_tile_narrow(packed, lo, m, bits, sym8)
            _rescale_slices(sym8, lo, hi, mults, bucket_size, s32, out, accumulate)
        else:
            sym = np.empty(m, dtype=np.uint32)
            tops[t] = unpack_tile(packed, lo, m, bits, sym)
            _rescale_slices(sym, lo, hi, mults, bucket_size, s32, out, accumulate)


@njit(inline="always", nogil=True, cache=True)
def _rescale_slices(sym, lo, hi, mults, bucket_size, s32, out, accumulate):  # type: ignore[no-untyped-def]
    """``out[a] = f32(sym[a - lo] - s) * mult`` (or added to ``out[a]``), one branch-free loop
    per bucket slice of ``lo:hi``."""
    a = lo
    while a < hi:
        b = 0 if bucket_size == 0 else a // bucket_size
        e = hi if bucket_size == 0 else min(hi, (b + 1) * bucket_size)
        mult = mults[b]
        src = sym[a - lo : e - lo]
        dst = out[a:e]
        if accumulate:
            for j in range(e - a):
                dst[j] = dst[j] + (np.float32(src[j]) - s32) * mult
        else:
            for j in range(e - a):
                dst[j] = (np.float32(src[j]) - s32) * mult
        a = e


@njit(nogil=True, cache=True, parallel=True)
def subtract_symmetric(sym, mults, bucket_size, unit, s, v, hat, write_hat):  # type: ignore[no-untyped-def]
    """Error feedback's residual from the encoder's own symbols: ``h = f32(symbol - s) * m``,
    the decoder's value (:func:`_rescale_slices`, as :func:`decode_symmetric` computes it),
    then ``v[i] - h`` (one float32 subtraction). With ``write_hat``, ``mults`` are the ``m``,
    ``h`` goes into ``hat`` and is subtracted from it; without, ``mults`` are ``-m`` and
    ``v + f32(symbol - s) * (-m)`` is added in place, the same bits (negation is exact and
    rounding is symmetric, so ``a * -m == -(a * m)`` and ``v + -h == v - h``)."""
    n = v.size
    tiles = (n + unit - 1) // unit
    s32 = np.float32(s)
    for t in prange(tiles):
        lo = t * unit
        hi = min(n, lo + unit)
        if write_hat:
            _rescale_slices(sym[lo:hi], lo, hi, mults, bucket_size, s32, hat, False)
            dst = v[lo:hi]
            out = hat[lo:hi]
            for j in range(hi - lo):
                dst[j] = dst[j] - out[j]
        else:
            _rescale_slices(sym[lo:hi], lo, hi, mults, bucket_size, s32, v, True)


# -- two's complement grid ---------------------------------------------------------------------


@njit(nogil=True, cache=True, parallel=True)
def encode_twos(x, steps, bucket_size, unit, bits, wide, k0, k1, symbols, packed, pack):  # type: ignore[no-untyped-def]
    """Symbols ``clamp(floor(x/d + u)) mod 2^bits`` (and packed bytes when ``pack``)."""
    n = x.size
    tiles = (n + unit - 1) // unit
    kmin = -(1 << (bits - 1))
    kmax = (1 << (bits - 1)) - 1
    mask = (1 << bits) - 1
    kmin32 = np.float32(kmin)
    kmax32 = np.float32(kmax)
    one32 = np.float32(1.0)
    for t in prange(tiles):
        lo = t * unit
        hi = min(n, lo + unit)
        m = hi - lo
        words = np.empty(m, dtype=np.uint32)
        fill_uniform(k0, k1, LOCAL_UNIFORM, lo, words)
        ones = words.view(np.float32)
        a = lo
        while a < hi:
            b = 0 if bucket_size == 0 else a // bucket_size
            e = hi if bucket_size == 0 else min(hi, (b + 1) * bucket_size)
            d = steps[b]
            if not d > 0:
                d = one32
            xs = x[a:e]
            us = ones[a - lo : e - lo]
            ss = symbols[a:e]
            if wide:
                d64 = np.float64(d)
                for j in range(e - a):
                    k = np.float64(xs[j]) / d64
                    k = k + np.float64(us[j] - one32)
                    k = min(max(np.floor(k), np.float64(kmin)), np.float64(kmax))
                    ss[j] = np.int32(k) & mask
            else:
                for j in range(e - a):
                    k = xs[j] / d
                    k = k + (us[j] - one32)
                    k = min(max(np.floor(k), kmin32), kmax32)
                    ss[j] = np.int32(k) & mask
            a = e
        if pack:
            pack_tile(symbols, lo, m, bits, packed)


@njit(nogil=True, cache=True, parallel=True)
def decode_twos(packed, bits, steps, bucket_size, unit, out):  # type: ignore[no-untyped-def]
    """``f32(k) * steps[bucket]`` with ``k`` the sign-extended ``bits``-bit code."""
    n = out.size
    tiles = (n + unit - 1) // unit
    half = 1 << (bits - 1)
    full = 1 << bits
    for t in prange(tiles):
        lo = t * unit
        hi = min(n, lo + unit)
        m = hi - lo
        sym = np.empty(m, dtype=np.uint32)
        unpack_tile(packed, lo, m, bits, sym)
        a = lo
        while a < hi:
            b = 0 if bucket_size == 0 else a // bucket_size
            e = hi if bucket_size == 0 else min(hi, (b + 1) * bucket_size)
            d = steps[b]
            src = sym[a - lo : e - lo]
            dst = out[a:e]
            for j in range(e - a):
                k = np.int32(src[j])
                k = k - full if k >= half else k
                dst[j] = np.float32(k) * d
            a = e


# -- Python entry points -----------------------------------------------------------------------


def symbol_dtype_for(top: int) -> type:
    """NumPy dtype of symbols in ``[0, top]``."""
    return np.uint8 if top <= 255 else np.int32


def fused_symmetric_encode(
    x: torch.Tensor,
    scales: torch.Tensor | None,
    bucket_size: int,
    per: int,
    s: int,
    clip: bool,
    seed: int,
    bits: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(scales, symbols, packed)`` of a CPU float32 ``x`` on the symmetric grid.

    ``scales`` None: each bucket's ``max|x_B|`` is computed here (``bucket_size`` 0 needs the
    single scale given). ``bits`` 0: symbols only (the packed tensor is empty).
    """
    n = x.numel()
    bs = effective_bucket_size(n, bucket_size)
    nb = max(1, num_buckets(n, bucket_size))  # one scale even for an empty tensor
    xs = x.contiguous().numpy()
    compute = scales is None
    if scales is None:
        if bs == 0:
            raise ValueError("a single bucket's scale must be given")
        sc = np.empty(nb, dtype=np.float32)
    else:
        sc = scales.to(torch.float32).contiguous().numpy().copy()
    unit = tile_elements(bs, n) if compute else TILE
    if compute and bs > _LARGE_BUCKET:
        call_parallel(bucket_absmax, xs.view(np.uint32), bs, sc.view(np.uint32))
        compute, unit = False, TILE
    symbols: np.ndarray = np.empty(n, dtype=symbol_dtype_for(2 * s))
    packed = np.empty(packed_bytes(n, bits) if bits else 0, dtype=np.uint8)
    call_parallel(
        encode_symmetric,
        xs,
        sc,
        compute,
        bs,
        unit,
        per,
        s,
        clip,
        seed & 0xFFFFFFFF,
        seed >> 32,
        symbols,
        packed,
        bits,
    )
    return torch.from_numpy(sc), torch.from_numpy(symbols), torch.from_numpy(packed)


def packed_array(data: torch.Tensor, n: int, bits: int) -> np.ndarray:
    """The bytes of ``n`` packed ``bits``-bit symbols as a NumPy array, after the checks of
    :func:`gradzip.kernels.packed.check_packed` (exact length, zero padding bits)."""
    check_packed(data, n, bits)
    raw: np.ndarray = data.contiguous().numpy()
    return raw


def _check_tops(tops: np.ndarray, alphabet: int, what: str) -> None:
    if tops.size and int(tops.max()) >= alphabet:
        raise CorruptPayloadError(
            f"{what} payload holds a symbol outside the alphabet [0, {alphabet})"
        )


def fused_symmetric_decode(
    data: torch.Tensor,
    n: int,
    bits: int,
    mults: torch.Tensor,
    bucket_size: int,
    s: int,
    what: str,
    out: torch.Tensor | None = None,
    add: bool = True,
) -> torch.Tensor:
    """Unpack and rescale ``f32(symbol - s) * mult`` in one parallel pass (float32, CPU).
    With ``out`` and ``add=False`` the values are written into ``out`` (no fresh output; a
    corrupt stream raises with ``out`` partly written).

    With ``out`` (contiguous float32, CPU) the values are added into it and ``out`` is
    returned: the product is rounded to float32 before the add (numba contracts nothing without
    fastmath), the bits of decoding and then adding. The alphabet is checked over the packed
    bytes first (:func:`gradzip.kernels.dithered.check_alphabet`), so a corrupt stream raises
    with ``out`` untouched.
    """
    raw = packed_array(data, n, bits)
    bs = effective_bucket_size(n, bucket_size)
    unit = TILE  # decoding needs no whole buckets per tile
    accumulate = out is not None and add
    target = accumulator(out, n)
    if accumulate:
        check_alphabet(raw, n, bits, 2 * s + 1, unit, what)
    tops = np.zeros(-(-n // unit), dtype=np.uint64)
    mult = mults.to(torch.float32).contiguous().numpy()
    call_parallel(decode_symmetric, raw, bits, mult, bs, unit, s, target, tops, accumulate)
    _check_tops(tops, 2 * s + 1, what)
    return torch.from_numpy(target) if out is None else out


def symmetric_residual(
    symbols: torch.Tensor,
    mults: torch.Tensor,
    bucket_size: int,
    s: int,
    v: torch.Tensor,
    reconstruct: bool,
) -> torch.Tensor | None:
    """Turn the contiguous float32 CPU ``v`` into ``v - v_hat`` in place, ``v_hat`` being the
    decoding of ``symbols`` with the per-bucket multipliers ``mults``; ``v_hat`` is returned
    (a fresh float32 tensor) when ``reconstruct``, else None. One parallel pass, the bits of
    decoding and then subtracting."""
    n = v.numel()
    hat = fresh_array(n, np.float32) if reconstruct else np.empty(0, dtype=np.float32)
    mult = mults.to(torch.float32).contiguous().numpy()
    call_parallel(
        subtract_symmetric,
        symbols.contiguous().numpy(),
        mult if reconstruct else -mult,  # added into v when nothing is reconstructed
        effective_bucket_size(n, bucket_size),
        TILE,
        s,
        v.detach().view(-1).numpy(),
        hat,
        reconstruct,
    )
    return torch.from_numpy(hat) if reconstruct else None


def fused_twos_encode(
    x: torch.Tensor, steps: torch.Tensor, bucket_size: int, bits: int, seed: int, pack: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(symbols, packed)`` of the two's complement grid (``steps`` float32 per bucket)."""
    n = x.numel()
    bs = effective_bucket_size(n, bucket_size)
    unit = TILE  # steps are given: no whole buckets per tile needed
    symbols = np.empty(n, dtype=np.uint8 if bits <= 8 else np.int32)
    packed = np.empty(packed_bytes(n, bits) if pack else 0, dtype=np.uint8)
    call_parallel(
        encode_twos,
        x.contiguous().numpy(),
        steps.to(torch.float32).contiguous().numpy(),
        bs,
        unit,
        bits,
        bits > 8,
        seed & 0xFFFFFFFF,
        seed >> 32,
        symbols,
        packed,
        pack,
    )
    return torch.from_numpy(symbols), torch.from_numpy(packed)


def fused_twos_decode(
    data: torch.Tensor, n: int, bits: int, steps: torch.Tensor, bucket_size: int
) -> torch.Tensor:
    """Unpack, sign-extend and scale by the bucket's float32 step in one parallel pass."""
    raw = packed_array(data, n, bits)
    bs = effective_bucket_size(n, bucket_size)
    unit = TILE
    out = fresh_array(n, np.float32)
    call_parallel(
        decode_twos, raw, bits, steps.to(torch.float32).contiguous().numpy(), bs, unit, out
    )
    return torch.from_numpy(out)
