"""Fused numba kernels over a batch of flat tensors laid end to end (segments): the max-abs
scales, the symmetric grid's symbols and the rescaled code sums of every tensor of a batch in
one call each.

Why [CHOICE]: the integer all-reduce reduces a DDP bucket's parameters as a batch (one scale
agreement, one code sum), but quantized and decoded them one tensor at a time: a handful of
kernel and torch calls per tensor, each with a fixed cost of microseconds. ResNet-20 has 59
parameter tensors of 4,566 values on average, and those fixed costs were about three quarters
of the codec's time (measured on one rank: 9.8 ms a step for its 59 gradients against 1.4 ms
for one tensor of the same 269,434 values).

Bits: every element goes through the per-tensor kernels' own operations: the symbols through
:func:`gradzip.kernels.stochastic.symmetric_tile` (the tile body of ``encode_symmetric``), the
scales through ``bucket_absmax_bits``, the decode through ``grid_sums``' ``scale_by_bucket``,
each with its own segment's buckets (numbered from the segment's start), scales and key, and the
uniforms drawn at the element's index within its own tensor. So each segment's results equal
what the per-tensor kernels give that tensor alone, whatever the batch and the thread count.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
from numba import njit, prange

from gradzip.buffers import fresh_array
from gradzip.kernels._threads import call_parallel
from gradzip.kernels.buckets import effective_bucket_size, num_buckets
from gradzip.kernels.dithered import bucket_absmax_bits
from gradzip.kernels.grid_sums import scale_by_bucket
from gradzip.kernels.stochastic import symmetric_tile

#: elements per parallel task [CHOICE]: the per-tensor kernels' tile of given scales
_TASK = 1 << 15

Int64s = npt.NDArray[np.int64]


@dataclass(frozen=True)
class SegmentLayout:
    """Where each tensor of a batch lies in the concatenation, its buckets and the tasks.

    ``starts`` (``k + 1``): element offsets, ``starts[k]`` the total; ``bucket_sizes``: each
    segment's effective bucket size (0: one bucket); ``scale_starts`` (``k + 1``): offsets of
    each segment's scales in the concatenated scales; ``bucket_lo``/``bucket_hi``: every
    bucket's bounds in the concatenation; ``task_*``: the parallel tasks, a segment and a range
    of at most :data:`_TASK` elements relative to its start."""

    starts: Int64s
    bucket_sizes: Int64s
    scale_starts: Int64s
    bucket_lo: Int64s
    bucket_hi: Int64s
    task_segment: Int64s
    task_lo: Int64s
    task_hi: Int64s

    @property
    def total(self) -> int:
        return int(self.starts[-1])

    @property
    def count(self) -> int:
        """The number of segments (tensors)."""
        return len(self.bucket_sizes)

    @property
    def scale_count(self) -> int:
        return int(self.scale_starts[-1])

    def segment(self, i: int) -> tuple[int, int]:
        """``(start, stop)`` of segment ``i`` in the concatenation."""
        return int(self.starts[i]), int(self.starts[i + 1])


@functools.lru_cache(maxsize=256)
def segment_layout(sizes: tuple[int, ...], bucket_size: int) -> SegmentLayout:
    """The layout of tensors of ``sizes`` values each, scaled per bucket of ``bucket_size``
    (0: one scale per tensor), as the per-tensor codecs bucket them (:func:`num_buckets`).
    Cached: a training step batches the same sizes every time."""
    if any(n < 0 for n in sizes) or bucket_size < 0:
        raise ValueError(f"sizes and the bucket size must be >= 0, got {sizes}, {bucket_size}")
    starts = np.zeros(len(sizes) + 1, dtype=np.int64)
    scale_starts = np.zeros(len(sizes) + 1, dtype=np.int64)
    bucket_sizes = np.zeros(len(sizes), dtype=np.int64)
    lo: list[int] = []
    hi: list[int] = []
    tasks: list[tuple[int, int, int]] = []
    for i, n in enumerate(sizes):
        bs = effective_bucket_size(n, bucket_size)
        nb = num_buckets(n, bucket_size)
        starts[i + 1] = starts[i] + n
        scale_starts[i + 1] = scale_starts[i] + nb
        bucket_sizes[i] = bs
        width = n if bs == 0 else bs
        for b in range(nb):
            lo.append(int(starts[i]) + b * width)
            hi.append(int(starts[i]) + min(n, (b + 1) * width))
        tasks += [(i, a, min(n, a + _TASK)) for a in range(0, n, _TASK)]
    table = np.array(tasks, dtype=np.int64).reshape(-1, 3)
    arrays = [
        starts,
        bucket_sizes,
        scale_starts,
        np.array(lo, dtype=np.int64),
        np.array(hi, dtype=np.int64),
        np.ascontiguousarray(table[:, 0]),
        np.ascontiguousarray(table[:, 1]),
        np.ascontiguousarray(table[:, 2]),
    ]
    for array in arrays:
        array.flags.writeable = False  # cached and shared by every batch of these sizes
    return SegmentLayout(*arrays)


@njit(nogil=True, cache=True, parallel=True)
def _absmax_kernel(xbits, bucket_lo, bucket_hi, scale_bits):  # type: ignore[no-untyped-def]
    for j in prange(scale_bits.size):
        scale_bits[j] = bucket_absmax_bits(xbits, bucket_lo[j], bucket_hi[j])


@njit(nogil=True, cache=True, parallel=True)
def _encode_kernel(  # type: ignore[no-untyped-def]
    x, scales, starts, scale_starts, bucket_sizes, task_segment, task_lo, task_hi,
    per, s, clip, k0s, k1s, symbols,
):  # fmt: skip
    for t in prange(task_segment.size):
        i = task_segment[t]
        a, b = starts[i], starts[i + 1]
        symmetric_tile(
            x[a:b],
            scales[scale_starts[i] : scale_starts[i + 1]],
            bucket_sizes[i],
            task_lo[t],
            task_hi[t],
            per,
            s,
            clip,
            k0s[i],
            k1s[i],
            symbols[a:b],
        )


@njit(nogil=True, cache=True, parallel=True)
def _rescale_kernel(  # type: ignore[no-untyped-def]
    sums, base, starts, scale_starts, bucket_sizes, task_segment, task_lo, task_hi, steps, out
):
    for t in prange(task_segment.size):
        i = task_segment[t]
        a = starts[i]
        lo, hi = task_lo[t], task_hi[t]
        # elements per step: the bucket, or the whole segment where it has one scale
        bucket = bucket_sizes[i] if bucket_sizes[i] > 0 else starts[i + 1] - a
        scale_by_bucket(
            sums[a + lo : a + hi],
            base,
            lo,
            steps[scale_starts[i] : scale_starts[i + 1]],
            bucket,
            out[a + lo : a + hi],
        )


def _float32_flat(x: torch.Tensor, layout: SegmentLayout, what: str) -> np.ndarray:
    if x.dtype != torch.float32 or x.device.type != "cpu" or x.numel() != layout.total:
        raise ValueError(
            f"{what} must be {layout.total} float32 values on the CPU, got {x.numel()} "
            f"{x.dtype} on {x.device}"
        )
    values: np.ndarray = x.reshape(-1).contiguous().numpy()
    return values


def segment_absmax(x: torch.Tensor, layout: SegmentLayout) -> torch.Tensor:
    """``max|x_B|`` of every bucket of every segment (float32, segment after segment): the
    scales of :func:`gradzip.compressors.buckets.bucket_absmax` per tensor, +0.0 for a zero
    bucket. ``x``: the concatenation, float32 and finite."""
    xs = _float32_flat(x, layout, "the batch")
    out = np.empty(layout.scale_count, dtype=np.float32)
    call_parallel(
        _absmax_kernel, xs.view(np.uint32), layout.bucket_lo, layout.bucket_hi, out.view(np.uint32)
    )
    return torch.from_numpy(out)


def encode_segments(
    x: torch.Tensor,
    scales: torch.Tensor,
    layout: SegmentLayout,
    per: int,
    s: int,
    clip: bool,
    seeds: list[int],
) -> torch.Tensor:
    """The symmetric grid's symbols (int32, in ``[0, 2s]``) of every segment of ``x`` on its
    ``scales`` (concatenated as :func:`segment_absmax` gives them), segment ``i`` drawing the
    local uniforms of ``seeds[i]``: per segment the symbols of
    :func:`gradzip.compressors._scaled_stochastic.stochastic_symbols` with that seed."""
    xs = _float32_flat(x, layout, "the batch")
    if scales.numel() != layout.scale_count or len(seeds) != layout.count:
        raise ValueError(
            f"{layout.scale_count} scales and {layout.count} seeds needed, got "
            f"{scales.numel()} and {len(seeds)}"
        )
    symbols = fresh_array(layout.total, np.int32)
    call_parallel(
        _encode_kernel,
        xs,
        scales.to(torch.float32).contiguous().numpy(),
        layout.starts,
        layout.scale_starts,
        layout.bucket_sizes,
        layout.task_segment,
        layout.task_lo,
        layout.task_hi,
        per,
        s,
        clip,
        np.array([seed & 0xFFFFFFFF for seed in seeds], dtype=np.uint64),
        np.array([seed >> 32 for seed in seeds], dtype=np.uint64),
        symbols,
    )
    return torch.from_numpy(symbols)


def rescale_segments(
    sums: torch.Tensor, base: int, steps: torch.Tensor, layout: SegmentLayout
) -> torch.Tensor:
    """``(float32(sums) - base) * step`` per element, the step of its segment's bucket
    (``steps`` float32, concatenated like the scales): per segment the bits of
    :func:`gradzip.kernels.grid_sums.mean_from_sums` without offsets. ``sums``: int32."""
    if sums.dtype != torch.int32 or sums.numel() != layout.total:
        raise ValueError(f"{layout.total} int32 sums needed, got {sums.numel()} {sums.dtype}")
    if steps.dtype != torch.float32 or steps.numel() != layout.scale_count:
        raise ValueError(
            f"{layout.scale_count} float32 steps needed, got {steps.numel()} {steps.dtype}"
        )
    out = fresh_array(layout.total, np.float32)
    call_parallel(
        _rescale_kernel,
        sums.reshape(-1).contiguous().numpy(),
        np.float32(base),
        layout.starts,
        layout.scale_starts,
        layout.bucket_sizes,
        layout.task_segment,
        layout.task_lo,
        layout.task_hi,
        steps.contiguous().numpy(),
        out,
    )
    return torch.from_numpy(out)
