"""Golomb-Rice coding as serial numba kernels (the layout of :mod:`gradzip.codecs.golomb_rice`).

Bit ``i`` of a stream is bit ``i % 32`` of little-endian ``uint32`` word ``i // 32``. A value
``v`` with parameter ``K`` is ``q = v >> K`` one-bits, a zero-bit, then the ``K`` low bits of
``v``, least significant first; the last word is padded with one-bits.

Why serial kernels [CHOICE]: the codes are variable-length, so a value's position depends on
every value before it; one pass with a 64-bit bit buffer writes or reads each value in a few
operations (about 2-4 ns a value), where the vectorised NumPy formulation (one byte per bit,
pointer doubling over the zero-bits) spent 100-200 ns a value on a 1%-dense top-k set. Integer
arithmetic only, in ``uint64``, so the bits do not depend on the CPU.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_ONES32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)
#: decoder status codes (the Python wrapper raises the matching error)
OK, TRUNCATED, OVERFLOW, FULL = 0, 1, 2, 3


@njit(nogil=True, cache=True)
def encode_words(values, k, out):  # type: ignore[no-untyped-def]
    """Write the codes of ``values`` (non-negative ``int64``) into ``out`` (``uint32``, exactly
    ``ceil(total bits / 32)`` words, at least one), padding the last word with one-bits."""
    kk = np.uint64(k)
    low = (np.uint64(1) << kk) - np.uint64(1)
    acc = np.uint64(0)  # pending bits, the oldest in bit 0
    n = np.uint64(0)  # how many (< 32 between values)
    w = 0
    for i in range(values.size):
        v = np.uint64(values[i])
        q = v >> kk
        while q > np.uint64(0):  # the unary part, up to 32 ones at a time
            c = q if q < _S32 else _S32
            acc |= ((np.uint64(1) << c) - np.uint64(1)) << n
            n += c
            q -= c
            if n >= _S32:
                out[w] = np.uint32(acc & _ONES32)
                w += 1
                acc >>= _S32
                n -= _S32
        n += np.uint64(1)  # the terminating zero: nothing to set
        acc |= (v & low) << n
        n += kk
        if n >= _S32:
            out[w] = np.uint32(acc & _ONES32)
            w += 1
            acc >>= _S32
            n -= _S32
    if n > np.uint64(0) or w == 0:
        acc |= _ONES32 << n  # padding ones (garbage above bit 31 is dropped below)
        out[w] = np.uint32(acc & _ONES32)
        w += 1
    return w


@njit(nogil=True, cache=True)
def decode_words(words, k, out):  # type: ignore[no-untyped-def]
    """Read the codes of ``words`` into ``out`` (``int64``) until a unary run reaches the end of
    the stream. Returns ``(count, status, end)``: the values read, :data:`OK` or the first
    problem (:data:`TRUNCATED`: the stream ends inside a remainder; :data:`OVERFLOW`: a quotient
    of ``2**(62 - K)`` or more; :data:`FULL`: more values than ``out`` holds), and the bit just
    after the last value's remainder."""
    total = np.uint64(32) * np.uint64(words.size)
    kk = np.uint64(k)
    limit = np.uint64(1) << (np.uint64(62) - kk)
    pos = np.uint64(0)
    end = np.uint64(0)
    count = 0
    while True:
        # the unary run: count one-bits from pos, a word at a time
        q = np.uint64(0)
        while True:
            if pos >= total:
                return count, OK, end
            word = np.uint64(words[pos >> np.uint64(5)])
            off = pos & np.uint64(31)
            rest = (~word & _ONES32) >> off  # zeros of the word from pos on, as ones
            if rest == np.uint64(0):
                step = _S32 - off
                q += step
                pos += step
                continue
            # ones before the terminator: the trailing zeros of rest, from its lowest set bit
            # (a power of two up to 2**31, exact as a float64, so log2 is exact)
            lowest = rest & (~rest + np.uint64(1))
            run = np.uint64(np.int64(np.log2(np.float64(lowest))))
            q += run
            pos += run + np.uint64(1)  # past the terminator
            break
        if q >= limit:
            return count, OVERFLOW, end
        if pos + kk > total:
            return count, TRUNCATED, end
        r = np.uint64(0)
        got = np.uint64(0)
        while got < kk:  # the remainder, possibly across a word boundary
            off = pos & np.uint64(31)
            take = kk - got
            if take > _S32 - off:
                take = _S32 - off
            bits = (np.uint64(words[pos >> np.uint64(5)]) >> off) & (
                (np.uint64(1) << take) - np.uint64(1)
            )
            r |= bits << got
            got += take
            pos += take
        if count >= out.size:
            return count, FULL, end
        out[count] = np.int64((q << kk) | r)
        count += 1
        end = pos
