"""The device CRC-32 equals zlib's for every length and content, and reads nothing back."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from gradzip.device.crc32 import BLOCK, crc32_bytes_device, crc32_device
from gradzip.device.host_reads import count_host_reads

LENGTHS = [0, 1, 2, 3, 4, 5, 17, BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK, 3 * BLOCK + 7, 65_537]


@pytest.mark.parametrize("n", LENGTHS)
def test_equals_zlib(n: int) -> None:
    data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
    t = torch.from_numpy(data)
    assert int(crc32_device(t)) == zlib.crc32(data.tobytes())
    assert bytes(crc32_bytes_device(t).numpy()) == zlib.crc32(data.tobytes()).to_bytes(4, "little")


@pytest.mark.parametrize("fill", [0x00, 0xFF])
def test_equals_zlib_on_constant_bytes(fill: int) -> None:
    data = bytes([fill]) * 1000
    assert int(crc32_device(torch.tensor(list(data), dtype=torch.uint8))) == zlib.crc32(data)


def test_every_single_bit_flip_changes_it() -> None:
    data = np.random.default_rng(1).integers(0, 256, 700, dtype=np.uint8)
    base = int(crc32_device(torch.from_numpy(data)))
    for pos in range(0, 700, 37):
        flipped = data.copy()
        flipped[pos] ^= 1 << (pos % 8)
        assert int(crc32_device(torch.from_numpy(flipped))) == zlib.crc32(flipped.tobytes()) != base


def test_runs_on_fake_cuda_tensors_without_reads() -> None:
    with FakeTensorMode(allow_non_fake_inputs=True):
        data = torch.randint(0, 256, (10_000,), dtype=torch.uint8, device="cuda")
        crc = crc32_bytes_device(data)
        assert crc.device.type == "cuda" and crc.shape == (4,)


def test_reads_nothing_on_the_host() -> None:
    data = torch.randint(0, 256, (5000,), dtype=torch.uint8)
    with count_host_reads() as reads:
        crc32_device(data)
    assert reads.count == 0, reads.describe()


def test_refuses_other_dtypes() -> None:
    with pytest.raises(TypeError, match="uint8"):
        crc32_device(torch.zeros(4, dtype=torch.int32))
