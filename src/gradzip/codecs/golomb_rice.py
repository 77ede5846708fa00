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

Both directions are serial numba kernels with a 64-bit bit buffer (:mod:`gradzip.kernels.rice`),
a few nanoseconds a value.

References: Dryden et al., "Communication Quantization for Data-parallel Training of Deep Neural
Networks", MLHPC 2016; LBANN ``lbann_quantizer`` (adaptive quantization with Golomb-Rice coding);
Golomb, "Run-length encodings", IEEE Trans. Inf. Theory 12(3), 1966.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from gradzip.errors import CorruptPayloadError, TruncatedPayloadError
from gradzip.kernels import rice as rice_kernels

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
    values = np.ascontiguousarray(values, dtype=np.int64)
    out = np.empty(rice_bits(values, k) // 32, dtype=np.uint32)
    written = rice_kernels.encode_words(values, k, out)
    assert written == out.size  # the size formula and the writer agree
    return out


def rice_decode(words: WordArray, k: int) -> IntArray:
    """Inverse of :func:`rice_encode`; raises a PayloadError on a truncated or padded stream."""
    check_k(k)
    if words.size == 0:
        raise TruncatedPayloadError(
            "Golomb-Rice stream is empty; even an empty list takes one all-ones word"
        )
    words = np.ascontiguousarray(words, dtype=np.uint32)
    # every value takes at least 1 + k bits: that bounds the count without a pass over the bits
    out = np.empty(32 * words.size // (1 + k), dtype=np.int64)
    count, status, end = rice_kernels.decode_words(words, k, out)
    if status == rice_kernels.TRUNCATED:
        raise TruncatedPayloadError(
            f"Golomb-Rice stream ends inside the {k}-bit remainder of its last value"
        )
    if status == rice_kernels.OVERFLOW:
        raise CorruptPayloadError("Golomb-Rice quotient overflows 62 bits")
    if status != rice_kernels.OK:  # pragma: no cover - the bits bound the count
        raise CorruptPayloadError("Golomb-Rice stream holds more values than its bits allow")
    if count == 0:
        if words.size != 1:
            raise CorruptPayloadError(
                f"Golomb-Rice stream of {words.size} all-ones words; an empty list is one word"
            )
        return np.empty(0, dtype=np.int64)
    if -(-int(end) // 32) != words.size:
        raise CorruptPayloadError(
            f"Golomb-Rice stream has {words.size} words; its {int(end)} code bits need "
            f"{-(-int(end) // 32)} (extra all-ones padding words)"
        )
    values: IntArray = out[:count].copy()
    return values
