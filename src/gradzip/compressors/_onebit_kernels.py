"""The sign-bit passes of one-bit quantization (spec 5.1): numba kernels and a torch-ops twin.

The fixed packing touches every coordinate once per side, plus once more under error feedback:

* :func:`pack_signs`: ``bit_ic = 1[V_ic >= 0]`` packed LSB-first into little-endian 32-bit
  words per column, the count of set bits (and of negative entries) per column, and the
  float64 sums of the positive and of the negative entries per column, in one pass.
* :func:`expand_signs`: ``V_hat_ic = mu+_c`` where the bit is set, else ``mu-_c``, written
  straight into the output, refusing set padding bits, in one pass.
* :func:`subtract_reconstruction`: error feedback's ``e = V - V_hat`` in place (and, on
  request, ``V_hat`` itself), without packing or unpacking the bits again, in one pass.

[CHOICE] The order of the float64 column sums is defined, so that the means do not depend on
the thread count, the instruction set or the library: a column is padded with ``+0.0`` to whole
32-entry words; each of the 32 lanes (entry ``32 w + j`` is word ``w``'s lane ``j``) is summed
over the words by the pairwise tree of a power-of-two count of words (the missing words are
``+0.0``: ``node = left + right`` level by level, adjacent pairs); then the 32 lane sums are
combined by the same pairwise tree. An entry adds to the positive sum if ``> 0`` and to the
negative sum if ``< 0``, else it contributes ``+0.0``; no partial sum is ever ``-0.0``, so the
zero padding changes no bit and the kernel may merge its complete subtrees as it goes (a binary
counter) instead of padding. The pairwise error bound is ``O(log n)`` ulps, and the 32 lanes
let the merges vectorize without fastmath.

The numba kernels run one block of columns per task (``prange``); every column is computed by
one thread in that fixed order, so the bytes do not depend on the thread count. [CHOICE] The
torch twins (:func:`pack_signs_torch`, :func:`expand_signs_torch`) use integer and select
operations and the same float64 tree of adjacent pairs (separate additions, no fused
multiply-add), so they are bit-identical to the kernels on any device; they serve tensors that
are not on the CPU and are tested against the kernels on CPU tensors.
"""

from __future__ import annotations

import numba
import numpy as np
import torch

_LANES = 32
#: enough levels for 2**40 words, far beyond the element limit of a payload
_LEVELS = 41
#: columns per parallel task: the task's stacks are allocated once per block
_BLOCK = 64


@numba.njit(inline="always")
def _fold_lanes(acc: np.ndarray) -> float:
    """The pairwise tree over 32 lane sums, adjacent pairs level by level."""
    width = _LANES
    while width > 1:
        width //= 2
        for j in range(width):
            acc[j] = acc[2 * j] + acc[2 * j + 1]
    return float(acc[0])


@numba.njit(parallel=True, cache=True)
def _pack_kernel(m: np.ndarray, out: np.ndarray, counts: np.ndarray, sums: np.ndarray) -> None:
    cols, rows = m.shape
    words = (rows + 31) // 32
    blocks = (cols + _BLOCK - 1) // _BLOCK
    for b in numba.prange(blocks):
        pos_stack = np.empty((_LEVELS, _LANES), dtype=np.float64)
        neg_stack = np.empty((_LEVELS, _LANES), dtype=np.float64)
        pos = np.empty(_LANES, dtype=np.float64)
        neg = np.empty(_LANES, dtype=np.float64)
        for c in range(b * _BLOCK, min((b + 1) * _BLOCK, cols)):
            n_ge = 0
            n_lt = 0
            depth = 0
            for w in range(words):
                start = 32 * w
                stop = min(start + 32, rows)
                word = np.uint32(0)
                pos[:] = 0.0
                neg[:] = 0.0
                for i in range(start, stop):
                    x = m[c, i]
                    if x >= 0:
                        word |= np.uint32(1) << np.uint32(i - start)
                        n_ge += 1
                        if x > 0:
                            pos[i - start] = x
                    elif x < 0:
                        n_lt += 1
                        neg[i - start] = x
                # little-endian whatever the host order
                out[c, 4 * w] = np.uint8(word & np.uint32(0xFF))
                out[c, 4 * w + 1] = np.uint8((word >> np.uint32(8)) & np.uint32(0xFF))
                out[c, 4 * w + 2] = np.uint8((word >> np.uint32(16)) & np.uint32(0xFF))
                out[c, 4 * w + 3] = np.uint8(word >> np.uint32(24))
                # binary counter: word w completes one subtree per trailing one bit of w
                k = w
                while k & 1:
                    depth -= 1
                    for j in range(_LANES):
                        pos[j] = pos_stack[depth, j] + pos[j]
                        neg[j] = neg_stack[depth, j] + neg[j]
                    k >>= 1
                pos_stack[depth, :] = pos
                neg_stack[depth, :] = neg
                depth += 1
            # the incomplete subtrees, smallest first (their zero-padded right halves add +0.0)
            if depth > 0:
                pos[:] = pos_stack[depth - 1, :]
                neg[:] = neg_stack[depth - 1, :]
                for d in range(depth - 2, -1, -1):
                    for j in range(_LANES):
                        pos[j] = pos_stack[d, j] + pos[j]
                        neg[j] = neg_stack[d, j] + neg[j]
                sums[c, 0] = _fold_lanes(pos)
                sums[c, 1] = _fold_lanes(neg)
            else:
                sums[c, 0] = 0.0
                sums[c, 1] = 0.0
            counts[c, 0] = n_ge
            counts[c, 1] = n_lt


@numba.njit(parallel=True, cache=True)
def _expand_kernel(packed: np.ndarray, means: np.ndarray, out: np.ndarray, bad: np.ndarray) -> None:
    cols, rows = out.shape
    words = (rows + 31) // 32
    for c in numba.prange(cols):
        hi = means[c, 0]
        lo = means[c, 1]
        for w in range(words):
            word = (
                np.uint32(packed[c, 4 * w])
                | (np.uint32(packed[c, 4 * w + 1]) << np.uint32(8))
                | (np.uint32(packed[c, 4 * w + 2]) << np.uint32(16))
                | (np.uint32(packed[c, 4 * w + 3]) << np.uint32(24))
            )
            start = 32 * w
            stop = min(start + 32, rows)
            for i in range(start, stop):
                out[c, i] = hi if (word >> np.uint32(i - start)) & np.uint32(1) else lo
            if stop - start < 32 and (word >> np.uint32(stop - start)) != 0:
                bad[c] = True


@numba.njit(parallel=True, cache=True)
def _residual_kernel(m: np.ndarray, means: np.ndarray, v_hat: np.ndarray, keep: bool) -> None:
    cols, rows = m.shape
    for c in numba.prange(cols):
        hi = means[c, 0]
        lo = means[c, 1]
        for i in range(rows):
            x = m[c, i]
            sel = hi if x >= 0 else lo  # the sign bit the payload carries
            if keep:
                v_hat[c, i] = sel
            m[c, i] = x - sel  # float32 subtraction, as e = v - v_hat


def pack_signs(m: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(packed, counts, sums)`` for the ``(cols, rows)`` float32 matrix ``m`` (any strides):
    ``packed`` is ``(cols, 4*ceil(rows/32))`` uint8; ``counts`` ``(cols, 2)`` int64, the
    entries ``>= 0`` (the set bits) and ``< 0``; ``sums`` ``(cols, 2)`` float64, the sums of the
    positive and of the negative entries in the order the module docstring defines. A NaN is
    counted in neither column of ``counts``; an infinity makes its sum infinite."""
    if m.device.type != "cpu":
        packed_t, counts_t, sums_t = pack_signs_torch(m)
        return packed_t.cpu().numpy(), counts_t.cpu().numpy(), sums_t.cpu().numpy()
    cols, rows = m.shape
    packed = np.empty((cols, 4 * (-(-rows // 32))), dtype=np.uint8)
    counts = np.empty((cols, 2), dtype=np.int64)
    sums = np.empty((cols, 2), dtype=np.float64)
    _pack_kernel(m.numpy(), packed, counts, sums)
    return packed, counts, sums


def expand_signs(packed: np.ndarray, means: np.ndarray, out: np.ndarray) -> bool:
    """Fill ``out`` (``(cols, rows)`` float32, any strides) with ``mu+``/``mu-`` by the bits of
    ``packed``; ``means`` is ``(cols, 2)`` float32. Returns False if a padding bit is set."""
    bad = np.zeros(out.shape[0], dtype=np.bool_)
    _expand_kernel(packed, means, out, bad)
    return not bool(bad.any())


def subtract_reconstruction(
    m: np.ndarray, means: np.ndarray, v_hat: np.ndarray | None = None
) -> None:
    """``m -= V_hat`` in place, ``V_hat_ic = mu+_c if m_ic >= 0 else mu-_c`` (the value
    :func:`expand_signs` decodes from ``m``'s packed signs), and ``v_hat[:] = V_hat`` when
    given; ``m`` and ``v_hat`` are ``(cols, rows)`` float32 of any strides."""
    keep = v_hat is not None
    target = v_hat if v_hat is not None else np.empty((0, 0), np.float32)
    _residual_kernel(m, means, target, keep)


_SHIFTS = torch.arange(32, dtype=torch.int64)


def _pairwise_columns(values: torch.Tensor) -> torch.Tensor:
    """Sum ``(cols, n)`` float64 over ``n`` (a power of two) by the tree of adjacent pairs."""
    while values.shape[1] > 1:
        values = values[:, 0::2] + values[:, 1::2]
    return values[:, 0]


def sign_sums_torch(m: torch.Tensor) -> torch.Tensor:
    """The ``sums`` of :func:`pack_signs` in torch operations: ``(cols, 2)`` float64."""
    cols, rows = m.shape
    words = -(-rows // 32)
    slots = 1 << max(words - 1, 0).bit_length()  # the power-of-two count of words
    x = m.to(torch.float64)
    out = []
    for side in (x > 0, x < 0):
        leaves = torch.zeros((cols, slots * _LANES), dtype=torch.float64, device=m.device)
        leaves[:, :rows] = torch.where(side, x, 0.0)
        per_lane = leaves.view(cols, slots, _LANES)
        while per_lane.shape[1] > 1:
            per_lane = per_lane[:, 0::2] + per_lane[:, 1::2]
        out.append(_pairwise_columns(per_lane[:, 0]))
    return torch.stack(out, dim=1)


def pack_signs_torch(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`pack_signs` in torch operations on ``m``'s device."""
    cols, rows = m.shape
    words = -(-rows // 32)
    bits = torch.zeros((cols, 32 * words), dtype=torch.int64, device=m.device)
    bits[:, :rows] = (m >= 0).to(torch.int64)
    counts = torch.stack((bits.sum(dim=1), (m < 0).sum(dim=1)), dim=1)
    shifts = _SHIFTS.to(m.device)
    word = (bits.view(cols, words, 32) << shifts).sum(dim=2)  # disjoint bits: exact
    octets = (word.unsqueeze(2) >> (8 * torch.arange(4, device=m.device))) & 0xFF
    return octets.to(torch.uint8).reshape(cols, 4 * words), counts, sign_sums_torch(m)


def expand_signs_torch(
    packed: torch.Tensor, means: torch.Tensor, rows: int
) -> tuple[torch.Tensor, bool]:
    """:func:`expand_signs` in torch operations: ``((cols, rows) float32, padding ok)``."""
    cols = packed.shape[0]
    bits = (packed.to(torch.int64).unsqueeze(2) >> torch.arange(8, device=packed.device)) & 1
    bits = bits.reshape(cols, -1)
    ok = not bool(bits[:, rows:].any())
    out = torch.where(bits[:, :rows].bool(), means[:, :1], means[:, 1:])
    return out, ok


def column_means(counts: np.ndarray, sums: np.ndarray, rows: int) -> tuple[np.ndarray, bool]:
    """``((cols, 2) float32 means mu+, mu-; all entries finite)`` from :func:`pack_signs`'s
    ``counts`` and ``sums``: ``mu = float32(sum / count)`` in float64 (0 for an empty side;
    ``-0.0`` counts as non-negative and adds nothing)."""
    n_ge = counts[:, 0].astype(np.float64)
    n_neg = rows - counts[:, 0]
    finite = bool(np.all(counts[:, 0] + counts[:, 1] == rows)) and bool(np.isfinite(sums).all())
    with np.errstate(invalid="ignore", divide="ignore"):
        mu_pos = np.where(n_ge > 0, sums[:, 0] / np.maximum(n_ge, 1.0), 0.0)
        mu_neg = np.where(n_neg > 0, sums[:, 1] / np.maximum(n_neg, 1).astype(np.float64), 0.0)
    return np.stack((mu_pos, mu_neg), axis=1).astype(np.float32), finite


def column_means_torch(counts: torch.Tensor, sums: torch.Tensor, rows: int) -> torch.Tensor:
    """:func:`column_means`'s means in torch operations (float64 division, then float32)."""
    n_ge = counts[:, 0].to(torch.float64)
    n_neg = (rows - counts[:, 0]).to(torch.float64)
    mu_pos = torch.where(n_ge > 0, sums[:, 0] / n_ge.clamp(min=1.0), 0.0)
    mu_neg = torch.where(n_neg > 0, sums[:, 1] / n_neg.clamp(min=1.0), 0.0)
    return torch.stack((mu_pos, mu_neg), dim=1).to(torch.float32)
