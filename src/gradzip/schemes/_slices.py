"""Cutting ``n`` items into contiguous, nearly equal ranges: a ring's slices, a large tensor's
pieces of rows."""

from __future__ import annotations


def slice_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous ranges covering ``[0, n)``, sizes differing by at most one."""
    base, extra = divmod(n, parts)
    bounds, start = [], 0
    for part in range(parts):
        end = start + base + (1 if part < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds
