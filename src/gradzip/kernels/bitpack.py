"""Fixed-width bit packing of one tile of symbols, as numba building blocks for fused kernels.

The layout is :mod:`gradzip.codecs.bitpack`'s: symbol ``j`` occupies bits ``j*b .. j*b + b - 1``
of one little-endian, LSB-first stream. A tile starts at a symbol index that is a multiple of 8,
so it starts on a byte boundary for every width ``b`` and tiles pack independently (in
parallel). Widths up to 32 bits; 8 symbols of ``b`` bits fill exactly ``b`` bytes.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(inline="always", nogil=True, cache=True)
def pack_tile(symbols, start, count, bits, out):  # type: ignore[no-untyped-def]
    """Pack ``symbols[start:start + count]`` (``start % 8 == 0``) into ``out`` from byte
    ``start * bits // 8``; the last partial group (end of the stream) is zero-padded."""
    base = start * bits // 8
    groups = count // 8
    src = symbols[start : start + 8 * groups]
    dst = out[base : base + bits * groups]
    if bits == 2 and symbols.itemsize == 1:  # four uint8 symbols per byte, as uint32 lanes
        _pack2_lanes(src.view(np.uint32), dst)
    elif bits == 2:  # four whole symbols per byte (the ternary codecs)
        for p in range(2 * groups):
            dst[p] = np.uint8(
                (src[4 * p] & 3)
                | ((src[4 * p + 1] & 3) << 2)
                | ((src[4 * p + 2] & 3) << 4)
                | ((src[4 * p + 3] & 3) << 6)
            )
    elif bits == 3:  # eight symbols in three bytes
        for g in range(groups):
            acc = np.uint32(0)
            for j in range(8):
                acc |= (np.uint32(src[8 * g + j]) & np.uint32(7)) << np.uint32(3 * j)
            dst[3 * g] = np.uint8(acc & np.uint32(255))
            dst[3 * g + 1] = np.uint8((acc >> np.uint32(8)) & np.uint32(255))
            dst[3 * g + 2] = np.uint8(acc >> np.uint32(16))
    elif bits == 8:  # one symbol per byte
        for p in range(8 * groups):
            dst[p] = np.uint8(src[p] & 255)
    elif bits == 4:  # two symbols per byte
        for p in range(4 * groups):
            dst[p] = np.uint8((src[2 * p] & 15) | ((src[2 * p + 1] & 15) << 4))
    elif bits == 1:  # eight symbols per byte
        for p in range(groups):
            acc8 = np.uint32(0)
            for j in range(8):
                acc8 |= (np.uint32(src[8 * p + j]) & np.uint32(1)) << np.uint32(j)
            dst[p] = np.uint8(acc8)
    elif bits <= 8:
        for g in range(groups):
            acc = np.uint64(0)
            for j in range(8):
                acc |= np.uint64(symbols[start + 8 * g + j]) << np.uint64(j * bits)
            for j in range(bits):
                out[base + g * bits + j] = np.uint8((acc >> np.uint64(8 * j)) & np.uint64(255))
    else:
        for g in range(groups):
            _pack_wide_group(symbols, start + 8 * g, 8, bits, out, base + g * bits)
    rest = count - 8 * groups
    if rest:
        _pack_wide_group(symbols, start + 8 * groups, rest, bits, out, base + groups * bits)


@njit(inline="always", nogil=True, cache=True)
def _pack2_lanes(quads, dst):  # type: ignore[no-untyped-def]
    """2-bit packing of ``uint8`` symbols read four at a time as little-endian ``uint32``
    words ``s0 | s1 << 8 | s2 << 16 | s3 << 24``: after masking each to its two low bits,
    ``w | w >> 6`` puts ``s1`` next to ``s0`` (bits 2-3) and ``s3`` next to ``s2`` (bits 18-19),
    and ``| >> 12`` brings the pair ``s2, s3`` down to bits 4-7; the shifted-in bits land above
    bit 7 or on zeros. One contiguous, branch-free loop over words that LLVM vectorizes, where
    four strided byte loads per output byte did not."""
    mask = np.uint32(0x03030303)
    for p in range(quads.size):
        w = quads[p] & mask
        w = w | (w >> np.uint32(6))
        w = w | (w >> np.uint32(12))
        dst[p] = np.uint8(w & np.uint32(255))


@njit(inline="always", nogil=True, cache=True)
def _pack_wide_group(symbols, first, count, bits, out, byte0):  # type: ignore[no-untyped-def]
    """Pack ``count <= 8`` symbols of up to 32 bits from ``symbols[first]`` at byte ``byte0``,
    writing only the ``ceil(count * bits / 8)`` bytes they touch."""
    acc = np.uint64(0)
    have = 0
    pos = byte0
    mask = np.uint64((1 << bits) - 1)
    for j in range(count):
        acc |= (np.uint64(symbols[first + j]) & mask) << np.uint64(have)
        have += bits
        while have >= 8:
            out[pos] = np.uint8(acc & np.uint64(255))
            acc >>= np.uint64(8)
            have -= 8
            pos += 1
    if have > 0:
        out[pos] = np.uint8(acc & np.uint64(255))


@njit(inline="always", nogil=True, cache=True)
def unpack_tile(packed, start, count, bits, symbols):  # type: ignore[no-untyped-def]
    """Inverse of :func:`pack_tile`: ``count`` symbols from byte ``start * bits // 8`` into
    ``symbols[0:count]``; returns the largest symbol seen (for the alphabet check)."""
    base = start * bits // 8
    if bits == 8 or bits == 4 or bits == 2 or bits == 1:
        return _unpack_whole_bytes(packed, base, count, bits, symbols)
    mask = np.uint64((1 << bits) - 1)
    top = np.uint64(0)
    groups = count // 8
    for g in range(groups):
        acc = np.uint64(0)
        if bits <= 8:
            for j in range(bits):
                acc |= np.uint64(packed[base + g * bits + j]) << np.uint64(8 * j)
            for j in range(8):
                s = (acc >> np.uint64(j * bits)) & mask
                symbols[8 * g + j] = s
                top = max(top, s)
        else:
            top = max(top, _unpack_wide(packed, base + g * bits, 8, bits, symbols, 8 * g))
    rest = count - 8 * groups
    if rest:
        top = max(top, _unpack_wide(packed, base + groups * bits, rest, bits, symbols, 8 * groups))
    return top


@njit(inline="always", nogil=True, cache=True)
def _unpack_whole_bytes(packed, base, count, bits, sym):  # type: ignore[no-untyped-def]
    """:func:`unpack_tile` for widths 1, 2, 4 and 8 (whole symbols per byte), in straight loops
    over the bytes that LLVM vectorizes, into a buffer of any unsigned integer type."""
    per = 8 // bits
    mask = (1 << bits) - 1
    src = packed[base : base + (count + per - 1) // per]
    whole = count // per
    if bits == 2:
        for j in range(whole):
            byte = np.uint32(src[j])
            sym[4 * j] = byte & np.uint32(3)
            sym[4 * j + 1] = (byte >> np.uint32(2)) & np.uint32(3)
            sym[4 * j + 2] = (byte >> np.uint32(4)) & np.uint32(3)
            sym[4 * j + 3] = byte >> np.uint32(6)
    elif bits == 4:
        for j in range(whole):
            byte = np.uint32(src[j])
            sym[2 * j] = byte & np.uint32(15)
            sym[2 * j + 1] = byte >> np.uint32(4)
    elif bits == 8:
        for j in range(whole):
            sym[j] = np.uint32(src[j])
    else:
        for j in range(whole):
            byte = np.uint32(src[j])
            for k in range(8):
                sym[8 * j + k] = (byte >> np.uint32(k)) & np.uint32(1)
    for k in range(count - whole * per):  # the stream's last, partial byte
        sym[whole * per + k] = (np.uint32(src[whole]) >> np.uint32(k * bits)) & np.uint32(mask)
    top = np.uint32(0)
    for j in range(count):
        top = max(top, np.uint32(sym[j]))
    return np.uint64(top)


@njit(inline="always", nogil=True, cache=True)
def _unpack_wide(packed, byte0, count, bits, symbols, first):  # type: ignore[no-untyped-def]
    mask = np.uint64((1 << bits) - 1)
    acc = np.uint64(0)
    have = 0
    pos = byte0
    top = np.uint64(0)
    for j in range(count):
        while have < bits:
            acc |= np.uint64(packed[pos]) << np.uint64(have)
            pos += 1
            have += 8
        s = acc & mask
        symbols[first + j] = s
        top = max(top, s)
        acc >>= np.uint64(bits)
        have -= bits
    return top


@njit(inline="always", nogil=True, cache=True)
def unpack_tile_narrow(packed, start, count, bits, symbols):  # type: ignore[no-untyped-def]
    """:func:`unpack_tile` for widths up to 8 bits into a ``uint8`` buffer, with the 2-bit
    (four symbols per byte) and 3-bit (eight symbols in three bytes) layouts in loops of their
    own that LLVM unrolls and vectorizes. The largest symbol comes from a separate max-reduction
    over the buffer (branch-free, vectorized), returned for the alphabet check once per tile."""
    base = start * bits // 8
    if bits == 2:
        done = 4 * (count // 4)
        src = packed[base : base + done // 4]
        dst = symbols[:done]
        for p in range(done // 4):
            byte = src[p]
            dst[4 * p] = byte & 3
            dst[4 * p + 1] = (byte >> 2) & 3
            dst[4 * p + 2] = (byte >> 4) & 3
            dst[4 * p + 3] = byte >> 6
    elif bits == 3:
        done = 8 * (count // 8)
        src = packed[base : base + 3 * (done // 8)]
        dst = symbols[:done]
        for g in range(done // 8):
            acc = (
                np.uint32(src[3 * g])
                | (np.uint32(src[3 * g + 1]) << np.uint32(8))
                | (np.uint32(src[3 * g + 2]) << np.uint32(16))
            )
            for j in range(8):
                dst[8 * g + j] = np.uint8((acc >> np.uint32(3 * j)) & np.uint32(7))
    else:
        done = 8 * (count // 8)
        mask = np.uint64((1 << bits) - 1)
        for g in range(done // 8):
            acc = np.uint64(0)
            for j in range(bits):
                acc |= np.uint64(packed[base + g * bits + j]) << np.uint64(8 * j)
            for j in range(8):
                symbols[8 * g + j] = np.uint8((acc >> np.uint64(j * bits)) & mask)
    if done < count:
        _unpack_wide(packed, base + done * bits // 8, count - done, bits, symbols, done)
    top = np.uint8(0)
    for i in range(count):
        top = max(top, symbols[i])
    return np.uint64(top)
