"""Philox4x32-10 counter-based generator as numba kernels (the CPU path).

Philox4x32-10 (Salmon, Moraes, Dror & Shaw, "Parallel random numbers: as easy as 1, 2, 3",
SC 2011; the generator of cuRAND, PyTorch's CUDA generator and Triton's ``tl.rand``) maps a
128-bit counter ``(c0, c1, c2, c3)`` and a 64-bit key ``(k0, k1)`` to four 32-bit words by ten
rounds of two 32x32->64-bit multiplications; the key is bumped by the Weyl constants between
rounds. Any word of a stream can be computed on its own, so generation vectorizes and
parallelizes, and a CPU and a GPU produce the same words.

Stream layout [CHOICE] (the contract of every stream in :mod:`gradzip.rng`):

* key: ``k0 = seed & 0xFFFFFFFF``, ``k1 = seed >> 32`` for the 63-bit seed of
  :func:`gradzip.rng.derive_seed`;
* counter: ``c0, c1`` = the low and high 32 bits of the block index ``i // 4``, ``c2`` = the
  stream's domain (:data:`SHARED_UNIFORM` = 0 for shared dithers, :data:`LOCAL_UNIFORM` = 1 for the
  sender's own randomness, :data:`SHARED_WORDS` = 2 for shared random indices,
  :data:`LOCAL_WORDS` = 3 reserved), ``c3 = 0``;
* element ``i`` of a stream is word ``i % 4`` of the block with counter ``i // 4``.

So the output does not depend on how a stream is split between threads, kernels or devices.
A word ``w`` becomes the float32 ``1 + (w >> 9) * 2**-23`` (bit pattern ``(w >> 9) |
0x3F800000``), exactly; subtracting 1 (exact) gives a uniform in ``[0, 1)`` with 23 bits.

Kernels: ``nogil``, ``cache=True`` (compiled once per machine, then loaded from the cache),
no ``fastmath``; integer arithmetic only, in ``uint64`` holding 32-bit values so numba never
mixes signed and unsigned integers (which it would promote to float64).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from gradzip.kernels._threads import call_parallel

#: counter word ``c2`` of each stream domain
SHARED_UNIFORM = 0
LOCAL_UNIFORM = 1
SHARED_WORDS = 2
LOCAL_WORDS = 3

_M0 = np.uint64(0xD2511F53)
_M1 = np.uint64(0xCD9E8D57)
_W0 = np.uint64(0x9E3779B9)
_W1 = np.uint64(0xBB67AE85)
_LOW32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)
#: a 32-bit value times this is that value in both halves of a ``uint64``
_PAIR = np.uint64(0x0000000100000001)
_BLOCKS_PER_HIGH_WORD = 1 << 32
#: (shift, or-mask) turning a word into itself, or into the bits of the float32 ``1 + u``
_AS_WORD = (np.uint32(0), np.uint32(0))
_AS_FLOAT = (np.uint32(9), np.uint32(0x3F800000))
#: elements per parallel task of the bulk generator (a multiple of 4)
_TASK = 1 << 16


@njit(inline="always", nogil=True, cache=True)
def philox_rounds(c0, c1, c2, c3, k0, k1):  # type: ignore[no-untyped-def]
    """The ten rounds on ``uint64`` lanes: returns four ``uint64`` whose LOW 32 bits are the
    output words; the high 32 bits are garbage (mask with ``0xFFFFFFFF`` before use).

    Why [CHOICE]: every product is ``(x & 0xFFFFFFFF) * M`` with ``M < 2**32``, which x86 does in
    one ``pmuludq`` (reading only the low half of each 64-bit lane, so LLVM drops the mask), and
    ``lo(p)`` is ``p`` itself; only the high half needs a shift. A round is then two multiplies,
    two shifts and two three-way xors per 8 blocks (AVX-512) or 4 blocks (AVX2), with no
    narrowing to ``uint32`` and back. The key schedule does not depend on the counter, so it is
    hoisted out of a loop over blocks (twenty broadcast constants)."""
    c0 = np.uint64(c0)
    c1 = np.uint64(c1)
    c2 = np.uint64(c2)
    c3 = np.uint64(c3)
    ka = np.uint64(k0) & _LOW32
    kb = np.uint64(k1) & _LOW32
    for _ in range(10):
        p0 = _M0 * (c0 & _LOW32)
        p1 = _M1 * (c2 & _LOW32)
        c0 = (p1 >> _S32) ^ c1 ^ ka
        c2 = (p0 >> _S32) ^ c3 ^ kb
        c1 = p1
        c3 = p0
        ka = (ka + _W0) & _LOW32
        kb = (kb + _W1) & _LOW32
    return c0, c1, c2, c3


@njit(inline="always", nogil=True, cache=True)
def philox4x32_10(c0, c1, c2, c3, k0, k1):  # type: ignore[no-untyped-def]
    """The four output words (``uint32``) of counter ``(c0..c3)`` under key ``(k0, k1)``.

    Arguments are 32-bit values of any integer type."""
    w0, w1, w2, w3 = philox_rounds(
        np.uint64(c0) & _LOW32,
        np.uint64(c1) & _LOW32,
        np.uint64(c2) & _LOW32,
        np.uint64(c3) & _LOW32,
        k0,
        k1,
    )
    return (
        np.uint32(w0 & _LOW32),
        np.uint32(w1 & _LOW32),
        np.uint32(w2 & _LOW32),
        np.uint32(w3 & _LOW32),
    )


@njit(inline="always", nogil=True, cache=True)
def one_plus_uniform_bits(w):  # type: ignore[no-untyped-def]
    """Bit pattern (``uint32``) of the float32 ``1 + (w >> 9) * 2**-23`` for a 32-bit word."""
    return (np.uint32(w) >> np.uint32(9)) | np.uint32(0x3F800000)


@njit(inline="always", nogil=True, cache=True)
def _word(w0, w1, w2, w3, j):  # type: ignore[no-untyped-def]
    if j == 0:
        return w0
    if j == 1:
        return w1
    if j == 2:
        return w2
    return w3


@njit(nogil=True, cache=True)
def _fill_blocks(pairs, first, k0, k1, stream, shift, orbits):  # type: ignore[no-untyped-def]
    """Whole blocks ``first, first + 1, ...`` into ``pairs`` (``uint64``, two per block: words
    0|1 and 2|3, little-endian), each word ``w`` as ``(w >> shift) | orbits``. The blocks must
    share their counter's high word ``first >> 32``.

    Why [CHOICE]: with ``c1``, ``c2``, ``c3`` loop-invariant LLVM hoists the first round's
    constant product out of the loop, and the loop over blocks vectorizes across blocks (one
    block per SIMD lane, structure of arrays in registers). Two words are combined into one
    ``uint64`` before the shift, then ``keep`` clears the bits the shift moved from the high word
    into the low one: two operations per pair instead of per word, and two permutes per 8
    blocks interleave them into the stream order."""
    c1 = first >> _S32
    c2 = np.uint64(stream)
    c3 = np.uint64(0)
    sh = np.uint64(shift)
    keep = (_LOW32 >> sh) * _PAIR
    ob = np.uint64(orbits) * _PAIR
    for blk in range(pairs.size // 2):
        w0, w1, w2, w3 = philox_rounds(first + np.uint64(blk), c1, c2, c3, k0, k1)
        pairs[2 * blk] = ((((w0 & _LOW32) | (w1 << _S32)) >> sh) & keep) | ob
        pairs[2 * blk + 1] = ((((w2 & _LOW32) | (w3 << _S32)) >> sh) & keep) | ob


@njit(nogil=True, cache=True)
def fill_stream(k0, k1, stream, offset, out, shift, orbits):  # type: ignore[no-untyped-def]
    """Elements ``offset .. offset + out.size - 1`` of stream ``(k0, k1, stream)`` into ``out``
    (``uint32``), each word ``w`` stored as ``(w >> shift) | orbits``; serial, for use inside
    other kernels. The whole blocks in the middle go through :func:`_fill_blocks` (vectorized
    across blocks); at most three words at each end are computed one at a time."""
    n = out.size
    s = np.uint32(stream)
    head = min(n, (4 - offset % 4) % 4)
    for i in range(head):
        a = offset + i
        b = np.uint64(a // 4)
        w0, w1, w2, w3 = philox4x32_10(b & _LOW32, b >> _S32, s, 0, k0, k1)
        out[i] = (_word(w0, w1, w2, w3, a % 4) >> shift) | orbits
    whole = (n - head) // 4
    first = (offset + head) // 4
    pairs = out[head : head + 4 * whole].view(np.uint64)
    done = 0
    while done < whole:
        # split where the counter's high word changes (at most once per 2**32 blocks)
        b = np.uint64(first + done)
        room = _BLOCKS_PER_HIGH_WORD - np.int64(b & _LOW32)
        count = min(whole - done, room)
        _fill_blocks(pairs[2 * done : 2 * (done + count)], b, k0, k1, s, shift, orbits)
        done += count
    tail = head + 4 * whole
    if tail < n:
        b = np.uint64(first + whole)
        w0, w1, w2, w3 = philox4x32_10(b & _LOW32, b >> _S32, s, 0, k0, k1)
        for j in range(n - tail):
            out[tail + j] = (_word(w0, w1, w2, w3, j) >> shift) | orbits


@njit(nogil=True, cache=True, parallel=True)
def _bulk(k0, k1, stream, offset, out, shift, orbits):  # type: ignore[no-untyped-def]
    """:func:`fill_stream` split into tasks of ``_TASK`` elements run in parallel; every element
    is computed from its own index, so the result does not depend on the thread count."""
    n = out.size
    tasks = (n + _TASK - 1) // _TASK
    for t in prange(tasks):
        lo = t * _TASK
        hi = min(n, lo + _TASK)
        fill_stream(k0, k1, stream, offset + lo, out[lo:hi], shift, orbits)


def _check(seed: int, stream: int, offset: int, n: int) -> None:
    if not 0 <= seed < 2**64:
        raise ValueError(f"Philox seed must lie in [0, 2**64), got {seed}")
    if not 0 <= stream < 2**32:
        raise ValueError(f"Philox stream id must lie in [0, 2**32), got {stream}")
    if n < 0 or offset < 0 or offset + n > 2**66:
        raise ValueError(f"cannot draw {n} values at offset {offset} of a Philox stream")


def philox_words(seed: int, stream: int, offset: int, n: int) -> np.ndarray:
    """``n`` raw 32-bit words (``uint32``) of stream ``(seed, stream)`` from element ``offset``."""
    _check(seed, stream, offset, n)
    out = np.empty(n, dtype=np.uint32)
    call_parallel(_bulk, seed & 0xFFFFFFFF, seed >> 32, stream, offset, out, *_AS_WORD)
    return out


def philox_one_plus_uniform(seed: int, stream: int, offset: int, n: int) -> np.ndarray:
    """``n`` float32 ``1 + u`` in ``[1, 2)`` of stream ``(seed, stream)`` from element
    ``offset`` (``u`` has 23 random bits; exact)."""
    _check(seed, stream, offset, n)
    out = np.empty(n, dtype=np.uint32)
    call_parallel(_bulk, seed & 0xFFFFFFFF, seed >> 32, stream, offset, out, *_AS_FLOAT)
    return out.view(np.float32)


def philox_block(counter: tuple[int, int, int, int], key: tuple[int, int]) -> tuple[int, ...]:
    """One Philox4x32-10 block (for known-answer tests): four 32-bit words."""
    return tuple(int(w) for w in _one_block(*counter, *key))


@njit(nogil=True, cache=True)
def _one_block(c0, c1, c2, c3, k0, k1):  # type: ignore[no-untyped-def]
    return philox4x32_10(c0, c1, c2, c3, k0, k1)


def thread_count() -> int:
    """numba's current thread count (the bulk kernels' parallelism)."""
    return int(numba.get_num_threads())
