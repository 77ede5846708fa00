"""Buckets: the ``bucket_size`` parameter, how a flat tensor splits into buckets, their max-abs
scales, and one value per bucket broadcast back to the elements.

A bucket is a run of ``bucket_size`` consecutive elements of the flattened tensor with one scale
of its own (the last bucket may be shorter; ``bucket_size`` 0 or None means one bucket for the
whole tensor). The counting itself is :func:`gradzip.kernels.buckets.num_buckets`, shared with
the fused kernels. This module is public: schemes and algorithms use it too.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from gradzip.kernels.buckets import num_buckets as num_buckets

#: Elements per float32 scale of the max-norm quantizers (dqsg, ndqsg, half_dither, qsgd,
#: terngrad, qsgd_l2) unless ``bucket_size`` is given [CHOICE; the spec and the papers use one
#: scale per tensor, ``bucket_size=None``]. One scale per tensor makes the error of every entry
#: scale with the tensor's largest entry: on a 784-4096-4096-4096-10 MLP trained through the DDP
#: hook, dqsg (M=2), qsgd and terngrad diverged within 7 steps with it and trained with 512-entry
#: buckets, for 32 bits per 512 entries (0.0625 bits per coordinate). QSGD's and CGX's own
#: implementations default to buckets too (512 and 128). The papers' experiments pin
#: ``bucket_size=None`` explicitly (``gradzip reproduce dqsg-table1`` and the other reproductions).
DEFAULT_BUCKET_SIZE = 512
#: the registered compressors whose default is :data:`DEFAULT_BUCKET_SIZE`
BUCKETED_BY_DEFAULT = ("dqsg", "ndqsg", "half_dither", "qsgd", "terngrad", "qsgd_l2")


def papers_scales(name: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` of compressor ``name`` with the papers' one scale per tensor pinned
    (``bucket_size=None``) where the library's default is bucketed and ``params`` does not
    choose: what every reproduction of a paper's numbers builds its compressors with."""
    out = dict(params)
    if name in BUCKETED_BY_DEFAULT and "bucket_size" not in out and "partitions" not in out:
        out["bucket_size"] = None
    return out


def check_bucket_size(bucket_size: int | None) -> int:
    """Normalize a ``bucket_size`` parameter: None or 0 mean one bucket per tensor."""
    if bucket_size is None:
        return 0
    if isinstance(bucket_size, bool) or not isinstance(bucket_size, int) or bucket_size < 0:
        raise ValueError(f"bucket_size must be None or a positive int, got {bucket_size!r}")
    return bucket_size


def segments(n: int, bucket_size: int) -> Iterator[tuple[slice, int, slice]]:
    """Split ``n`` elements into at most two rectangular pieces of whole buckets.

    Yields ``(elements, rows, buckets)``: ``x[elements].view(rows, -1)`` has one bucket per row,
    and ``scales[buckets]`` are their per-bucket values. One bucket gives ``rows == 1``.
    """
    nb = num_buckets(n, bucket_size)
    if nb <= 1:
        yield slice(0, n), 1, slice(0, 1)
        return
    full = n // bucket_size
    yield slice(0, full * bucket_size), full, slice(0, full)
    if full < nb:
        yield slice(full * bucket_size, n), 1, slice(full, nb)


def per_row(values: torch.Tensor, rows: int, buckets: slice) -> float | torch.Tensor:
    """Per-bucket values for one of :func:`segments`' pieces: a Python float for one row (the
    fast scalar kernels), else a ``(rows, 1)`` column that broadcasts over the row."""
    if rows == 1:
        return float(values[buckets.start])
    return values[buckets].view(rows, 1)


def bucket_absmax(x: torch.Tensor, bucket_size: int, absmax: float | None = None) -> torch.Tensor:
    """``max|x_B|`` per bucket as float32 (the scale of DQSG eq. 2, QSGD's max norm, ...).
    ``absmax``, ``max|x|`` where the caller has it already, is read only for a single bucket;
    without it that case computes it (several buckets never need it)."""
    n = x.numel()
    nb = num_buckets(n, bucket_size)
    if nb == 1:
        if absmax is None:
            absmax = float(x.abs().max()) if n else 0.0
        return torch.tensor([absmax], dtype=torch.float32, device=x.device)
    full = n // bucket_size
    rows = x[: full * bucket_size].view(full, bucket_size)
    # separate amax/amin reductions are ~6x faster than aminmax(dim=1) on CPU
    scales = torch.maximum(rows.amax(dim=1), rows.amin(dim=1).neg_())
    if full < nb:
        tail = x[full * bucket_size :]
        lo_t, hi_t = torch.aminmax(tail)
        scales = torch.cat((scales, torch.maximum(-lo_t, hi_t).view(1)))
    # a zero bucket's scale is +0.0 (maximum(0.0, -0.0) may be either): the bytes on the wire
    # must not depend on the reduction's implementation
    return scales.abs_()


def per_element(values: torch.Tensor, n: int, bucket_size: int) -> torch.Tensor:
    """Broadcast one value per bucket to one value per element (length ``n``)."""
    if values.numel() == 1:
        return values.expand(n)
    counts = torch.full((values.numel(),), bucket_size, dtype=torch.int64)
    counts[-1] = n - bucket_size * (values.numel() - 1)
    return torch.repeat_interleave(values, counts)


def clip_to_std(x: torch.Tensor, absmax: float, c: float) -> tuple[torch.Tensor, float]:
    """Clip to ``+-c*std(x)`` (DQSG's authors' code [CODE], TernGrad's 2.5 sigma); returns the
    clipped copy and its new ``max|x|`` (the scale of a one-bucket tensor).

    Population std, as the authors' ``np.std``, computed in float64 so that values near the
    float32 limit do not overflow the variance. A constant tensor (std 0) is left alone rather
    than clipped to zero [CHOICE]. ``x`` may be the caller's tensor, so it is never modified.
    """
    std = float(x.to(torch.float64).std(correction=0)) if x.numel() > 1 else 0.0
    bound = float(np.float32(c * std))
    if not math.isfinite(bound) or bound <= 0 or bound >= absmax:
        return x, absmax
    return torch.clamp(x, -bound, bound), bound
