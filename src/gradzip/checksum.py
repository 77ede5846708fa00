"""The payloads' CRC-32 (the zlib polynomial), computed by zlib-ng's SIMD implementation.

Why [CHOICE]: the checksum runs over every payload twice (sender and receiver), and the
standard library's ``zlib.crc32`` is an order of magnitude slower than zlib-ng's carry-less-
multiply folding, enough to be a visible share of a DQSG round trip. Both compute the same function (tested), so the wire format does not change,
and the standard library's is the fallback where zlib-ng is not installed.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

Checksum = Callable[[bytes | bytearray | memoryview, int], int]


def _fastest() -> Checksum:
    try:
        from zlib_ng import zlib_ng
    except ImportError:  # pragma: no cover - zlib-ng is a declared dependency
        return zlib.crc32
    return zlib_ng.crc32


_crc32 = _fastest()


def crc32(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC-32 of ``data``, continuing from ``value``: ``zlib.crc32``'s result, faster."""
    return int(_crc32(data, value))
