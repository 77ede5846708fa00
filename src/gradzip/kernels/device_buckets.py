"""Per-bucket quantities on a tensor's device under the device path's rules (see
:mod:`gradzip.device`): no Python indexing or slicing (per-bucket values reach the elements by
``index_select``, padding is ``torch.cat``) and no value read back to the host. Shared by the
dithered (:mod:`gradzip.kernels.dithered_device`) and the stochastic-rounding
(:mod:`gradzip.kernels.stochastic_device`) quantizers, whose scales are the same.
"""

from __future__ import annotations

import torch

from gradzip.kernels.buckets import effective_bucket_size, num_buckets


def bucket_of_elements(n: int, bucket_size: int, device: torch.device) -> torch.Tensor:
    """The bucket index of every element (``bucket_size`` 0: one bucket)."""
    bs = effective_bucket_size(n, bucket_size)
    if bs == 0:
        return torch.zeros(n, dtype=torch.int64, device=device)
    return torch.arange(n, dtype=torch.int64, device=device) // bs


def per_element(values: torch.Tensor, n: int, bucket_size: int) -> torch.Tensor:
    """One value per bucket broadcast to the ``n`` elements (``index_select``)."""
    return values.index_select(0, bucket_of_elements(n, bucket_size, values.device))


def padded(t: torch.Tensor, length: int) -> torch.Tensor:
    """``t`` (1-D) followed by zeros up to ``length`` elements."""
    extra = length - t.numel()
    if extra <= 0:
        return t
    return torch.cat([t, torch.zeros(extra, dtype=t.dtype, device=t.device)])


def bucket_absmax_device(x: torch.Tensor, bucket_size: int) -> torch.Tensor:
    """``max|x_B|`` per bucket (float32, +0.0 for a zero bucket, NaN where a bucket holds one)."""
    n = x.numel()
    bs = effective_bucket_size(n, bucket_size)
    a = x.abs()
    if bs == 0:
        return a.amax().reshape(1)
    nb = num_buckets(n, bucket_size)
    return padded(a, nb * bs).view(nb, bs).amax(dim=1)


def single_absmax(x: torch.Tensor) -> torch.Tensor:
    """The dithered host path's one-bucket scale ``max(-min(x), max(x))`` with Python's ``max``
    (the first argument unless the second is larger: which zero a zero tensor gets), as a
    float32 tensor of one element."""
    lo, hi = torch.aminmax(x)
    neg = -lo
    return torch.where(hi > neg, hi, neg).reshape(1)


def scales_device(x: torch.Tensor, bucket_size: int) -> torch.Tensor:
    """The dithered quantizers' per-bucket max-abs scales (:func:`single_absmax` for one
    bucket, :func:`bucket_absmax_device` for several)."""
    if effective_bucket_size(x.numel(), bucket_size) == 0:
        return single_absmax(x)
    return bucket_absmax_device(x, bucket_size)
