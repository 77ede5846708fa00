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

Float streams [CHOICE] (the uniforms of dithers and stochastic rounding): element ``i`` is the
16-bit half ``h = (w >> (16 * (i % 2))) & 0xFFFF`` (low half first) of word ``w = i // 2`` of the
word stream above, stored as the float32 ``1 + (h + 1/2) * 2**-16`` (bit pattern ``0x3F800000 |
(h << 7) | 0x40``), exactly. Subtracting 1 (exact) gives ``u``, one of the ``2**16`` midpoints
``(h + 1/2) / 2**16`` of ``(0, 1)``: ``u`` never reaches 0 or 1, is symmetric about 1/2 and has
mean exactly 1/2. Why: two uniforms per word halve the Philox work per uniform (about half of a
dithered codec's time went into the generator). The price is a coarser grid: a subtractive dither
or a stochastic rounding driven by such a ``u`` is biased by at most ``2**-17`` of a quantization
step (``P(round up) = p`` within ``2**-17``), four orders of magnitude below the quantization
noise's standard deviation ``step / sqrt(12)``. Raw word streams (random indices) keep all 32 bits.

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
_LOW16 = np.uint64(0xFFFF)
_HIGH16 = np.uint64(0xFFFF0000)
#: bit pattern of the float32 ``1 + 2**-17``: exponent of 1.0 plus the half-step ``0x40``
_ONE_PLUS_HALF_STEP = np.uint32(0x3F800040)
#: a 16-bit half ``h`` goes to mantissa bits 7..22 (``h * 2**-16`` of the float32 ``1 + ...``)
_HALF_SHIFT = np.uint64(7)
#: a word's high half starts at bit 16 and must land at bit ``32 + _HALF_SHIFT`` (the mantissa
#: of the second float of a ``uint64``): a left shift by ``32 + 7 - 16``
_HIGH_HALF_SHIFT = np.uint64(23)
#: ``_ONE_PLUS_HALF_STEP`` in both halves of a ``uint64`` (the constant bits of two floats)
_ONE_PLUS_HALF_STEP_PAIR = np.uint64(0x3F800040) * _PAIR
#: float elements of one Philox block (four words, two 16-bit halves each)
_FLOATS_PER_BLOCK = 8
#: elements per parallel task of the bulk generators (a multiple of 8, so of whole blocks)
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
def one_plus_uniform_bits(h):  # type: ignore[no-untyped-def]
    """Bit pattern (``uint32``) of the float32 ``1 + (h + 1/2) * 2**-16`` for a 16-bit half
    ``h`` of a word: the midpoint of the ``h``-th of ``2**16`` equal cells of ``[1, 2)``."""
    bits = ((np.uint64(h) & _LOW16) << _HALF_SHIFT) | np.uint64(_ONE_PLUS_HALF_STEP)
    return np.uint32(bits)


@njit(inline="always", nogil=True, cache=True)
def _uniform_pair(w):  # type: ignore[no-untyped-def]
    """Both floats of word ``w`` (its low 32 bits; the high ones are ignored) as one ``uint64``:
    the low half's ``1 + u`` in bits 0..31, the high half's in bits 32..63 (stream order when
    stored little-endian). Why: two masks, two shifts and two ors give two floats, with no
    narrowing to ``uint32`` and no lane shuffles inside a word."""
    lo = (w & _LOW16) << _HALF_SHIFT
    hi = (w & _HIGH16) << _HIGH_HALF_SHIFT
    return lo | hi | _ONE_PLUS_HALF_STEP_PAIR


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
def _fill_blocks(pairs, first, k0, k1, stream):  # type: ignore[no-untyped-def]
    """Whole blocks ``first, first + 1, ...`` into ``pairs`` (``uint64``, two per block: words
    0|1 and 2|3, little-endian). The blocks must share their counter's high word ``first >> 32``.

    Why [CHOICE]: with ``c1``, ``c2``, ``c3`` loop-invariant LLVM hoists the first round's
    constant product out of the loop, and the loop over blocks vectorizes across blocks (one
    block per SIMD lane, structure of arrays in registers); two words are combined into one
    ``uint64`` per store, so two permutes per 8 blocks interleave them into the stream order."""
    c1 = first >> _S32
    c2 = np.uint64(stream)
    c3 = np.uint64(0)
    for blk in range(pairs.size // 2):
        w0, w1, w2, w3 = philox_rounds(first + np.uint64(blk), c1, c2, c3, k0, k1)
        pairs[2 * blk] = (w0 & _LOW32) | (w1 << _S32)
        pairs[2 * blk + 1] = (w2 & _LOW32) | (w3 << _S32)


@njit(inline="always", nogil=True, cache=True)
def _store_uniforms(quads, j, w0, w1, w2, w3):  # type: ignore[no-untyped-def]
    """The eight floats of one block's words into ``quads[j : j + 4]``."""
    quads[j] = _uniform_pair(w0)
    quads[j + 1] = _uniform_pair(w1)
    quads[j + 2] = _uniform_pair(w2)
    quads[j + 3] = _uniform_pair(w3)


@njit(nogil=True, cache=True)
def _fill_uniform_blocks(quads, first, k0, k1, stream):  # type: ignore[no-untyped-def]
    """Whole blocks ``first, first + 1, ...`` of a float stream into ``quads`` (``uint64``, four
    per block, each the two float32 ``1 + u`` of one word: :func:`_uniform_pair`). The blocks
    must share their counter's high word ``first >> 32``.

    Why: the loop of :func:`_fill_blocks` (one block per SIMD lane), with eight floats per block
    instead of four words, so the ten rounds are spent once per eight uniforms. Each iteration
    runs two independent blocks, one from each half of the range [CHOICE]: a round is a chain of
    dependent multiply, shift and xor, and the extra work of splitting and interleaving the
    halves leaves the out-of-order core too little room to overlap successive iterations on its
    own; two chains were faster than one (four spill registers and are much slower)."""
    c1 = first >> _S32
    c2 = np.uint64(stream)
    c3 = np.uint64(0)
    blocks = quads.size // 4
    half = blocks // 2
    for blk in range(half):
        a0, a1, a2, a3 = philox_rounds(first + np.uint64(blk), c1, c2, c3, k0, k1)
        b0, b1, b2, b3 = philox_rounds(first + np.uint64(half + blk), c1, c2, c3, k0, k1)
        _store_uniforms(quads, 4 * blk, a0, a1, a2, a3)
        _store_uniforms(quads, 4 * (half + blk), b0, b1, b2, b3)
    if blocks > 2 * half:  # an odd count: the last block on its own
        w0, w1, w2, w3 = philox_rounds(first + np.uint64(blocks - 1), c1, c2, c3, k0, k1)
        _store_uniforms(quads, 4 * (blocks - 1), w0, w1, w2, w3)


@njit(inline="always", nogil=True, cache=True)
def _block_words(k0, k1, s, b):  # type: ignore[no-untyped-def]
    """The four words (``uint32``) of block ``b`` (any non-negative integer) of domain ``s``."""
    b = np.uint64(b)
    return philox4x32_10(b & _LOW32, b >> _S32, s, 0, k0, k1)


@njit(nogil=True, cache=True)
def fill_words(k0, k1, stream, offset, out):  # type: ignore[no-untyped-def]
    """Words ``offset .. offset + out.size - 1`` of stream ``(k0, k1, stream)`` into ``out``
    (``uint32``); serial, for use inside other kernels. The whole blocks in the middle go
    through :func:`_fill_blocks` (vectorized across blocks); at most three words at each end
    are computed one at a time."""
    n = out.size
    s = np.uint32(stream)
    head = min(n, (4 - offset % 4) % 4)
    for i in range(head):
        a = offset + i
        w0, w1, w2, w3 = _block_words(k0, k1, s, a // 4)
        out[i] = _word(w0, w1, w2, w3, a % 4)
    whole = (n - head) // 4
    first = (offset + head) // 4
    pairs = out[head : head + 4 * whole].view(np.uint64)
    done = 0
    while done < whole:
        # split where the counter's high word changes (at most once per 2**32 blocks)
        b = np.uint64(first + done)
        room = _BLOCKS_PER_HIGH_WORD - np.int64(b & _LOW32)
        count = min(whole - done, room)
        _fill_blocks(pairs[2 * done : 2 * (done + count)], b, k0, k1, s)
        done += count
    tail = head + 4 * whole
    if tail < n:
        w0, w1, w2, w3 = _block_words(k0, k1, s, first + whole)
        for j in range(n - tail):
            out[tail + j] = _word(w0, w1, w2, w3, j)


@njit(inline="always", nogil=True, cache=True)
def _uniform_of_block(w0, w1, w2, w3, j):  # type: ignore[no-untyped-def]
    """Bits of float element ``j`` (0..7) of a block: half ``j % 2`` of word ``j // 2``."""
    w = np.uint64(_word(w0, w1, w2, w3, j // 2))
    return one_plus_uniform_bits(w >> np.uint64(16 * (j % 2)))


@njit(nogil=True, cache=True)
def fill_uniform(k0, k1, stream, offset, out):  # type: ignore[no-untyped-def]
    """Float elements ``offset .. offset + out.size - 1`` of stream ``(k0, k1, stream)`` into
    ``out`` (``uint32``: the bit patterns of the float32 ``1 + u``; view it as ``float32``);
    serial, for use inside other kernels. Element ``i`` is half ``i % 2`` of word ``i // 2``
    (module docstring), so block ``b`` holds elements ``8b .. 8b + 7``: whole blocks go
    through :func:`_fill_uniform_blocks`, at most seven elements at each end one at a time."""
    n = out.size
    s = np.uint32(stream)
    head = min(n, (_FLOATS_PER_BLOCK - offset % _FLOATS_PER_BLOCK) % _FLOATS_PER_BLOCK)
    for i in range(head):
        a = offset + i
        w0, w1, w2, w3 = _block_words(k0, k1, s, a // _FLOATS_PER_BLOCK)
        out[i] = _uniform_of_block(w0, w1, w2, w3, a % _FLOATS_PER_BLOCK)
    whole = (n - head) // _FLOATS_PER_BLOCK
    first = (offset + head) // _FLOATS_PER_BLOCK
    quads = out[head : head + _FLOATS_PER_BLOCK * whole].view(np.uint64)
    done = 0
    while done < whole:
        # split where the counter's high word changes (at most once per 2**32 blocks)
        b = np.uint64(first + done)
        room = _BLOCKS_PER_HIGH_WORD - np.int64(b & _LOW32)
        count = min(whole - done, room)
        _fill_uniform_blocks(quads[4 * done : 4 * (done + count)], b, k0, k1, s)
        done += count
    tail = head + _FLOATS_PER_BLOCK * whole
    if tail < n:
        w0, w1, w2, w3 = _block_words(k0, k1, s, first + whole)
        for j in range(n - tail):
            out[tail + j] = _uniform_of_block(w0, w1, w2, w3, j)


@njit(nogil=True, cache=True, parallel=True)
def _bulk_words(k0, k1, stream, offset, out):  # type: ignore[no-untyped-def]
    """:func:`fill_words` split into tasks of ``_TASK`` elements run in parallel; every element
    is computed from its own index, so the result does not depend on the thread count."""
    n = out.size
    tasks = (n + _TASK - 1) // _TASK
    for t in prange(tasks):
        lo = t * _TASK
        hi = min(n, lo + _TASK)
        fill_words(k0, k1, stream, offset + lo, out[lo:hi])


@njit(nogil=True, cache=True, parallel=True)
def _bulk_uniform(k0, k1, stream, offset, out):  # type: ignore[no-untyped-def]
    """:func:`fill_uniform` in parallel tasks, as :func:`_bulk_words`."""
    n = out.size
    tasks = (n + _TASK - 1) // _TASK
    for t in prange(tasks):
        lo = t * _TASK
        hi = min(n, lo + _TASK)
        fill_uniform(k0, k1, stream, offset + lo, out[lo:hi])


def _check(seed: int, stream: int, offset: int, n: int, per_block: int) -> None:
    """Validate a request for ``n`` elements at ``offset`` of a stream with ``per_block``
    elements per block (``2**64`` blocks in all)."""
    if not 0 <= seed < 2**64:
        raise ValueError(f"Philox seed must lie in [0, 2**64), got {seed}")
    if not 0 <= stream < 2**32:
        raise ValueError(f"Philox stream id must lie in [0, 2**32), got {stream}")
    if n < 0 or offset < 0 or offset + n > per_block * 2**64:
        raise ValueError(f"cannot draw {n} values at offset {offset} of a Philox stream")


def philox_words(seed: int, stream: int, offset: int, n: int) -> np.ndarray:
    """``n`` raw 32-bit words (``uint32``) of stream ``(seed, stream)`` from element ``offset``."""
    _check(seed, stream, offset, n, 4)
    out = np.empty(n, dtype=np.uint32)
    call_parallel(_bulk_words, seed & 0xFFFFFFFF, seed >> 32, stream, offset, out)
    return out


def philox_one_plus_uniform(seed: int, stream: int, offset: int, n: int) -> np.ndarray:
    """``n`` float32 ``1 + u`` in ``(1, 2)`` of the float stream ``(seed, stream)`` from element
    ``offset`` (``u`` one of the ``2**16`` midpoints ``(h + 1/2) * 2**-16``; exact)."""
    _check(seed, stream, offset, n, _FLOATS_PER_BLOCK)
    out = np.empty(n, dtype=np.uint32)
    call_parallel(_bulk_uniform, seed & 0xFFFFFFFF, seed >> 32, stream, offset, out)
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
