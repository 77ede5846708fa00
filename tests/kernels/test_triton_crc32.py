"""The CRC-32 kernel (:mod:`gradzip.kernels.triton_crc32`) under Triton's interpreter on CPU
tensors: zlib's value for every length class (empty, short, one block, block edges, a program's
edges, many programs), the torch-ops reference's value, and the dispatch that takes it."""

from __future__ import annotations

import sys
import zlib
from collections import Counter
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch

from gradzip.device import crc32 as reference
from gradzip.kernels.triton_dispatch import forced_triton, triton_installed
from tests.kernels.triton_modes import Counted, load_kernels

pytestmark = pytest.mark.skipif(not triton_installed(), reason="triton is not installed")

#: 0, 1, a block and its neighbours, a program (16 blocks) and its neighbours, programs and a
#: partial block, a size past 2^16 blocks' bits
SIZES = [0, 1, 7, 255, 256, 257, 4095, 4096, 4097, 3 * 4096 + 300, 100_003]


@pytest.fixture
def kernels(monkeypatch: pytest.MonkeyPatch) -> Iterator[SimpleNamespace]:
    """The interpreted kernel modules, registered for the dispatch, CPU tensors let through."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    loaded: SimpleNamespace = load_kernels(interpret=True)
    monkeypatch.setitem(sys.modules, "gradzip.kernels.triton_crc32", loaded.crc32)
    with forced_triton():
        yield loaded


def message(n: int, seed: int) -> torch.Tensor:
    return torch.randint(
        0, 256, (n,), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8
    )


@pytest.mark.parametrize("n", SIZES)
def test_the_kernel_gives_zlibs_crc(
    kernels: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    data = message(n, seed=n)
    calls: Counter[str] = Counter()
    monkeypatch.setattr(
        kernels.crc32, "_crc32_kernel", Counted(kernels.crc32._crc32_kernel, "crc32", calls)
    )
    got = reference.crc32_device(data)  # the dispatch: a "device" tensor under the interpreter
    assert calls["crc32"] == (0 if n == 0 else 1)
    assert got.dtype == torch.int64 and got.dim() == 0
    assert int(got) == zlib.crc32(bytes(data.numpy()))


def test_the_kernel_equals_the_reference_on_patterned_bytes(kernels: SimpleNamespace) -> None:
    """All-zero, all-0xFF and counting bytes (the table lookups' extremes)."""
    for data in (
        torch.zeros(5000, dtype=torch.uint8),
        torch.full((5000,), 255, dtype=torch.uint8),
        torch.arange(70_000, dtype=torch.int64).remainder(256).to(torch.uint8),
    ):
        want = zlib.crc32(bytes(data.numpy()))
        assert int(reference.crc32_device(data)) == want
        with pytest.MonkeyPatch.context() as patch:  # the torch-ops path, for comparison
            patch.setattr(reference, "use_triton", lambda t: False)
            assert int(reference.crc32_device(data)) == want


def test_too_few_shift_tables_are_refused(kernels: SimpleNamespace) -> None:
    data = message(300, seed=1)
    with pytest.raises(ValueError, match="shift tables"):
        kernels.crc32.triton_crc32(
            data, torch.zeros(65536, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), 0
        )
