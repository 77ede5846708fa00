"""The passes of top-k and rand-k sparsification: numba kernels and torch-ops twins.

* :func:`topk_select`: the sorted indices of the ``k`` largest ``|x_i|``, ties at the threshold
  to the smaller index, by an exact two-pass radix select on the magnitude's bit pattern (for
  finite non-negative float32, the order of the bit patterns is the order of the values) and a
  compaction pass; ``O(d)`` with no sort and no copy of ``x``. On large tensors a strided
  sample first guesses a floor that a few times ``k`` magnitudes reach; one counting and one
  compaction pass keep those candidates, and the exact select runs on them (checked, with the
  full selection as the fallback, so the indices are the same).
* :func:`pack_indices` / :func:`unpack_indices`: ``b``-bit indices, LSB-first, eight at a time
  (eight ``b``-bit symbols fill exactly ``b`` bytes, so groups are independent tasks).
* :func:`gather_values`: the kept values' bit patterns, written straight into the payload.
* :func:`scatter_add`: ``out[idx] += values`` for strictly increasing ``idx``.
* :func:`mark_draws`: rand-k's marking of indices drawn with replacement (Lemire's
  multiply-shift on the high 32 bits of each raw word) and the count of new marks.

Determinism: histograms and counts are integer sums (exact in any order); every output element
is written by one task in a fixed order; no float arithmetic except the single rounding of each
``out[i] + v`` (no fastmath, so no contraction). The bytes therefore do not depend on the thread
count. [CHOICE] The torch twins (:func:`topk_select_torch`, :func:`pack_indices_torch`) use only
comparisons, integer scans and selects, so they are bit-identical to the kernels on any device;
they serve tensors that are not on the CPU and are tested against the kernels on CPU tensors.
"""

from __future__ import annotations

import numba
import numpy as np
import torch

from gradzip.kernels._threads import call_parallel

_CHUNK = 1 << 16  # elements per compaction task: fixed, so task boundaries never move
#: keys in :func:`_sampled_floor`'s sample [CHOICE]: sorting it costs well under a millisecond,
#: and at k/d = 1% its guess keeps about 1.5% of the keys as candidates
_SAMPLE = 1 << 13
#: keys per block of :func:`_compact_at_least`'s skip test
_BLOCK = 64
#: the largest kept fraction whose selection starts from a sample (above it most blocks hold a
#: candidate and the two full passes of the exact select cost less)
_SAMPLED_UP_TO = 0.02
#: the smallest tensor whose selection starts from a sample (below it the full selection's
#: four passes cost less than the sample's sort)
_SAMPLED_FROM = 1 << 17


@numba.njit(parallel=True, cache=True)
def _histograms(keys: np.ndarray, prefix: np.int64, hist: np.ndarray) -> None:
    """Per-task histograms of ``keys >> 16`` (prefix < 0) or of the low 16 bits of the keys
    whose high 16 bits equal ``prefix``, summed into ``hist`` (integers: any order is exact)."""
    tasks = hist.shape[0]
    n = keys.size
    step = (n + tasks - 1) // tasks
    for t in numba.prange(tasks):
        h = hist[t]
        for i in range(t * step, min(n, (t + 1) * step)):
            key = keys[i] & np.uint32(0x7FFFFFFF)
            if prefix < 0:
                h[key >> np.uint32(16)] += 1
            elif np.int64(key >> np.uint32(16)) == prefix:
                h[key & np.uint32(0xFFFF)] += 1


@numba.njit(cache=True)
def _rank_bin(hist: np.ndarray, rank: np.int64) -> tuple[np.int64, np.int64]:
    """The bin holding the ``rank``-th largest entry (1-based) and its rank inside that bin."""
    above = np.int64(0)
    for b in range(hist.size - 1, -1, -1):
        if above + hist[b] >= rank:
            return np.int64(b), rank - above
        above += hist[b]
    return np.int64(0), rank - above  # unreachable for rank <= total


@numba.njit(parallel=True, cache=True)
def _chunk_counts(keys: np.ndarray, thr: np.uint32, gt: np.ndarray, eq: np.ndarray) -> None:
    for c in numba.prange(gt.size):
        chunk = keys[c * _CHUNK : min(keys.size, (c + 1) * _CHUNK)]  # see _count_at_least
        g = np.uint32(0)
        e = np.uint32(0)
        for i in range(chunk.size):
            key = chunk[i] & np.uint32(0x7FFFFFFF)
            g += np.uint32(key > thr)  # branch-free, so the loop vectorizes
            e += np.uint32(key == thr)
        gt[c] = g
        eq[c] = e


@numba.njit(parallel=True, cache=True)
def _compact(
    keys: np.ndarray, thr: np.uint32, start: np.ndarray, ties: np.ndarray, idx: np.ndarray
) -> None:
    for c in numba.prange(start.size):
        pos = start[c]
        left = ties[c]
        for i in range(c * _CHUNK, min(keys.size, (c + 1) * _CHUNK)):
            key = keys[i] & np.uint32(0x7FFFFFFF)
            if key > thr or (key == thr and left > 0):
                if key == thr:
                    left -= 1
                idx[pos] = i
                pos += 1


@numba.njit(cache=True)
def _select(keys: np.ndarray, k: np.int64, tasks: np.int64) -> np.ndarray:
    hist = np.zeros((tasks, 1 << 16), dtype=np.int64)
    _histograms(keys, np.int64(-1), hist)
    high, rank = _rank_bin(hist.sum(axis=0), k)
    hist[:] = 0
    _histograms(keys, high, hist)
    low, _ = _rank_bin(hist.sum(axis=0), rank)
    thr = np.uint32((high << 16) | low)
    chunks = (keys.size + _CHUNK - 1) // _CHUNK
    gt = np.empty(chunks, dtype=np.int64)
    eq = np.empty(chunks, dtype=np.int64)
    _chunk_counts(keys, thr, gt, eq)
    missing = k - gt.sum()  # places left for entries equal to the threshold, in index order
    start = np.empty(chunks, dtype=np.int64)
    ties = np.empty(chunks, dtype=np.int64)
    pos = np.int64(0)
    for c in range(chunks):
        take = min(eq[c], max(np.int64(0), missing))
        missing -= take
        start[c] = pos
        ties[c] = take
        pos += gt[c] + take
    idx = np.empty(k, dtype=np.int64)
    _compact(keys, thr, start, ties, idx)
    return idx


@numba.njit(cache=True)
def _sampled_floor(keys: np.ndarray, k: np.int64) -> np.uint32:
    """A magnitude key that at least ``k`` keys reach, probably: the key of rank ``r + 4 sqrt(r)
    + 8`` from the top of an evenly strided sample of ``_SAMPLE`` keys, ``r = k * _SAMPLE / d``
    the k-th largest's expected rank there (four standard deviations of a binomial count above
    it, so the candidates are a few times ``k``; the guess's own spread, about one over the
    square root of that rank, makes them up to about five times ``k`` at ``k/d = 0.1%``). Only
    a guess: :func:`_select_sampled` checks it and falls back to the exact full selection."""
    d = keys.size
    size = min(d, _SAMPLE)
    stride = d // size
    sample = np.empty(size, dtype=np.uint32)
    for j in range(size):
        sample[j] = keys[j * stride] & np.uint32(0x7FFFFFFF)
    sample.sort()
    r = k * size / d
    pos = min(size - 1, np.int64(r + 4.0 * np.sqrt(r) + 8.0))
    return sample[size - 1 - pos]  # type: ignore[no-any-return]


@numba.njit(parallel=True, cache=True)
def _count_at_least(keys: np.ndarray, floor: np.uint32, counts: np.ndarray) -> None:
    for c in numba.prange(counts.size):
        # [CHOICE] a slice and a uint32 count: LLVM vectorizes this loop (about 7x faster, 2 ms
        # per 2**24 keys on one thread) where a loop over global indices with an int64 count
        # stayed scalar
        chunk = keys[c * _CHUNK : min(keys.size, (c + 1) * _CHUNK)]
        n = np.uint32(0)
        for i in range(chunk.size):
            n += np.uint32((chunk[i] & np.uint32(0x7FFFFFFF)) >= floor)
        counts[c] = n


@numba.njit(parallel=True, cache=True)
def _compact_at_least(
    keys: np.ndarray, floor: np.uint32, start: np.ndarray, idx: np.ndarray, kept: np.ndarray
) -> None:
    for c in numba.prange(start.size):
        pos = start[c]
        base = c * _CHUNK
        chunk = keys[base : min(keys.size, base + _CHUNK)]
        for b in range(0, chunk.size, _BLOCK):
            # candidates are a few percent of the keys: a vectorized maximum over a block
            # skips most blocks, the scalar scan runs only where one is
            block = chunk[b : b + _BLOCK]
            top = np.uint32(0)
            for i in range(block.size):
                top = max(top, block[i] & np.uint32(0x7FFFFFFF))
            if top < floor:
                continue
            for i in range(block.size):
                key = block[i] & np.uint32(0x7FFFFFFF)
                if key >= floor:
                    idx[pos] = base + b + i
                    kept[pos] = key
                    pos += 1


@numba.njit(cache=True)
def _select_sampled(keys: np.ndarray, k: np.int64, tasks: np.int64) -> np.ndarray:
    """:func:`_select`'s result from two streaming passes where a sample's guess holds.

    With ``floor`` such that at least ``k`` keys are ``>= floor``, the k-th largest key is
    ``>= floor`` too, so every selected element is among the candidates ``key >= floor``; the
    exact selection among them (kept in index order, so ties still go to the smaller index) is
    the selection among all. Where fewer than ``k`` keys reach the guess, or more than ``8 k +
    16 _SAMPLE`` (ties, a sample aliased with the data: a bound on the candidates' memory), the
    full selection runs instead: the same indices either way."""
    floor = _sampled_floor(keys, k)
    chunks = (keys.size + _CHUNK - 1) // _CHUNK
    counts = np.empty(chunks, dtype=np.int64)
    _count_at_least(keys, floor, counts)
    total = counts.sum()
    if total < k or total > 8 * k + 16 * _SAMPLE:
        return _select(keys, k, tasks)
    start = np.empty(chunks, dtype=np.int64)
    pos = np.int64(0)
    for c in range(chunks):
        start[c] = pos
        pos += counts[c]
    idx = np.empty(total, dtype=np.int64)
    kept = np.empty(total, dtype=np.uint32)
    _compact_at_least(keys, floor, start, idx, kept)
    return idx[_select(kept, k, np.int64(1))]  # type: ignore[no-any-return]


def topk_select(x: np.ndarray, k: int) -> np.ndarray:
    """Sorted int64 indices of the ``k`` largest ``|x_i|`` of the finite float32 ``x`` (ties to
    the smaller index); ``arange(d)`` for ``k >= d``. Tensors of at least ``_SAMPLED_FROM``
    elements kept at most ``_SAMPLED_UP_TO`` go through :func:`_select_sampled` (two streaming
    passes instead of four; the same indices)."""
    d = x.size
    if k >= d:
        return np.arange(d, dtype=np.int64)
    tasks = max(1, min(numba.get_num_threads(), d // _CHUNK))
    sampled = d >= _SAMPLED_FROM and k <= _SAMPLED_UP_TO * d
    kernel = _select_sampled if sampled else _select
    selected: np.ndarray = call_parallel(kernel, x.view(np.uint32), np.int64(k), np.int64(tasks))
    return selected


def topk_select_torch(x: torch.Tensor, k: int) -> torch.Tensor:
    """:func:`topk_select` in torch operations on ``x``'s device (compares and integer scans)."""
    d = x.numel()
    if k >= d:
        return torch.arange(d, dtype=torch.int64, device=x.device)
    mag = x.abs()
    threshold = torch.topk(mag, k, sorted=False).values.min()  # the k-th largest, a value
    above = mag > threshold
    missing = k - int(above.sum())
    tie = (mag == threshold) & (torch.cumsum(mag == threshold, 0) <= missing)
    return torch.nonzero(above | tie).flatten()


@numba.njit(parallel=True, cache=True)
def _gather(src: np.ndarray, idx: np.ndarray, out: np.ndarray) -> None:
    for i in numba.prange(idx.size):
        out[i] = src[idx[i]]


def gather_values(x: np.ndarray, idx: np.ndarray, out: np.ndarray) -> None:
    """Write the bit patterns of ``x[idx]`` (float32) into the uint8 array ``out`` (4 per value)."""
    call_parallel(_gather, x.view(np.uint32), idx, out.view(np.uint32))


@numba.njit(parallel=True, cache=True)
def _pack(idx: np.ndarray, bits: np.int64, out: np.ndarray) -> None:
    n = idx.size
    total = out.size
    for g in numba.prange((n + 7) // 8):
        acc = np.uint64(0)
        filled = np.int64(0)
        pos = g * bits
        for j in range(8 * g, 8 * g + 8):
            s = np.uint64(idx[j]) if j < n else np.uint64(0)
            acc |= s << np.uint64(filled)
            filled += bits
            while filled >= 8:
                if pos < total:
                    out[pos] = np.uint8(acc & np.uint64(0xFF))
                pos += 1
                acc >>= np.uint64(8)
                filled -= 8


def pack_indices(idx: np.ndarray, bits: int, out: np.ndarray) -> None:
    """Pack int64 ``idx`` (each below ``2**bits``, ``1 <= bits <= 32``) LSB-first into the
    uint8 ``out`` of ``ceil(n bits / 8)`` bytes, padding bits zero (as ``pack_bits``)."""
    call_parallel(_pack, idx, np.int64(bits), out)


@numba.njit(parallel=True, cache=True)
def _unpack(
    data: np.ndarray, bits: np.int64, d: np.int64, idx: np.ndarray, bad: np.ndarray
) -> None:
    n = idx.size
    total = data.size
    mask = (np.uint64(1) << np.uint64(bits)) - np.uint64(1)
    for g in numba.prange((n + 7) // 8):
        acc = np.uint64(0)
        filled = np.int64(0)
        pos = g * bits
        for j in range(8 * g, min(n, 8 * g + 8)):
            while filled < bits:
                byte = np.uint64(data[pos]) if pos < total else np.uint64(0)
                acc |= byte << np.uint64(filled)
                pos += 1
                filled += 8
            s = np.int64(acc & mask)
            acc >>= np.uint64(bits)
            filled -= bits
            idx[j] = s
            if s >= d:
                bad[g] = True
        # strictly increasing, across the group's first index and the previous group's last
    for g in numba.prange((n + 7) // 8):
        for j in range(max(1, 8 * g), min(n, 8 * g + 8)):
            if idx[j] <= idx[j - 1]:
                bad[g] = True


def unpack_indices(data: np.ndarray, n: int, bits: int, d: int) -> tuple[np.ndarray, bool]:
    """Inverse of :func:`pack_indices` (``data`` of exactly the packed size, padding already
    checked): ``(idx, ok)`` where ``ok`` says every index is below ``d`` and they strictly
    increase."""
    idx = np.empty(n, dtype=np.int64)
    bad = np.zeros((n + 7) // 8, dtype=np.bool_)
    call_parallel(_unpack, data, np.int64(bits), np.int64(d), idx, bad)
    return idx, not bool(bad.any())


@numba.njit(parallel=True, cache=True)
def _scatter_add(out: np.ndarray, idx: np.ndarray, values: np.ndarray) -> None:
    for i in numba.prange(idx.size):
        out[idx[i]] += values[i]  # indices are distinct: one rounding per element


def scatter_add(out: torch.Tensor, idx: torch.Tensor, values: torch.Tensor) -> None:
    """``out[idx] += values`` (1-D ``out``, distinct ``idx``, ``values`` of ``out``'s dtype);
    a numba kernel for contiguous CPU float32/float64 output, ``index_add_`` otherwise."""
    if (
        out.device.type == "cpu"
        and out.is_contiguous()
        and out.dtype
        in (
            torch.float32,
            torch.float64,
        )
    ):
        call_parallel(_scatter_add, out.numpy(), idx.cpu().numpy(), values.cpu().numpy())
    else:
        out.index_add_(0, idx.to(out.device), values.to(out.device))


@numba.njit(cache=True)
def _mark(mask: np.ndarray, raw: np.ndarray, d: np.uint64) -> int:
    new = 0
    for i in range(raw.size):
        j = ((raw[i] >> np.uint64(32)) * d) >> np.uint64(32)
        if not mask[j]:
            mask[j] = True
            new += 1
    return new


def mark_draws(mask: np.ndarray, raw: np.ndarray, d: int) -> int:
    """Mark the indices Lemire's multiply-shift maps the raw 64-bit words ``raw`` to (``d <
    2**32``) in the bool ``mask``; returns how many were not marked before. Serial: the
    marks are few random writes, and a second mark of an index is a no-op in any order."""
    return int(_mark(mask, raw, np.uint64(d)))
