"""Aggregation schemes: how the ranks' payloads become one averaged tensor.

Every scheme is a :class:`~gradzip.schemes.base.Scheme`; :data:`SCHEMES` maps the names that the
command line and the benchmarks use to the classes, and :func:`make_scheme` builds one.
"""

from __future__ import annotations

from typing import Any

from gradzip.compressors.base import Compressor
from gradzip.schemes.allgather_decode import AllGatherDecode
from gradzip.schemes.base import Scheme

SCHEMES: dict[str, type[Scheme]] = {
    AllGatherDecode.name: AllGatherDecode,
}


def make_scheme(name: str, compressor: Compressor, **options: Any) -> Scheme:
    """The scheme called ``name`` around ``compressor`` (``options``: ``run_seed``,
    ``error_feedback`` and the scheme's own keyword arguments)."""
    try:
        cls = SCHEMES[name]
    except KeyError:
        raise ValueError(f"unknown scheme {name!r}; choose one of {sorted(SCHEMES)}") from None
    return cls(compressor, **options)


__all__ = ["SCHEMES", "AllGatherDecode", "Scheme", "make_scheme"]
