"""Deprecated alias of :mod:`gradzip.compressors.buckets`, kept so that imports written before
issue 15 keep working; import from :mod:`gradzip.compressors.buckets` instead."""

from __future__ import annotations

from gradzip.compressors.buckets import BUCKETED_BY_DEFAULT as BUCKETED_BY_DEFAULT
from gradzip.compressors.buckets import DEFAULT_BUCKET_SIZE as DEFAULT_BUCKET_SIZE
from gradzip.compressors.buckets import bucket_absmax as bucket_absmax
from gradzip.compressors.buckets import check_bucket_size as check_bucket_size
from gradzip.compressors.buckets import clip_to_std as clip_to_std
from gradzip.compressors.buckets import num_buckets as num_buckets
from gradzip.compressors.buckets import papers_scales as papers_scales
from gradzip.compressors.buckets import per_element as per_element
