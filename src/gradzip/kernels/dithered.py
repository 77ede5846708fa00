"""Fused numba kernels of the dithered quantizers (DQSG, NDQSG, half dithering), fixed packing.

One pass per side. The tensor is cut into tiles of whole buckets (a multiple of 8 elements, so
every tile starts on a byte of the packed stream); tiles run in parallel (``prange``). Per tile,
the encoder computes its buckets' max-abs scales, draws its Philox dither into an L2-sized
scratch buffer, quantizes and packs; the decoder unpacks, regenerates the dither and
reconstructs. Every element is computed from its own index, scale and dither uniform, so the bytes
depend neither on the thread count nor on the tiling.

Arithmetic (the contract shared with :mod:`gradzip.kernels.dithered_device`, which is what the
compressors run on other devices and for the dense and entropy packings): every product and
sum is its own IEEE operation in the stated precision (no fused multiply-add; numba without
``fastmath`` never contracts), in this order.

Encoder, per element with ``base`` (``1 + u`` of the shared stream, or the sum of ``nsum``
local uniforms ``u``), bucket factor ``f = numer / sigma`` (float64; 0 for a zero bucket) and
constant ``c``:

* float32 ("fast", when the codec allows it and ``f`` fits float32): ``v = base + x*f32(f)``,
  ``v = v + f32(c)``, ``t = min(trunc(v), top)``;
* float64 otherwise (large alphabets; subnormal scales where ``f`` overflows float32) [CHOICE:
  decided per bucket]: ``w = base + c``, ``w = w + x*f``, ``t = clamp(floor(w), 0, top)``;
* symbol ``t mod k`` for NDQSG (``k = modk > 0``), else ``t`` (on the float32 path computed in
  float32, exactly: :func:`_quantize_fast_mod`).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
import torch
from numba import njit, prange

from gradzip.buffers import fresh_array
from gradzip.errors import CorruptPayloadError
from gradzip.kernels._threads import call_parallel
from gradzip.kernels.bitpack import pack_tile, unpack_tile, unpack_tile_narrow
from gradzip.kernels.buckets import effective_bucket_size, num_buckets
from gradzip.kernels.packed import check_packed, packed_bytes, symbol_bits
from gradzip.kernels.philox import fill_uniform

_F32_MAX = float(np.finfo(np.float32).max)
_ABS_MASK = np.uint32(0x7FFFFFFF)
#: target elements per tile (rounded to whole buckets and a multiple of 8). [CHOICE] 32768
#: (128 KB of input and of dither, L2-sized): each tile restarts the stream of reads of ``x``
#: after its dither is generated, so small tiles (4096 elements) were slower than large ones
#: on one thread; 32768 keeps 16 tiles for 2**19 elements
TILE = 32768
#: elements whose dither a decoder draws at a time inside a tile. [CHOICE] 1024 (4 KB of
#: uniforms): the dither is read back while it is still in L1; read from a tile-sized (L2)
#: buffer while the output streams to memory it was slower. The encoder draws a whole
#: tile's (spans made it slower: its stream of reads of ``x`` restarts after each draw)
DITHER_SPAN = 1024


def tile_elements(bucket_size: int, n: int) -> int:
    """Elements per tile: whole buckets (``bucket_size`` 0 means one bucket), a multiple of 8."""
    if effective_bucket_size(n, bucket_size) == 0:
        return TILE
    per = 8 // np.gcd(bucket_size, 8)  # buckets per tile must make a multiple of 8 elements
    buckets = max(per, -(-TILE // bucket_size))
    buckets = -(-buckets // per) * per
    return int(buckets * bucket_size)


@njit(inline="always", nogil=True, cache=True)
def bucket_absmax_bits(xbits, lo, hi):  # type: ignore[no-untyped-def]
    """Bit pattern of ``max |x|`` over ``x[lo:hi]`` given ``xbits = x.view(uint32)``; +0.0 for a
    zero bucket. For finite floats (the encoder rejects others before the kernel) clearing the
    sign bit gives ``|x|``, and non-negative floats order as their bit patterns do, so an
    integer max-reduction (which LLVM vectorizes, where a float one needs fastmath) gives the
    exact maximum."""
    m = np.uint32(0)
    xs = xbits[lo:hi]
    for i in range(xs.size):
        m = max(m, np.uint32(xs[i] & _ABS_MASK))
    return m


@njit(inline="always", nogil=True, cache=True)
def tile_scales(xbits, scale_bits, lo, hi, bucket_size):  # type: ignore[no-untyped-def]
    """The max-abs bit pattern of every bucket of the tile ``lo:hi`` (whole buckets) into
    ``scale_bits``, before the tile is quantized: a scan of the tile alone streams from memory
    faster than scans interleaved with the arithmetic."""
    s = lo
    while s < hi:
        b = s // bucket_size
        e = min(hi, (b + 1) * bucket_size)
        scale_bits[b] = bucket_absmax_bits(xbits, s, e)
        s = e


@njit(inline="always", nogil=True, cache=True)
def _quantize_fast(xs, base, f32, c32, top, out):  # type: ignore[no-untyped-def]
    """``out = min(trunc((base + x*f32) + c32), top)``, float32, one operation at a time.

    Computed as ``trunc(min(v, f32(top)))`` through ``int32``: the same integer (``top < 2**24``
    is exact in float32, and ``v >= top`` truncates to at least ``top``), and a float minimum
    and a float32-to-int32 conversion vectorize where a conversion to ``int64`` and an integer
    minimum did not. ``|v| < 2**31`` on the fast path: ``|x*f| <= numer * (1 + 2**-23)`` with
    ``numer <= 255`` (``|x| <= sigma``, ``f = numer/sigma``), ``base < 2``, ``c < 256``."""
    topf = np.float32(top)
    for r in range(xs.size):
        v = base[r] + xs[r] * f32
        v = v + c32
        v = v if v < topf else topf
        out[r] = np.int32(v)


@njit(inline="always", nogil=True, cache=True)
def _quantize_fast_mod(xs, base, f32, c32, top, k32, inv_k32, out):  # type: ignore[no-untyped-def]
    """:func:`_quantize_fast` followed by ``mod k``, in float32 in the same loop (NDQSG).

    ``v >= 0`` on the fast path (``base > 1``, ``c >= L1``, ``|x*f| <= alpha*L1*(1 + 2**-23)``
    with ``alpha <= 1``), so ``q = floor(min(v, top))`` is the truncation's integer, and with
    ``inv_k32`` the float32 ``1/k`` rounded *up*, ``m = floor(q*inv_k32)`` is exactly ``q // k``
    for every ``q <= 255`` (the product of ``q = m*k + r`` lies in ``[m, m + 1 - 1/k + 2**-15)``
    before rounding, and ``1/k >= 2**-8``; tested for every ``q`` and ``k``). Why: the integer
    remainder was a second pass over the tile's symbols; in the quantizing loop it costs three
    vector operations."""
    topf = np.float32(top)
    for r in range(xs.size):
        v = base[r] + xs[r] * f32
        v = v + c32
        v = v if v < topf else topf
        q = np.floor(v)
        q = q - np.floor(q * inv_k32) * k32
        out[r] = np.int32(q)


def inverse_rounded_up(k: int) -> float:
    """The float32 nearest ``1/k`` from above (:func:`_quantize_fast_mod`'s ``inv_k32``), as a
    Python float (exactly that float32's value)."""
    inv = float(np.float32(1.0 / k))
    if inv * k < 1.0:  # rounded down (the product is exact in float64): the next float32 up
        inv = float(np.nextafter(np.float32(inv), np.float32(np.inf)))
    return inv


@njit(inline="always", nogil=True, cache=True)
def _reduce_mod(out, k, narrow):  # type: ignore[no-untyped-def]
    """``out = out mod k`` in place. For ``uint8`` symbols (``narrow``) the quotient is
    ``(t * (2**32 // k + 1)) >> 32``, exact for every ``t < 256`` and ``k < 2**24`` (the error
    ``t * (k - 2**32 mod k) / (k * 2**32)`` stays below ``1/k``), a multiply and shift that
    LLVM vectorizes where an integer division does not."""
    if narrow:
        magic = np.uint64((1 << 32) // k + 1)
        kk = np.uint64(k)
        for r in range(out.size):
            t = np.uint64(out[r])
            out[r] = t - ((t * magic) >> np.uint64(32)) * kk
    else:
        for r in range(out.size):
            out[r] = out[r] % k


@njit(nogil=True, cache=True, parallel=True)
def encode_tiles(  # type: ignore[no-untyped-def]
    x,
    scales,
    compute_scales,
    bucket_size,
    unit,
    numer,
    k0,
    k1,
    stream,
    nsum,
    c,
    top,
    modk,
    inv_k32,
    fast_ok,
    kind,
    packed,
    bits,
):
    """Scales (when ``compute_scales``), dither and packed bytes of ``x`` (see the module
    docstring for the arithmetic). ``nsum == 0``: base ``1 + u``; else the sum of ``nsum``
    uniforms ``u`` of elements ``i, i + n, ...``. A tile's symbols live in a scratch buffer of
    ``kind``'s dtype (``uint8``, or ``int32`` for alphabets beyond a byte) that stays in cache
    until it is packed: no symbol array of the tensor's size is written and read back."""
    n = x.size
    tiles = (n + unit - 1) // unit
    c32 = np.float32(c)
    k32 = np.float32(modk)
    xbits = x.view(np.uint32)
    scale_bits = scales.view(np.uint32)
    for t in prange(tiles):
        lo = t * unit
        hi = min(n, lo + unit)
        m = hi - lo
        draws = max(nsum, 1)
        words = np.empty(draws * m, dtype=np.uint32)
        for j in range(draws):
            fill_uniform(k0, k1, stream, lo + j * n, words[j * m : (j + 1) * m])
        ones = words.view(np.float32)  # 1 + u, exactly
        if nsum == 0:
            base = ones[:m]
        else:
            base = ones[:m] - np.float32(1.0)
            for j in range(1, nsum):
                base = base + (ones[j * m : (j + 1) * m] - np.float32(1.0))
        if compute_scales and bucket_size > 0:
            tile_scales(xbits, scale_bits, lo, hi, bucket_size)
        sym = np.empty(m, dtype=kind.dtype)
        s = lo
        while s < hi:
            if bucket_size == 0:
                b = 0
                e = hi
            else:
                b = s // bucket_size
                e = min(hi, (b + 1) * bucket_size)
            sigma = np.float64(scales[b])
            f = numer / sigma if sigma > 0 else 0.0
            xs = x[s:e]
            out = sym[s - lo : e - lo]
            if fast_ok and f <= _F32_MAX and modk > 0:
                _quantize_fast_mod(
                    xs, base[s - lo : e - lo], np.float32(f), c32, top, k32, inv_k32, out
                )
            elif fast_ok and f <= _F32_MAX:
                _quantize_fast(xs, base[s - lo : e - lo], np.float32(f), c32, top, out)
            else:
                for r in range(e - s):
                    if nsum == 0:
                        w = np.float64(ones[s - lo + r])
                    else:
                        w = 0.0
                        for j in range(nsum):
                            w = w + np.float64(ones[j * m + s - lo + r] - np.float32(1.0))
                    w = w + c
                    w = w + np.float64(xs[r]) * f
                    out[r] = min(max(int(np.floor(w)), 0), top)
                if modk > 0:
                    _reduce_mod(out, modk, top <= 255)
            s = e
        pack_tile(sym, 0, m, bits, packed[lo * bits // 8 :])  # lo is a multiple of 8


@njit(inline="always", nogil=True, cache=True)
def _affine_slices(sym, ones, lo, hi, scales, bucket_size, divisor, c, dithered, wide, out, base):  # type: ignore[no-untyped-def]
    """Reconstruct elements ``lo:hi`` into ``out[lo - base:hi - base]`` from the tile's symbols
    ``sym`` and dither ``ones``, one branch-free loop per bucket slice (the branches are taken
    once per slice)."""
    c32 = np.float32(c)
    s = lo
    while s < hi:
        b = 0 if bucket_size == 0 else s // bucket_size
        e = hi if bucket_size == 0 else min(hi, (b + 1) * bucket_size)
        sigma = scales[b]
        dst = out[s - base : e - base]
        q = sym[s - lo : e - lo]
        if sigma == 0:
            for r in range(e - s):
                dst[r] = np.float32(0.0)
        elif wide:
            step = np.float64(sigma) / divisor
            if dithered:
                d = ones[s - lo : e - lo]
                for r in range(e - s):
                    v = np.float64(q[r]) - np.float64(d[r])
                    v = v + c
                    dst[r] = np.float32(v * step)
            else:
                for r in range(e - s):
                    v = np.float64(q[r]) + c
                    dst[r] = np.float32(v * step)
        else:
            step32 = np.float32(np.float64(sigma) / divisor)
            if dithered:
                d = ones[s - lo : e - lo]
                for r in range(e - s):
                    v = np.float32(q[r]) - d[r]
                    v = v + c32
                    dst[r] = v * step32
            else:
                for r in range(e - s):
                    v = np.float32(q[r]) + c32
                    dst[r] = v * step32
        s = e


@njit(inline="always", nogil=True, cache=True)
def _unpacked_tile(packed, lo, m, bits, kind, tops, t):  # type: ignore[no-untyped-def]
    """The tile's ``m`` symbols from element ``lo`` in a scratch buffer of ``kind``'s dtype
    (:func:`symbol_kind`); its largest symbol into ``tops[t]`` (the alphabet check)."""
    sym = np.empty(m, dtype=kind.dtype)
    if bits <= 8:
        tops[t] = unpack_tile_narrow(packed, lo, m, bits, sym)
    else:
        tops[t] = unpack_tile(packed, lo, m, bits, sym)
    return sym


def symbol_kind(bits: int) -> np.ndarray:
    """An empty array whose dtype the decoders unpack ``bits``-bit symbols into: ``uint8`` up
    to 8 bits (the narrow unpacking loops vectorize), else ``uint32``."""
    return np.empty(0, dtype=np.uint8 if bits <= 8 else np.uint32)


@njit(nogil=True, cache=True, parallel=True)
def decode_affine_tiles(  # type: ignore[no-untyped-def]
    packed,
    bits,
    scales,
    bucket_size,
    unit,
    divisor,
    c,
    dithered,
    k0,
    k1,
    stream,
    wide,
    out,
    tops,
    accumulate,
    kind,
):
    """DQSG and half-dither decoding: ``v = ((s - base) + c) * (sigma / divisor)`` per element,
    ``base`` the regenerated ``1 + u`` (``dithered``) or none; float32, or float64 when
    ``wide``; zero buckets give +0.0. ``tops[t]``: the largest symbol of tile ``t``.

    Per tile: unpack into a scratch buffer of ``kind``'s dtype (:func:`symbol_kind`), then per
    span of :data:`DITHER_SPAN` elements draw the dither with
    :func:`~gradzip.kernels.philox.fill_uniform` and run one vectorizable loop per bucket
    slice. With ``accumulate`` the tile's values go to an L2-sized float32 buffer and are then
    added to ``out`` (``out[i] = out[i] + v``, one float32 add): the same bits as decoding and
    then adding, without a dense temporary."""
    n = out.size
    tiles = (n + unit - 1) // unit
    for t in prange(tiles):
        lo = t * unit
        hi = min(n, lo + unit)
        m = hi - lo
        span = min(m, DITHER_SPAN) if dithered else m
        words = np.empty(span if dithered else 0, dtype=np.uint32)
        ones = words.view(np.float32)
        dst = np.empty(m, dtype=np.float32) if accumulate else out
        base = lo if accumulate else 0
        sym = _unpacked_tile(packed, lo, m, bits, kind, tops, t)
        a = lo
        while a < hi:  # the dither one span at a time (see DITHER_SPAN)
            z = min(hi, a + span)
            if dithered:
                fill_uniform(k0, k1, stream, a, words[: z - a])
            _affine_slices(
                sym[a - lo :],
                ones,
                a,
                z,
                scales,
                bucket_size,
                divisor,
                c,
                dithered,
                wide,
                dst,
                base,
            )
            a = z
        if accumulate:
            _add_tile(out, lo, dst)


@njit(inline="always", nogil=True, cache=True)
def _add_tile(out, lo, values):  # type: ignore[no-untyped-def]
    """``out[lo:lo + len(values)] += values``, one float32 add per element."""
    dst = out[lo : lo + values.size]
    for r in range(values.size):
        dst[r] = dst[r] + values[r]


@njit(nogil=True, cache=True, parallel=True)
def symbol_tops(packed, bits, n, unit, tops):  # type: ignore[no-untyped-def]
    """``tops[t]``: the largest of the ``n`` packed ``bits``-bit symbols in tile ``t`` (tiles of
    ``unit`` elements, a multiple of 8): the alphabet check made before anything is written."""
    tiles = (n + unit - 1) // unit
    for t in prange(tiles):
        lo = t * unit
        m = min(n, lo + unit) - lo
        if bits <= 8:
            sym8 = np.empty(m, dtype=np.uint8)
            tops[t] = unpack_tile_narrow(packed, lo, m, bits, sym8)
        else:
            sym32 = np.empty(m, dtype=np.uint32)
            tops[t] = unpack_tile(packed, lo, m, bits, sym32)


@njit(nogil=True, cache=True, parallel=True)
def bad_byte_counts(packed, bad, chunk, counts):  # type: ignore[no-untyped-def]
    """``counts[t]``: how many bytes of chunk ``t`` (``chunk`` bytes each) hold a symbol outside
    the alphabet, ``bad[byte]`` being 1 for those bytes (widths dividing 8: no symbol spans two
    bytes, and zero padding symbols are valid)."""
    size = packed.size
    chunks = (size + chunk - 1) // chunk
    for t in prange(chunks):
        lo = t * chunk
        hi = min(size, lo + chunk)
        total = 0
        for i in range(lo, hi):
            total += bad[packed[i]]
        counts[t] = total


@njit(nogil=True, cache=True)
def ternary_code_flag(words):  # type: ignore[no-untyped-def]
    """2-bit symbols of a 3-symbol alphabet, read as 64-bit words: non-zero where a word holds
    the code 3 (both bits of a pair set), an OR of ``w & (w >> 1)`` over the words masked to the
    pairs' low bits. An integer reduction LLVM vectorizes: one thread reads the quarter byte
    per element at memory speed, and waking other threads would cost more."""
    one = np.uint64(1)
    acc = np.uint64(0)
    for i in range(words.size):
        w = words[i]
        acc |= w & (w >> one)
    return acc & np.uint64(0x5555555555555555)


@njit(inline="always", nogil=True, cache=True)
def _nested_fast(q, d, ys, ybits, neg32, step32, inv_k32, shift32, k32, K032, dst):  # type: ignore[no-untyped-def]
    """The float32 reconstruction of one bucket slice; returns the largest ``|y|`` bit pattern
    of the slice (read in the same loop: the bucket's float32 check, :func:`_redo_wide`)."""
    top = np.uint32(0)
    for r in range(q.size):
        yr = ys[r]
        top = max(top, ybits[r] & _ABS_MASK)
        v = np.float32(q[r]) - d[r]
        v = v + yr * neg32
        w = np.floor(v * inv_k32 + shift32)
        v = v - w * k32
        v = (v + K032) * step32
        dst[r] = v + yr
    return top


@njit(inline="always", nogil=True, cache=True)
def _nested_wide(q, d, ys, f, step, inv_k, shift, k, K0, dst):  # type: ignore[no-untyped-def]
    """The float64 reconstruction of one bucket slice."""
    for r in range(q.size):
        yi = np.float64(ys[r])
        v = np.float64(q[r]) - np.float64(d[r])
        v = v + yi * -f
        w = np.floor(v * inv_k + shift)
        v = v - w * k
        v = (v + K0) * step
        dst[r] = np.float32(v + yi)


@njit(inline="always", nogil=True, cache=True)
def _float32_bucket(f, k, bucket_size, ymax):  # type: ignore[no-untyped-def]
    """Whether a bucket decodes in float32 (before its ``|y|`` is known when ``bucket_size >
    0``: :func:`_redo_wide` re-checks it after the bucket)."""
    return k <= 256 and f <= _F32_MAX and (bucket_size > 0 or f * ymax < 1e30)


@njit(inline="always", nogil=True, cache=True)
def _nested_slices(  # type: ignore[no-untyped-def]
    sym,
    ones,
    lo,
    hi,
    scales,
    bucket_size,
    numer,
    step_factor,
    k,
    K0,
    ymax,
    y,
    ybits,
    out,
    base,
    ytop,
    b0,
):
    """NDQSG reconstruction of elements ``lo:hi`` into ``out[lo - base:hi - base]``, one
    branch-free loop per bucket slice; the largest ``|y|`` bit pattern of each bucket goes into
    ``ytop[b - b0]`` (``ytop[0]`` when ``bucket_size`` is 0)."""
    inv_k = 1.0 / k
    shift = K0 / k + 0.5
    inv_k32 = np.float32(inv_k)
    shift32 = np.float32(shift)
    k32 = np.float32(k)
    K032 = np.float32(K0)
    s = lo
    while s < hi:
        b = 0 if bucket_size == 0 else s // bucket_size
        e = hi if bucket_size == 0 else min(hi, (b + 1) * bucket_size)
        sigma = np.float64(scales[b])
        f = numer / sigma if sigma > 0 else 0.0
        dst = out[s - base : e - base]
        q = sym[s - lo : e - lo]
        d = ones[s - lo : e - lo]
        ys = y[s:e]
        if sigma == 0:
            for r in range(e - s):
                dst[r] = np.float32(0.0)
            top = bucket_absmax_bits(ybits, s, e)
        elif _float32_bucket(f, k, bucket_size, ymax):
            neg32 = np.float32(-f)
            step32 = np.float32(sigma * step_factor)
            top = _nested_fast(
                q, d, ys, ybits[s:e], neg32, step32, inv_k32, shift32, k32, K032, dst
            )
        else:
            _nested_wide(q, d, ys, f, sigma * step_factor, inv_k, shift, k, K0, dst)
            top = bucket_absmax_bits(ybits, s, e)
        slot = 0 if bucket_size == 0 else b - b0
        ytop[slot] = max(ytop[slot], top)
        s = e


@njit(inline="always", nogil=True, cache=True)
def _redo_wide(  # type: ignore[no-untyped-def]
    lo,
    hi,
    sym,
    words,
    scales,
    bucket_size,
    numer,
    step_factor,
    k,
    K0,
    k0,
    k1,
    stream,
    y,
    out,
    base,
    ytop,
    b0,
):
    """Re-decode in float64 every bucket of the tile ``lo:hi`` that went through float32 but
    whose ``f * max|y|`` turned out ``>= 1e30`` (or whose ``y`` holds a NaN or an Inf): the rule
    is decided per bucket on its own side information, so a tile needs no earlier pass over
    ``y``. Almost never taken (``|y|`` near ``1e30 / f``)."""
    tops = ytop.view(np.float32)
    inv_k = 1.0 / k
    shift = K0 / k + 0.5
    ones = words.view(np.float32)
    for b in range(lo // bucket_size, (hi - 1) // bucket_size + 1):
        sigma = np.float64(scales[b])
        f = numer / sigma if sigma > 0 else 0.0
        top = ytop[b - b0]
        if sigma == 0 or not _float32_bucket(f, k, bucket_size, 0.0):
            continue  # zero, or decoded in float64 already
        if top < np.uint32(0x7F800000) and f * np.float64(tops[b - b0]) < 1e30:
            continue
        a = b * bucket_size
        e = min(hi, a + bucket_size)
        while a < e:
            z = min(e, a + words.size)
            fill_uniform(k0, k1, stream, a, words[: z - a])
            _nested_wide(
                sym[a - lo : z - lo], ones[: z - a], y[a:z], f, sigma * step_factor, inv_k,
                shift, k, K0, out[a - base : z - base],
            )  # fmt: skip
            a = z


@njit(nogil=True, cache=True, parallel=True)
def decode_nested_tiles(  # type: ignore[no-untyped-def]
    packed,
    bits,
    scales,
    bucket_size,
    unit,
    numer,
    step_factor,
    k,
    K0,
    ymax,
    k0,
    k1,
    stream,
    y,
    out,
    tops,
    accumulate,
    absbits,
    ytops,
    kind,
):
    """NDQSG decoding with side information ``y`` (see :mod:`gradzip.kernels.dithered_device`
    for the formula): per element, with ``f = numer/sigma``, ``w = (s - (1 + u)) + y*(-f)``,
    ``m = floor(w*(1/k) + (K0/k + 1/2))``, ``g = ((w - m*k) + K0) * step + y``, ``step =
    sigma*step_factor``; float32 where ``k <= 256``, ``f`` fits float32 and ``f * max|y| <
    1e30`` over the bucket's own ``y`` (NaN and Inf count as too large), else float64.
    [CHOICE] The bucket's maximum is read in the decoding loop itself and the rare bucket that
    fails it is decoded again (:func:`_redo_wide`); with one bucket (``bucket_size`` 0) the
    caller passes ``ymax``, the maximum over the whole of ``y``. Zero buckets give +0.0. Tiles
    and ``accumulate`` as in :func:`decode_affine_tiles`. ``ytops[t]``: the largest ``|y|`` bit
    pattern of tile ``t`` (the caller's bound on the output). Where ``absbits`` has one entry
    per tile (and not ``accumulate``), ``absbits[t]`` is the bit pattern of the tile's largest
    ``|value|``, read while the tile is in cache: ``>= 0x7F800000`` exactly when it holds a NaN
    or an Inf."""
    n = out.size
    tiles = (n + unit - 1) // unit
    obits = out.view(np.uint32)
    ybits = y.view(np.uint32)
    check = absbits.size == tiles and not accumulate
    for t in prange(tiles):
        lo = t * unit
        hi = min(n, lo + unit)
        m = hi - lo
        words = np.empty(min(m, DITHER_SPAN), dtype=np.uint32)
        ones = words.view(np.float32)
        dst = np.empty(m, dtype=np.float32) if accumulate else out
        base = lo if accumulate else 0
        b0 = 0 if bucket_size == 0 else lo // bucket_size
        ytop = np.zeros(1 if bucket_size == 0 else (hi - 1) // bucket_size + 1 - b0, np.uint32)
        sym = _unpacked_tile(packed, lo, m, bits, kind, tops, t)
        a = lo
        while a < hi:  # the dither one span at a time (see DITHER_SPAN)
            z = min(hi, a + DITHER_SPAN)
            fill_uniform(k0, k1, stream, a, words[: z - a])
            _nested_slices(
                sym[a - lo :], ones, a, z, scales, bucket_size, numer, step_factor, k, K0, ymax,
                y, ybits, dst, base, ytop, b0,
            )  # fmt: skip
            a = z
        if bucket_size > 0:
            _redo_wide(
                lo, hi, sym, words, scales, bucket_size, numer, step_factor, k, K0, k0, k1,
                stream, y, dst, base, ytop, b0,
            )  # fmt: skip
        ytops[t] = bucket_absmax_bits(ytop, 0, ytop.size)
        if accumulate:
            _add_tile(out, lo, dst)
        elif check:
            absbits[t] = bucket_absmax_bits(obits, lo, hi)


# -- Python entry points ---------------------------------------------------------------------


class NestedDecoded(NamedTuple):
    """:func:`fused_decode_nested`'s result."""

    values: torch.Tensor
    #: the largest ``|y|`` of the side information (``inf`` if it holds a NaN or an Inf)
    ymax: float
    #: a decoded value is NaN or Inf (False when adding into ``out``: not checked)
    nonfinite: bool


def fused_encode(
    x: torch.Tensor,
    scales: torch.Tensor | None,
    bucket_size: int,
    numer: float,
    seed: int,
    stream: int,
    nsum: int,
    c: float,
    top: int,
    modk: int,
    fast_ok: bool,
    bits: int,
    out: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Scales and fixed-packed symbols of a CPU float32 ``x`` in one parallel pass, written
    into ``out`` (``uint8``, 4-byte aligned: the buckets' float32 scales, then the ``bits``-bit
    packed symbols; a payload's body, so nothing is copied). Returns the two parts as views:
    float32 scales, ``uint8`` packed symbols.

    ``scales``: the single scale of a one-bucket tensor (computed by the caller), or None to
    compute every bucket's in the kernel. ``bucket_size`` 0 means one bucket.
    """
    n = x.numel()
    bs = effective_bucket_size(n, bucket_size)
    nb = max(1, num_buckets(n, bucket_size))  # one scale even for an empty tensor
    nbytes = 4 * nb + packed_bytes(n, bits)
    if out.size != nbytes:
        raise ValueError(f"the encoding of {n} elements takes {nbytes} bytes, not {out.size}")
    sc = out[: 4 * nb].view(np.float32)
    packed = out[4 * nb :]
    if scales is not None:
        sc[:] = scales.to(torch.float32).numpy()
    call_parallel(
        encode_tiles,
        x.contiguous().numpy(),
        sc,
        scales is None,
        bs,
        tile_elements(bs, n),
        float(numer),
        seed & 0xFFFFFFFF,
        seed >> 32,
        stream,
        nsum,
        float(c),
        top,
        modk,
        np.float32(inverse_rounded_up(modk) if modk > 0 else 0.0),
        fast_ok,
        np.empty(0, dtype=np.uint8 if top <= 255 else np.int32),
        packed,
        bits,
    )
    return sc, packed


def _checked_tops(tops: np.ndarray, alphabet: int, what: str) -> None:
    if tops.size and int(tops.max()) >= alphabet:
        raise CorruptPayloadError(
            f"{what} payload holds a symbol outside the alphabet [0, {alphabet})"
        )


_BAD_CHUNK = 1 << 16


@functools.cache
def _bad_bytes(bits: int, alphabet: int) -> np.ndarray:
    """``bad[b]`` = 1 where byte ``b`` holds a ``bits``-bit symbol ``>= alphabet``."""
    mask = (1 << bits) - 1
    table = np.zeros(256, dtype=np.int64)
    for b in range(256):
        syms = [(b >> (j * bits)) & mask for j in range(8 // bits)]
        table[b] = int(max(syms) >= alphabet)
    return table


def check_alphabet(raw: np.ndarray, n: int, bits: int, alphabet: int, unit: int, what: str) -> None:
    """Raise :class:`CorruptPayloadError` if any of the ``n`` packed symbols is ``>= alphabet``,
    reading only the packed bytes (the check a decoder that adds into a caller's tensor makes
    before writing anything). Nothing to do where every ``bits``-bit code is a symbol; a
    vectorized bit test for 2-bit ternary symbols; a byte table for other widths dividing 8 (one look-up per byte); else an unpacking pass per tile."""
    if alphabet >= 1 << bits:
        return
    if bits == 2 and alphabet == 3:  # DQSG M=1, TernGrad, QSGD s=1: the common case
        whole = raw.size // 8 * 8
        tail = raw[whole:]
        if ternary_code_flag(raw[:whole].view(np.uint64)) or (tail & (tail >> 1) & 0x55).any():
            raise CorruptPayloadError(
                f"{what} payload holds a symbol outside the alphabet [0, {alphabet})"
            )
        return
    if 8 % bits == 0:
        counts = np.zeros(-(-raw.size // _BAD_CHUNK), dtype=np.int64)
        call_parallel(bad_byte_counts, raw, _bad_bytes(bits, alphabet), _BAD_CHUNK, counts)
        if counts.any():
            raise CorruptPayloadError(
                f"{what} payload holds a symbol outside the alphabet [0, {alphabet})"
            )
        return
    tops = np.zeros(-(-n // unit), dtype=np.uint64)
    call_parallel(symbol_tops, raw, bits, n, unit, tops)
    _checked_tops(tops, alphabet, what)


def accumulator(out: torch.Tensor | None, n: int) -> np.ndarray:
    """The float32 array a kernel writes: a fresh one (recycled memory, see
    :mod:`gradzip.buffers`), or ``out``'s memory to write or add into."""
    if out is None:
        return fresh_array(n, np.float32)
    if out.dtype != torch.float32 or out.device.type != "cpu" or not out.is_contiguous():
        raise ValueError("a fused decode adds only into a contiguous float32 CPU tensor")
    if out.numel() != n:
        raise ValueError(f"cannot add {n} decoded values into a tensor of {out.numel()}")
    return out.detach().view(-1).numpy()


def fused_decode_affine(
    data: torch.Tensor,
    n: int,
    alphabet: int,
    scales: torch.Tensor,
    bucket_size: int,
    divisor: float,
    c: float,
    dithered: bool,
    seed: int,
    stream: int,
    wide: bool,
    what: str,
    out: torch.Tensor | None = None,
    add: bool = True,
) -> torch.Tensor:
    """Unpack, regenerate the dither and reconstruct in one parallel pass (DQSG, half dither).

    With ``out`` (contiguous float32, CPU), the values are added into it instead
    (``out[i] + v_i``, the bits of decoding and then adding) and ``out`` is returned; the
    symbols are checked against the alphabet first (:func:`check_alphabet`), so a corrupt
    stream raises with ``out`` untouched. With ``out`` and ``add=False`` they are written into
    ``out`` (no fresh output; a corrupt stream raises with ``out`` partly written). [CHOICE] A check pass over the packed bytes before
    the single decoding pass, rather than decoding into a dense buffer and adding once the
    stream is validated: the check reads ``bits/8`` bytes per element (nothing for full
    alphabets), the buffer would cost a write and a read of 4.
    """
    bits = symbol_bits(alphabet)
    check_packed(data, n, bits)
    bs = effective_bucket_size(n, bucket_size)
    unit = tile_elements(bs, n)
    raw = data.contiguous().numpy()
    target = accumulator(out, n)
    accumulate = out is not None and add
    if accumulate:
        check_alphabet(raw, n, bits, alphabet, unit, what)
    tops = np.zeros(-(-n // unit), dtype=np.uint64)
    call_parallel(
        decode_affine_tiles,
        raw,
        bits,
        scales.contiguous().numpy(),
        bs,
        unit,
        float(divisor),
        float(c),
        dithered,
        seed & 0xFFFFFFFF,
        seed >> 32,
        stream,
        wide,
        target,
        tops,
        accumulate,
        symbol_kind(bits),
    )
    _checked_tops(tops, alphabet, what)
    return torch.from_numpy(target) if out is None else out


def fused_decode_nested(
    data: torch.Tensor,
    n: int,
    k: int,
    scales: torch.Tensor,
    bucket_size: int,
    numer: float,
    step_factor: float,
    K0: float,
    seed: int,
    stream: int,
    y: torch.Tensor,
    what: str,
    out: torch.Tensor | None = None,
    into: torch.Tensor | None = None,
) -> NestedDecoded:
    """NDQSG's unpack, dither and nested reconstruction in one parallel pass: into a fresh
    tensor, or written into ``into`` (1-D float32, CPU), or with ``out`` added into it after the
    alphabet check, as in :func:`fused_decode_affine`. Returns the values with ``max|y|`` (read
    by the kernel; ``inf`` where ``y`` holds a NaN or an Inf) and, unless adding, whether a
    decoded value is non-finite (found while each tile is in cache); the caller decides what
    that means, as the bound on the output depends on ``max|y|``."""
    bits = symbol_bits(k)
    check_packed(data, n, bits)
    bs = effective_bucket_size(n, bucket_size)
    unit = tile_elements(bs, n)
    raw = data.contiguous().numpy()
    y32 = y.to(torch.float32).contiguous()
    ymax = 0.0
    if bs == 0:  # one bucket: its rule needs the whole of y's maximum first
        lo, hi = torch.aminmax(y32)
        ymax = max(-float(lo), float(hi))
    if out is not None:
        target = accumulator(out, n)
        check_alphabet(raw, n, bits, k, unit, what)
    elif into is not None:
        target = into.numpy()
    else:
        target = accumulator(None, n)
    tops = np.zeros(-(-n // unit), dtype=np.uint64)
    absbits = np.zeros(tops.size if out is None else 0, dtype=np.uint32)
    ytops = np.zeros(tops.size, dtype=np.uint32)
    call_parallel(
        decode_nested_tiles,
        raw,
        bits,
        scales.contiguous().numpy(),
        bs,
        unit,
        float(numer),
        float(step_factor),
        k,
        float(K0),
        ymax,
        seed & 0xFFFFFFFF,
        seed >> 32,
        stream,
        y32.numpy(),
        target,
        tops,
        out is not None,
        absbits,
        ytops,
        symbol_kind(bits),
    )
    _checked_tops(tops, k, what)
    top = int(ytops.max()) if ytops.size else 0
    seen = float("inf") if top >= 0x7F800000 else float(np.uint32(top).view(np.float32))
    values = out if out is not None else into if into is not None else torch.from_numpy(target)
    nonfinite = bool(absbits.size) and int(absbits.max()) >= 0x7F800000
    return NestedDecoded(values, seen, nonfinite)
