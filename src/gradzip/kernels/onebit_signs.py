"""The sign-bit passes of one-bit quantization (spec 5.1): numba kernels and a torch-ops twin.

The fixed packing touches every coordinate once per side, plus once more under error feedback:

* :func:`pack_signs`: ``bit_ic = 1[V_ic >= 0]`` packed LSB-first into little-endian 32-bit
  words per column, the count of set bits (and of negative entries) per column, and the
  float64 sums of the positive and of the negative entries per column, in one pass.
* :func:`expand_signs`: ``V_hat_ic = mu+_c`` where the bit is set, else ``mu-_c``, written
  straight into the output, refusing set padding bits, in one pass;
  :func:`expand_add_signs` adds it into the output instead (a receiver's ``decode_add_``).
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

The numba kernels split every column into tasks of ``2**12`` words (``prange``; short columns
go 64 to a task), so a long column (a flat DDP bucket is one) uses every thread. A task's words
start at a multiple of a power of two, so each task but a column's last yields one complete
subtree of the order above; the last yields its incomplete subtrees folded smallest first, and
the tasks' results are then combined by the same binary counter. Every addition is the one the
definition makes, so the bytes do not depend on the thread count. The inner loops are
branch-free (bits as ORs of shifted comparisons, sums as selects of ``x`` or ``+0.0``, 8 words'
lanes summed in registers as the order's 3 lowest levels) so that LLVM vectorizes them; the
float64 additions stay separate IEEE operations (no fastmath, no contraction). [CHOICE] The
torch twins (:func:`pack_signs_torch`, :func:`expand_signs_torch`) use integer and select
operations and the same float64 tree of adjacent pairs (separate additions, no fused
multiply-add), so they are bit-identical to the kernels on any device; they serve tensors that
are not on the CPU and are tested against the kernels on CPU tensors.
"""

from __future__ import annotations

import numba
import numpy as np
import torch

from gradzip.kernels._threads import call_parallel

_LANES = 32
#: enough levels for 2**40 words, far beyond the element limit of a payload
_LEVELS = 41
#: [CHOICE] words per parallel task: a power of two, so that every task but a column's last
#: covers one complete subtree of the pairwise order, and long columns (a flat DDP bucket is
#: one column) still split across threads; 2**12 words are 512 KB of float32
_SEGMENT = 1 << 12
#: words per leaf tree: 8 words' lanes are summed in registers (a complete subtree of 3
#: levels), so the binary counter touches its stack once per 256 entries, not per 32
_CHUNK = 8
#: tasks per parallel block when every column is one task: the block's stacks are allocated
#: once, not per (short) column
_BLOCK = 64

# The loops below index 1-D views that start at their task's first entry, with indices that
# count up from 0: numba wraps negative indices around, and LLVM vectorizes a loop only where
# it can prove the index non-negative (an index offset by a runtime start halved the speed).


@numba.njit(inline="always")
def _above(x: float) -> float:
    """The entry's share of the positive sum: itself if ``> 0``, else ``+0.0`` (a select)."""
    return np.float64(x) if x > 0 else 0.0


@numba.njit(inline="always")
def _below(x: float) -> float:
    """The entry's share of the negative sum: itself if ``< 0``, else ``+0.0`` (a select)."""
    return np.float64(x) if x < 0 else 0.0


@numba.njit(inline="always")
def _store_word(out: np.ndarray, w: int, word: np.uint32) -> None:
    """Word ``w`` as 4 little-endian bytes whatever the host order (LLVM merges the four byte
    stores into one 32-bit store on a little-endian host)."""
    out[4 * w] = np.uint8(word & np.uint32(0xFF))
    out[4 * w + 1] = np.uint8((word >> np.uint32(8)) & np.uint32(0xFF))
    out[4 * w + 2] = np.uint8((word >> np.uint32(16)) & np.uint32(0xFF))
    out[4 * w + 3] = np.uint8(word >> np.uint32(24))


@numba.njit(inline="always")
def _load_word(packed: np.ndarray, w: int) -> np.uint32:
    """Word ``w`` from its 4 little-endian bytes (one 32-bit load on a little-endian host,
    after LLVM combines the byte loads)."""
    word: np.uint32 = np.uint32(
        np.uint32(packed[4 * w])
        | (np.uint32(packed[4 * w + 1]) << np.uint32(8))
        | (np.uint32(packed[4 * w + 2]) << np.uint32(16))
        | (np.uint32(packed[4 * w + 3]) << np.uint32(24))
    )
    return word


@numba.njit(inline="always")
def _popcount(word: np.uint32) -> int:
    """The set bits of a 32-bit word (SWAR: numba exposes no popcount; its arithmetic widens
    to 64 bits, so the byte sum is masked out of the product)."""
    v = np.uint32(word)
    v = v - ((v >> np.uint32(1)) & np.uint32(0x55555555))
    v = (v & np.uint32(0x33333333)) + ((v >> np.uint32(2)) & np.uint32(0x33333333))
    v = (v + (v >> np.uint32(4))) & np.uint32(0x0F0F0F0F)
    return int(((v * np.uint32(0x01010101)) >> np.uint32(24)) & np.uint32(0xFF))


@numba.njit(inline="always")
def _pack_full_word(x: np.ndarray, out: np.ndarray, w: int) -> tuple[np.uint32, np.uint32]:
    """Pack the 32 entries of full word ``w`` of the row ``x`` branch-free: the bit of lane
    ``j`` is an OR of ``(x >= 0) << j``, and the negative entries make a second word the same
    way (an integer sum of the comparisons instead kept LLVM from vectorizing the loop, at 1/5
    the speed); returns both words."""
    word = np.uint32(0)
    negative = np.uint32(0)
    for j in range(_LANES):
        v = x[32 * w + j]
        word |= np.uint32(1 if v >= 0 else 0) << np.uint32(j)
        negative |= np.uint32(1 if v < 0 else 0) << np.uint32(j)
    _store_word(out, w, word)
    return word, negative


@numba.njit(inline="always")
def _chunk_leaves(
    x: np.ndarray, out: np.ndarray, q: int, pos: np.ndarray, neg: np.ndarray
) -> tuple[int, int]:
    """Pack chunk ``q`` (8 full words) of the row ``x`` and write, per lane, the pairwise tree
    of its 8 entries (``((w0 + w1) + (w2 + w3)) + ((w4 + w5) + (w6 + w7))``, the order's 3
    lowest levels) into ``pos`` and ``neg``; returns the counts of entries ``>= 0`` and
    ``< 0``."""
    blk = x[256 * q : 256 * q + 256]
    words = out[32 * q : 32 * q + 32]
    n_ge = 0
    n_lt = 0
    for k in range(_CHUNK):
        word, negative = _pack_full_word(blk, words, k)
        n_ge += _popcount(word)
        n_lt += _popcount(negative)
    for j in range(_LANES):
        a0 = blk[j]
        a1 = blk[32 + j]
        a2 = blk[64 + j]
        a3 = blk[96 + j]
        a4 = blk[128 + j]
        a5 = blk[160 + j]
        a6 = blk[192 + j]
        a7 = blk[224 + j]
        pos[j] = ((_above(a0) + _above(a1)) + (_above(a2) + _above(a3))) + (
            (_above(a4) + _above(a5)) + (_above(a6) + _above(a7))
        )
        neg[j] = ((_below(a0) + _below(a1)) + (_below(a2) + _below(a3))) + (
            (_below(a4) + _below(a5)) + (_below(a6) + _below(a7))
        )
    return n_ge, n_lt


@numba.njit(inline="always")
def _word_leaves(
    x: np.ndarray, out: np.ndarray, w: int, pos: np.ndarray, neg: np.ndarray
) -> tuple[int, int]:
    """Word ``w`` of the row ``x`` (full, or the row's partial last one, padded with
    ``+0.0``): its bits, its entries as the 32 lane leaves and its counts of entries ``>= 0``
    and ``< 0``."""
    start = 32 * w
    word = np.uint32(0)
    n_ge = 0
    n_lt = 0
    for j in range(_LANES):
        pos[j] = 0.0
        neg[j] = 0.0
        if start + j < x.shape[0]:
            v = x[start + j]
            if v >= 0:
                word |= np.uint32(1) << np.uint32(j)
                n_ge += 1
            elif v < 0:
                n_lt += 1
            pos[j] = _above(v)
            neg[j] = _below(v)
    _store_word(out, w, word)
    return n_ge, n_lt


@numba.njit(inline="always")
def _merge_top(pos_stack: np.ndarray, neg_stack: np.ndarray, depth: int) -> int:
    """Replace the two top subtrees by their sum (left + right, lane by lane); the new depth."""
    for j in range(_LANES):
        pos_stack[depth - 2, j] = pos_stack[depth - 2, j] + pos_stack[depth - 1, j]
        neg_stack[depth - 2, j] = neg_stack[depth - 2, j] + neg_stack[depth - 1, j]
    return depth - 1


@numba.njit(inline="always")
def _fold_stack(pos_stack: np.ndarray, neg_stack: np.ndarray, depth: int) -> None:
    """Fold the stack's (incomplete) subtrees smallest first into row 0 (their zero-padded
    right halves add ``+0.0``, so the padding is skipped)."""
    while depth > 1:
        depth = _merge_top(pos_stack, neg_stack, depth)


@numba.njit(cache=True)
def _pack_segment(
    x: np.ndarray, out: np.ndarray, pos_stack: np.ndarray, neg_stack: np.ndarray
) -> tuple[int, int, int]:
    """Pack, count and sum per lane the row ``x`` (one task's entries, starting at a multiple
    of ``_SEGMENT`` words) into ``out`` by the binary counter; returns the counts of entries
    ``>= 0`` and ``< 0`` and the stack depth. A function of its own, not inlined into the
    parallel loop, where LLVM left the loops scalar."""
    n = x.shape[0]
    words = (n + 31) // 32
    chunks = (n // 32) // _CHUNK
    n_ge = 0
    n_lt = 0
    depth = 0
    for q in range(chunks):
        ge, lt = _chunk_leaves(x, out, q, pos_stack[depth], neg_stack[depth])
        n_ge += ge
        n_lt += lt
        depth += 1
        k = q  # binary counter: chunk q completes one subtree per trailing one bit of q
        while k & 1:
            depth = _merge_top(pos_stack, neg_stack, depth)
            k >>= 1
    for w in range(chunks * _CHUNK, words):
        ge, lt = _word_leaves(x, out, w, pos_stack[depth], neg_stack[depth])
        n_ge += ge
        n_lt += lt
        depth += 1
        k = w  # the same counter, one word at a time
        while k & 1:
            depth = _merge_top(pos_stack, neg_stack, depth)
            k >>= 1
    return n_ge, n_lt, depth


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
def _pack_kernel(
    m: np.ndarray,
    out: np.ndarray,
    counts: np.ndarray,
    sums: np.ndarray,
    seg_counts: np.ndarray,
    seg_sums: np.ndarray,
) -> None:
    cols, rows = m.shape
    words = (rows + 31) // 32
    nseg = max((words + _SEGMENT - 1) // _SEGMENT, 1)
    tasks = cols * nseg
    per_block = _BLOCK if nseg == 1 else 1
    blocks = (tasks + per_block - 1) // per_block
    for b in numba.prange(blocks):
        pos_stack = np.empty((_LEVELS, _LANES), dtype=np.float64)
        neg_stack = np.empty((_LEVELS, _LANES), dtype=np.float64)
        for t in range(b * per_block, min((b + 1) * per_block, tasks)):
            c = t // nseg
            w0 = (t % nseg) * _SEGMENT
            w1 = min(w0 + _SEGMENT, words)
            n_ge, n_lt, depth = _pack_segment(
                m[c, 32 * w0 : min(32 * w1, rows)], out[c, 4 * w0 : 4 * w1], pos_stack, neg_stack
            )
            # a full segment leaves one complete subtree; a last one is folded smallest first
            _fold_stack(pos_stack, neg_stack, depth)
            if nseg == 1:
                counts[c, 0] = n_ge
                counts[c, 1] = n_lt
                if depth > 0:
                    sums[c, 0] = _fold_lanes(pos_stack[0])
                    sums[c, 1] = _fold_lanes(neg_stack[0])
                else:
                    sums[c, 0] = 0.0
                    sums[c, 1] = 0.0
            else:
                seg_counts[t, 0] = n_ge
                seg_counts[t, 1] = n_lt
                seg_sums[t, 0, :] = pos_stack[0]
                seg_sums[t, 1, :] = neg_stack[0]


@numba.njit(parallel=True, cache=True)
def _combine_segments(
    words: int,
    nseg: int,
    counts: np.ndarray,
    sums: np.ndarray,
    seg_counts: np.ndarray,
    seg_sums: np.ndarray,
) -> None:
    """Per column, the segments' results in the defined order: the complete subtrees of the
    full segments through the binary counter, then the incomplete ones smallest first (the
    last segment's, already folded, then the counter's)."""
    full = words // _SEGMENT
    for c in numba.prange(counts.shape[0]):
        pos_stack = np.empty((_LEVELS, _LANES), dtype=np.float64)
        neg_stack = np.empty((_LEVELS, _LANES), dtype=np.float64)
        depth = 0
        for s in range(nseg):
            t = c * nseg + s
            pos_stack[depth, :] = seg_sums[t, 0]
            neg_stack[depth, :] = seg_sums[t, 1]
            depth += 1
            k = s
            while s < full and k & 1:
                depth = _merge_top(pos_stack, neg_stack, depth)
                k >>= 1
        _fold_stack(pos_stack, neg_stack, depth)
        counts[c, 0] = seg_counts[c * nseg : (c + 1) * nseg, 0].sum()
        counts[c, 1] = seg_counts[c * nseg : (c + 1) * nseg, 1].sum()
        sums[c, 0] = _fold_lanes(pos_stack[0])
        sums[c, 1] = _fold_lanes(neg_stack[0])


@numba.njit(cache=True)
def _expand_segment(packed: np.ndarray, hi: float, lo: float, out: np.ndarray, add: bool) -> None:
    """The row ``out`` from its bits ``packed``: each word read once, then 32 branch-free
    selects of ``hi`` / ``lo`` written (``add``: added) into ``out``. A function of its own,
    not inlined into the parallel loop, where LLVM left the selects scalar."""
    n = out.shape[0]
    full = n // 32
    if add:
        for w in range(full):
            word = _load_word(packed, w)
            dst = out[32 * w : 32 * w + 32]
            for j in range(_LANES):
                bit = word & (np.uint32(1) << np.uint32(j))
                dst[j] = dst[j] + (hi if bit != np.uint32(0) else lo)
    else:
        for w in range(full):
            word = _load_word(packed, w)
            dst = out[32 * w : 32 * w + 32]
            for j in range(_LANES):
                bit = word & (np.uint32(1) << np.uint32(j))
                dst[j] = hi if bit != np.uint32(0) else lo
    if n > 32 * full:  # a partial last word
        word = _load_word(packed, full)
        for j in range(n - 32 * full):
            sel = hi if (word >> np.uint32(j)) & np.uint32(1) else lo
            out[32 * full + j] = out[32 * full + j] + sel if add else sel


@numba.njit(parallel=True, cache=True)
def _expand_kernel(packed: np.ndarray, means: np.ndarray, out: np.ndarray, add: bool) -> None:
    cols, rows = out.shape
    words = (rows + 31) // 32
    nseg = max((words + _SEGMENT - 1) // _SEGMENT, 1)
    for t in numba.prange(cols * nseg):
        c = t // nseg
        w0 = (t % nseg) * _SEGMENT
        w1 = min(w0 + _SEGMENT, words)
        _expand_segment(
            packed[c, 4 * w0 : 4 * w1],
            means[c, 0],
            means[c, 1],
            out[c, 32 * w0 : min(32 * w1, rows)],
            add,
        )


@numba.njit(parallel=True, cache=True)
def _padding_bits_set(packed: np.ndarray, rows: int) -> bool:
    """Whether any column's last word has a bit set beyond ``rows`` (a corrupt payload)."""
    cols = packed.shape[0]
    tail = rows % 32
    if tail == 0 or cols == 0:
        return False
    w = rows // 32
    bad = 0
    for c in numba.prange(cols):
        bad += np.int64((_load_word(packed[c], w) >> np.uint32(tail)) != 0)
    return bad > 0


@numba.njit(cache=True)
def _residual_segment(m: np.ndarray, hi: float, lo: float, v_hat: np.ndarray, keep: bool) -> None:
    """The row ``m`` minus ``V_hat`` by its own signs, in place, and ``v_hat = V_hat`` when
    ``keep``; a function of its own so that LLVM vectorizes it."""
    if keep:
        for i in range(m.shape[0]):
            x = m[i]
            sel = hi if x >= 0 else lo  # the sign bit the payload carries
            v_hat[i] = sel
            m[i] = x - sel  # float32 subtraction, as e = v - v_hat
    else:
        for i in range(m.shape[0]):
            x = m[i]
            m[i] = x - (hi if x >= 0 else lo)


@numba.njit(parallel=True, cache=True)
def _residual_kernel(m: np.ndarray, means: np.ndarray, v_hat: np.ndarray, keep: bool) -> None:
    cols, rows = m.shape
    step = 32 * _SEGMENT
    nseg = max((rows + step - 1) // step, 1)
    for t in numba.prange(cols * nseg):
        c = t // nseg
        i0 = (t % nseg) * step
        i1 = min(i0 + step, rows)
        _residual_segment(
            m[c, i0:i1], means[c, 0], means[c, 1], v_hat[c, i0:i1] if keep else v_hat[0, 0:0], keep
        )


def pack_signs(
    m: torch.Tensor, out: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(packed, counts, sums)`` for the ``(cols, rows)`` float32 matrix ``m`` (any strides):
    ``packed`` is ``(cols, 4*ceil(rows/32))`` uint8 (written into ``out`` when given, e.g. a
    view of the payload's body); ``counts`` ``(cols, 2)`` int64, the entries ``>= 0`` (the set
    bits) and ``< 0``; ``sums`` ``(cols, 2)`` float64, the sums of the positive and of the
    negative entries in the order the module docstring defines. A NaN is counted in neither
    column of ``counts``; an infinity makes its sum infinite."""
    if m.device.type != "cpu":
        packed_t, counts_t, sums_t = pack_signs_torch(m)
        if out is None:
            return packed_t.cpu().numpy(), counts_t.cpu().numpy(), sums_t.cpu().numpy()
        out[...] = packed_t.cpu().numpy()
        return out, counts_t.cpu().numpy(), sums_t.cpu().numpy()
    cols, rows = m.shape
    words = -(-rows // 32)
    packed = np.empty((cols, 4 * words), dtype=np.uint8) if out is None else out
    counts = np.empty((cols, 2), dtype=np.int64)
    sums = np.empty((cols, 2), dtype=np.float64)
    nseg = max(-(-words // _SEGMENT), 1)
    tasks = cols * nseg if nseg > 1 else 0  # one task per column needs no scratch
    seg_counts = np.empty((tasks, 2), dtype=np.int64)
    seg_sums = np.empty((tasks, 2, _LANES), dtype=np.float64)
    call_parallel(_pack_kernel, m.numpy(), packed, counts, sums, seg_counts, seg_sums)
    if tasks:
        _combine_segments(words, nseg, counts, sums, seg_counts, seg_sums)
    return packed, counts, sums


def padding_clear(packed: np.ndarray, rows: int) -> bool:
    """Whether every padding bit of ``packed`` (``(cols, 4*ceil(rows/32))`` uint8) is zero."""
    return not call_parallel(_padding_bits_set, packed, rows)


def expand_signs(packed: np.ndarray, means: np.ndarray, out: np.ndarray) -> bool:
    """Fill ``out`` (``(cols, rows)`` float32, any strides) with ``mu+``/``mu-`` by the bits of
    ``packed``; ``means`` is ``(cols, 2)`` float32. Returns False, with ``out`` untouched, if a
    padding bit is set."""
    if not padding_clear(packed, out.shape[1]):
        return False
    call_parallel(_expand_kernel, packed, means, out, False)
    return True


def expand_add_signs(packed: np.ndarray, means: np.ndarray, out: np.ndarray) -> bool:
    """:func:`expand_signs` added into ``out`` (``out += V_hat``, one float32 addition per
    entry, the bits of adding the decoded tensor); False, ``out`` untouched, on set padding."""
    if not padding_clear(packed, out.shape[1]):
        return False
    call_parallel(_expand_kernel, packed, means, out, True)
    return True


def subtract_reconstruction(
    m: np.ndarray, means: np.ndarray, v_hat: np.ndarray | None = None
) -> None:
    """``m -= V_hat`` in place, ``V_hat_ic = mu+_c if m_ic >= 0 else mu-_c`` (the value
    :func:`expand_signs` decodes from ``m``'s packed signs), and ``v_hat[:] = V_hat`` when
    given; ``m`` and ``v_hat`` are ``(cols, rows)`` float32 of any strides."""
    keep = v_hat is not None
    target = v_hat if v_hat is not None else np.empty((1, 0), np.float32)
    call_parallel(_residual_kernel, m, means, target, keep)


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
