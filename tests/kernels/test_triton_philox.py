"""The Triton Philox float streams equal :func:`gradzip.kernels.philox.philox_one_plus_uniform`
bit for bit, run on CPU tensors by Triton's interpreter (see :mod:`tests.kernels.triton_modes`)."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch

from gradzip.kernels.philox import LOCAL_UNIFORM, SHARED_UNIFORM, philox_one_plus_uniform
from gradzip.kernels.triton_dispatch import forced_triton
from tests.kernels.triton_modes import load_kernels
from tests.kernels.triton_reference import SEED, same_bits


@pytest.fixture
def kernels(monkeypatch: pytest.MonkeyPatch) -> Iterator[SimpleNamespace]:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with forced_triton():
        yield load_kernels(interpret=True)


@pytest.mark.parametrize(
    ("offset", "n"),
    [(0, 1), (0, 8), (0, 3001), (5, 1), (13, 2050), (8 * 2**32 - 20, 64), (2**40 + 3, 100)],
)
@pytest.mark.parametrize("per_element", [False, True])
@pytest.mark.parametrize("stream", [SHARED_UNIFORM, LOCAL_UNIFORM])
def test_uniforms_equal_numba(
    kernels: SimpleNamespace, offset: int, n: int, per_element: bool, stream: int
) -> None:
    # offsets past 8 * 2**32 floats: the block counter's high word c1 is not zero
    expected = torch.from_numpy(philox_one_plus_uniform(SEED, stream, offset, n))
    got = kernels.philox.triton_one_plus_uniform(
        SEED, stream, offset, n, torch.device("cpu"), per_element=per_element
    )
    assert same_bits(got, expected)
    assert not same_bits(
        kernels.philox.triton_one_plus_uniform(SEED ^ (1 << 40), stream, offset, n, "cpu"),
        expected,
    )
