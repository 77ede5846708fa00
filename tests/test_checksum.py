"""The payload checksum is exactly zlib's CRC-32 (the wire format depends on it)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from gradzip.checksum import crc32


@pytest.mark.parametrize("size", [0, 1, 3, 15, 16, 17, 255, 4096, 1 << 20])
def test_crc32_is_zlibs(size: int) -> None:
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    assert crc32(data) == zlib.crc32(data)
    assert crc32(data, 0xDEADBEEF) == zlib.crc32(data, 0xDEADBEEF)


def test_crc32_reads_memoryview_slices() -> None:
    data = memoryview(np.arange(10_000, dtype=np.uint8).tobytes())
    for lo, hi in [(0, 10_000), (1, 9_999), (7, 13), (5_000, 5_000)]:
        assert crc32(data[lo:hi]) == zlib.crc32(data[lo:hi])
