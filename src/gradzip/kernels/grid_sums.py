"""Fused numba kernels for the integer-sum schemes' code sums (float32, or int32 for the exact
sums of the integer all-reduce; the host path).

Three passes that the torch formulation spread over many full-length temporaries:

* :func:`mean_from_sums`: ``(sum - P s - sum_p offset_p) * step_bucket`` per element, the
  ``P`` shared dithers ``offset_p = (1 + u_p) - 3/2`` regenerated tile by tile in a small
  scratch (never ``P`` full-length streams) and the per-bucket step read by index (no repeated
  scales);
* :func:`requantize`: ``clamp(floor(sum * factor + u), 0, levels)`` into int32, ``u`` the
  sender's own uniforms drawn tile by tile;
* :func:`add_scaled`: ``acc += float32(q) * unit`` (or ``acc = ...``) for integers already
  unpacked (the pipelined ring's float32 hops fuse unpacking and this addition, and the
  re-quantization with packing, in :mod:`gradzip.kernels.ring_hops`).

Bits: each element goes through the same float32 operations, in the same order, as the torch
code it replaces (a subtraction of the integer ``P s``, then one subtraction per rank's offset,
then one multiplication; or a multiplication, an addition, ``floor``, a clamp), with no
``fastmath`` (so no reassociation and no fused multiply-add), so the results are bit-identical
to it. Every element depends on its own index only, so the results do not depend on the
thread count. Kernels are ``nogil`` (the pipelined ring's worker thread moves bytes while the
calling thread runs them) and ``cache=True``.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

from gradzip.buffers import fresh_array
from gradzip.kernels._threads import call_parallel
from gradzip.kernels.philox import LOCAL_UNIFORM, SHARED_UNIFORM, fill_uniform

#: elements per parallel task and per scratch tile [CHOICE]: 16 K float32 (64 KiB) per rank's
#: dither stays in L2 while it is subtracted, and a multiple of Philox's 8 floats per block
_TILE = 1 << 14
_HALF_THREE = np.float32(1.5)
_ONE = np.float32(1.0)
#: the sums :func:`mean_from_sums` converts per element (each dtype a compiled overload)
SUM_DTYPES = (torch.float32, torch.int32, torch.uint8)


@njit(nogil=True, cache=True, parallel=True)
def _mean_kernel(sums, base, k0s, k1s, steps, bucket, out):  # type: ignore[no-untyped-def]
    n = sums.size
    tasks = (n + _TILE - 1) // _TILE
    ranks = k0s.size
    for t in prange(tasks):
        lo = t * _TILE
        hi = min(n, lo + _TILE)
        if ranks == 0:  # no dithers: straight from the sums (the same two float32 operations)
            scale_by_bucket(sums[lo:hi], base, lo, steps, bucket, out[lo:hi])
            continue
        acc = np.empty(hi - lo, dtype=np.float32)
        tile = sums[lo:hi]  # indexed from 0 (see scale_by_bucket)
        for i in range(hi - lo):
            acc[i] = np.float32(tile[i]) - base
        scratch = np.empty(hi - lo, dtype=np.uint32)
        dither = scratch.view(np.float32)
        for p in range(ranks):
            fill_uniform(k0s[p], k1s[p], SHARED_UNIFORM, lo, scratch)
            for i in range(hi - lo):
                acc[i] = acc[i] - (dither[i] - _HALF_THREE)
        scale_by_bucket(acc, np.float32(0.0), lo, steps, bucket, out[lo:hi])


@njit(inline="always", nogil=True, cache=True)
def scale_by_bucket(levels, base, origin, steps, bucket, out):  # type: ignore[no-untyped-def]
    """``out[i] = (float32(levels[i]) - base) * steps[(origin + i) // bucket]``, one run per bucket:
    the step is read once per run instead of found by an integer division per element (which
    kept the loop from vectorizing). ``base = 0`` subtracts exactly nothing (``x - 0 == x``
    for every float32, ``-0`` included)."""
    count = levels.size
    i = 0
    while i < count:
        b = (origin + i) // bucket
        end = min(count, (b + 1) * bucket - origin)
        step = steps[b]
        # a run's own slices indexed from 0: with indices from ``i`` numba cannot prove them
        # non-negative, wraps each one and the loop does not vectorize (4x slower, measured)
        run_in, run_out = levels[i:end], out[i:end]
        for j in range(end - i):
            run_out[j] = (np.float32(run_in[j]) - base) * step
        i = end


def mean_from_sums(
    sums: torch.Tensor, base: int, offset_seeds: list[int], steps: torch.Tensor, bucket_size: int
) -> torch.Tensor:
    """``(sums - base - sum_p offset_p) * steps[i // bucket_size]`` (float32, a new tensor),
    ``sums`` float32, int32 (the integer all-reduce's exact sums) or uint8 (one rank's
    symbols, for error feedback's own values), converted to float32 per element (exact below
    ``2**24``, which callers ensure),
    ``offset_p = (1 + u) - 3/2`` of the shared uniform stream of seed ``offset_seeds[p]``
    (subtracted in the order given), ``steps`` float32 per bucket (one value: every element).

    Bits: those of ``levels = sums - base; levels -= offset_p ...; levels *= per_element(steps)``
    in float32 (see the module). Raises ``ValueError`` for steps that do not cover the buckets.
    """
    flat = sums.reshape(-1)
    if flat.dtype not in SUM_DTYPES or steps.dtype != torch.float32:
        raise ValueError(
            f"mean_from_sums takes float32, int32 or uint8 sums and float32 steps, got {flat.dtype}, "
            f"{steps.dtype}"
        )
    n = flat.numel()
    per = n if steps.numel() == 1 else bucket_size
    if steps.numel() != 1 and (per <= 0 or steps.numel() != -(-n // per)):
        raise ValueError(
            f"{steps.numel()} steps do not match {n} values in buckets of {bucket_size}"
        )
    if n == 0:
        return torch.empty(0, dtype=torch.float32)
    # recycled [CHOICE]: a fresh output of tens of MB costs more in page faults than the pass
    # itself (gradzip.buffers); the caller's tensor keeps it out of the pool while it lives
    out = torch.from_numpy(fresh_array(n, np.float32))
    k0s = np.array([s & 0xFFFFFFFF for s in offset_seeds], dtype=np.uint64)
    k1s = np.array([s >> 32 for s in offset_seeds], dtype=np.uint64)
    call_parallel(
        _mean_kernel,
        flat.contiguous().numpy(),
        np.float32(base),
        k0s,
        k1s,
        steps.contiguous().numpy(),
        per,
        out.numpy(),
    )
    return out


@njit(nogil=True, cache=True)
def _requantize_kernel(sums, factor, k0, k1, levels, out):  # type: ignore[no-untyped-def]
    n = sums.size
    scratch = np.empty(min(n, _TILE), dtype=np.uint32)
    u = scratch.view(np.float32)
    top = np.float32(levels)
    for lo in range(0, n, _TILE):
        hi = min(n, lo + _TILE)
        fill_uniform(k0, k1, LOCAL_UNIFORM, lo, scratch[: hi - lo])
        tile, into = sums[lo:hi], out[lo:hi]  # indexed from 0 (see scale_by_bucket)
        for i in range(hi - lo):
            q = np.floor(tile[i] * factor + (u[i] - _ONE))
            into[i] = np.int32(min(max(q, np.float32(0.0)), top))


def requantize(sums: torch.Tensor, factor: float, seed: int, levels: int) -> torch.Tensor:
    """``clamp(floor(sums * factor + u), 0, levels)`` as int32: ``factor`` rounded to float32,
    ``u = (1 + u') - 1`` the local uniforms of stream ``seed`` (element ``i`` at index ``i``).

    Serial [CHOICE]: a chunk of the pipelined ring is about a million values, and the ring's
    other ranks run on the same cores; ``nogil`` lets the worker thread overlap it."""
    flat = sums.reshape(-1)
    if flat.dtype != torch.float32:
        raise ValueError(f"requantize takes float32 sums, got {flat.dtype}")
    out = torch.empty(flat.numel(), dtype=torch.int32)
    if flat.numel():
        _requantize_kernel(
            flat.contiguous().numpy(),
            np.float32(factor),
            seed & 0xFFFFFFFF,
            seed >> 32,
            levels,
            out.numpy(),
        )
    return out


@njit(nogil=True, cache=True)
def _add_scaled_kernel(acc, q, unit, replace):  # type: ignore[no-untyped-def]
    for i in range(acc.size):
        v = np.float32(q[i]) * unit
        acc[i] = v if replace else acc[i] + v


def add_scaled(acc: torch.Tensor, q: torch.Tensor, unit: float, replace: bool = False) -> None:
    """``acc += float32(q) * unit`` in place (``acc = ...`` when ``replace``); ``acc`` a
    contiguous float32 view, ``q`` integers of the same length, ``unit`` rounded to float32."""
    if acc.dtype != torch.float32 or not acc.is_contiguous() or acc.numel() != q.numel():
        raise ValueError("add_scaled takes a contiguous float32 accumulator as long as q")
    if acc.numel():
        _add_scaled_kernel(
            acc.numpy(), q.reshape(-1).to(torch.int32).numpy(), np.float32(unit), replace
        )
