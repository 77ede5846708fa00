"""Bucket counting: how many buckets (runs of elements with one scale each) a flat tensor has.

The one definition every layer uses (kernels, compressors, schemes, algorithms), so that the
number of scales a sender writes and a receiver reads cannot drift apart.
"""

from __future__ import annotations


def effective_bucket_size(n: int, bucket_size: int) -> int:
    """``bucket_size`` for a tensor of ``n`` elements, with 0 for one bucket (``bucket_size`` 0,
    or at least ``n``)."""
    return 0 if bucket_size == 0 or bucket_size >= n else bucket_size


def num_buckets(n: int, bucket_size: int) -> int:
    """Number of buckets of ``n`` elements (the last one may be shorter); 0 for ``n == 0``."""
    if n == 0:
        return 0
    bs = effective_bucket_size(n, bucket_size)
    return 1 if bs == 0 else -(-n // bs)
