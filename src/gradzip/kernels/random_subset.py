"""Uniformly random index subsets drawn from a raw 64-bit word stream (rand-k's kept indices):
exact integer arithmetic only, so every NumPy version and platform draws the same subset from
the same words."""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from gradzip.kernels.sparse import mark_draws


class WordStream(Protocol):
    """A raw 64-bit word stream (what :func:`gradzip.rng.shared_words` returns)."""

    def random_raw(self, size: int) -> np.ndarray: ...


def uniform_indices(words: WordStream, d: int, count: int) -> NDArray[np.int64]:
    """``count`` indices uniform on ``range(d)`` from raw words (Lemire's multiply-shift on the
    high 32 bits: exact integer arithmetic, bias below ``d / 2**32``)."""
    raw = words.random_raw(count)
    if d < 2**32:
        np.right_shift(raw, np.uint64(32), out=raw)
        np.multiply(raw, np.uint64(d), out=raw)
        np.right_shift(raw, np.uint64(32), out=raw)
        return raw.astype(np.int64)
    scaled = (raw >> np.uint64(11)).astype(np.float64) * (d * 2.0**-53)
    indices: NDArray[np.int64] = np.minimum(scaled.astype(np.int64), d - 1)
    return indices


def random_subset(words: WordStream, d: int, m: int) -> NDArray[np.int64]:
    """A uniformly random ``m``-subset of ``range(d)`` (``m <= d/2``), sorted, in O(d + m log m).

    Draw indices with replacement until at least ``m`` distinct ones are marked, then drop the
    surplus: the marked indices whose fresh random keys are smallest (found by a partition).
    Every step treats the labels symmetrically, so the result is a uniform m-subset; it avoids
    ``Generator.choice(replace=False)``, which shuffles all of ``range(d)`` for large ``m``
    (0.6 s for d = 2**24, m = d/10). Only raw words and integer arithmetic are used, so every
    NumPy version regenerates the same subset. The marking (and the count of new marks) is a numba
    kernel (:func:`~gradzip.kernels.sparse.mark_draws`).
    """
    mask = np.zeros(d, dtype=np.bool_)
    marked = 0
    while marked < m:
        # draws that reach m distinct ones on average, plus ~4 standard deviations; finite
        # because m <= d/2
        need = -d * math.log1p(-(m - marked) / (d - marked))
        count = int(need + 4 * math.sqrt(need) + 16)
        if d < 2**32:
            marked += mark_draws(mask, words.random_raw(count), d)
        else:
            mask[uniform_indices(words, d, count)] = True
            marked = int(np.count_nonzero(mask))
    chosen = np.flatnonzero(mask)
    if marked == m:
        return chosen
    # distinct keys (random high bits, the position in the low 31) make "the smallest
    # marked - m" one well-defined set, so a linear-time partition finds it on any NumPy version
    keys = words.random_raw(marked)
    np.right_shift(keys, np.uint64(31), out=keys)
    np.left_shift(keys, np.uint64(31), out=keys)
    np.bitwise_or(keys, np.arange(marked, dtype=np.uint64), out=keys)
    surplus = np.argpartition(keys, marked - m - 1)[: marked - m]
    return np.delete(chosen, surplus)
