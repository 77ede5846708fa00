"""Delta + Golomb-Rice coding of sorted sparse index sets (spec 5.5, Dryden et al. / LBANN).

A sparse message is a list of sent entries ``(idx_j, sign_j)`` sorted by flat index. Each index
is replaced by its gap ``delta_j = idx_j - idx_{j-1}`` (``idx_{-1} = 0``, so the first gap may be
0) and the value coded is ``v_j = (delta_j << 1) | sign_j``.

Rice code with parameter ``K`` (``M = 2**K``): ``q = v >> K`` one-bits, a zero-bit, then
``r = v & (M - 1)`` in ``K`` bits, least significant first. The bit stream is packed LSB-first
into little-endian uint32 words and the last word is padded with one-bits, so a unary run that
reaches the end of the stream means end-of-stream. An empty list is one all-ones word.

Bits: ``32 * max(1, ceil(sum_j (q_j + 1 + K) / 32))``.

``K = "auto"`` picks ``max(0, round_half_up(log2(ln 2 * mean(v))))`` (the Golomb-optimal
parameter for geometric gaps), capped at 31; the receiver must then be told ``K`` (the sparse
formats of :mod:`gradzip.compressors._groups` send it in a leading uint32 word, [CHOICE]).

Both directions are vectorised with NumPy: the encoder computes code lengths, their prefix sums,
and scatters the terminator and remainder bits; the decoder finds the chain of terminators among
all zero-bits by pointer doubling (``O(Z log Z)`` for ``Z`` zero-bits), never a per-bit loop.

References: Dryden et al., "Communication Quantization for Data-parallel Training of Deep Neural
Networks", MLHPC 2016; LBANN ``lbann_quantizer`` (adaptive quantization with Golomb-Rice coding);
Golomb, "Run-length encodings", IEEE Trans. Inf. Theory 12(3), 1966.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from gradzip.errors import CorruptPayloadError, TruncatedPayloadError

MAX_K = 31
_ALL_ONES = np.uint32(0xFFFFFFFF)

IntArray = npt.NDArray[np.int64]
WordArray = npt.NDArray[np.uint32]


def check_k(k: int | str) -> int | str:
    """Validate a Rice parameter: an int in ``[0, 31]`` or ``"auto"``."""
    if k == "auto":
        return k
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_K:
        raise ValueError(f"rice_k must be an int in [0, {MAX_K}] or 'auto', got {k!r}")
    return k


def auto_k(values: IntArray) -> int:
    """``K = max(0, round_half_up(log2(ln 2 * mean(v))))``, capped at 31; 0 for an empty list."""
    if values.size == 0:
        return 0
    target = math.log(2) * float(values.mean(dtype=np.float64))
    if target <= 0:
        return 0
    return min(MAX_K, max(0, math.floor(math.log2(target) + 0.5)))


def rice_bits(values: IntArray, k: int) -> int:
    """Coded size in bits: ``32 * max(1, ceil(sum(q + 1 + K) / 32))``."""
    total = int((values >> k).sum()) + values.size * (1 + k)
    return 32 * max(1, -(-total // 32))


def rice_encode(values: IntArray, k: int) -> WordArray:
    """Rice-code non-negative int64 ``values`` with parameter ``k`` into uint32 words."""
    check_k(k)
    if values.size == 0:
        return np.full(1, _ALL_ONES, dtype=np.uint32)
    if int(values.min()) < 0:
        raise ValueError("Golomb-Rice coding needs non-negative values")
    q = values >> k
    lengths = q + (1 + k)
    ends = np.cumsum(lengths)
    total = int(ends[-1])
    nwords = -(-total // 32)
    # one byte per bit: ones everywhere (unary runs and the padding), then clear the terminators
    # and write the remainder bit-planes; K + 1 scatters over nnz entries, no per-entry loop
    bits = np.ones(32 * nwords, dtype=np.uint8)
    term = ends - (1 + k)
    bits[term] = 0
    for b in range(k):
        bits[term + (1 + b)] = (values >> b) & 1
    return np.packbits(bits, bitorder="little").view(np.uint32)


def rice_decode(words: WordArray, k: int) -> IntArray:
    """Inverse of :func:`rice_encode`; raises a PayloadError on a truncated or padded stream."""
    check_k(k)
    if words.size == 0:
        raise TruncatedPayloadError(
            "Golomb-Rice stream is empty; even an empty list takes one all-ones word"
        )
    bits = np.unpackbits(np.ascontiguousarray(words).view(np.uint8), bitorder="little")
    is_zero = bits == 0
    zeros = np.flatnonzero(is_zero)
    if zeros.size == 0:
        if words.size != 1:
            raise CorruptPayloadError(
                f"Golomb-Rice stream of {words.size} all-ones words; an empty list is one word"
            )
        return np.empty(0, dtype=np.int64)
    terminators = zeros[_chain_from_first(zeros, is_zero, k)]
    last_end = int(terminators[-1]) + 1 + k
    if last_end > bits.size:
        raise TruncatedPayloadError(
            f"Golomb-Rice stream ends inside the {k}-bit remainder of its last value"
        )
    if -(-last_end // 32) != words.size:
        raise CorruptPayloadError(
            f"Golomb-Rice stream has {words.size} words; its {last_end} code bits need "
            f"{-(-last_end // 32)} (extra all-ones padding words)"
        )
    starts = np.empty_like(terminators)
    starts[0] = 0
    starts[1:] = terminators[:-1] + (1 + k)
    q = (terminators - starts).astype(np.int64)
    if int(q.max()) >= 1 << (62 - k):
        raise CorruptPayloadError("Golomb-Rice quotient overflows 62 bits")
    values = q << k
    for b in range(k):
        values |= bits[terminators + (1 + b)].astype(np.int64) << b
    return values


def _chain_from_first(
    zeros: npt.NDArray[np.intp], is_zero: npt.NDArray[np.bool_], k: int
) -> npt.NDArray[np.intp]:
    """Indices (into ``zeros``) of the terminators: the chain ``z -> first zero at or after
    z+1+K`` that starts from the first zero.

    Zeros inside remainders are skipped because the chain jumps over them. The chain is found by
    doubling: ``jump`` is the successor applied ``2**j`` times and ``chain`` holds the first
    ``2**j`` links, so ``jump[chain]`` are the next ``2**j`` links, already in increasing order.
    A sentinel (index ``len(zeros)``) is its own successor and marks the end.
    """
    count = zeros.size
    # zeros strictly before each bit position (and before the end): the index into `zeros` of
    # the first zero at or after that position, with `count` meaning "none"
    before = np.empty(is_zero.size + 1, dtype=np.intp)
    before[0] = 0
    np.cumsum(is_zero, out=before[1:])
    jump = np.empty(count + 1, dtype=np.intp)
    jump[:count] = before[np.minimum(zeros + (1 + k), is_zero.size)]
    jump[count] = count
    chain = np.zeros(1, dtype=np.intp)
    # the chain strictly increases until the sentinel, so it has at most count + 1 links and
    # ceil(log2(count + 1)) + 1 rounds suffice; the bound guards against any logic slip
    for _ in range(count.bit_length() + 2):
        following = jump[chain]
        if following[-1] == count:
            return np.concatenate((chain, following[: np.searchsorted(following, count)]))
        chain = np.concatenate((chain, following))
        jump = jump[jump]
    raise CorruptPayloadError("Golomb-Rice stream could not be parsed")  # pragma: no cover
