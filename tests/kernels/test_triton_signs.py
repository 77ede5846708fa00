"""The Triton kernels of one-bit quantization's sign passes equal the numba kernels bit for bit
(the float64 column sums in their defined pairwise order included), run on CPU tensors by
Triton's interpreter (see :mod:`tests.kernels.triton_modes`)."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from gradzip.kernels.onebit_signs import (
    column_means,
    expand_add_signs,
    expand_signs,
    pack_signs,
    subtract_reconstruction,
)
from gradzip.kernels.triton_dispatch import forced_triton
from tests.kernels.triton_modes import load_kernels
from tests.kernels.triton_reference import same_bits


@pytest.fixture
def kernels(monkeypatch: pytest.MonkeyPatch) -> Iterator[SimpleNamespace]:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with forced_triton():
        yield load_kernels(interpret=True)


def matrix(cols: int, rows: int, seed: int = 0) -> torch.Tensor:
    """Gaussian entries of very different sizes (so the summation order shows in the bits),
    with exact zeros and a -0.0."""
    g = torch.Generator().manual_seed(seed)
    m = torch.randn(cols, rows, generator=g) * torch.exp(4 * torch.randn(cols, rows, generator=g))
    m.view(-1)[::13] = 0.0
    if m.numel() > 5:
        m.view(-1)[5] = -0.0
    return m


#: (cols, rows): one entry, a partial word, a word, words not filling a program, a program and a
#: bit, several programs (a non-power-of-two count), and about 100k entries in one column
SHAPES = [(1, 1), (3, 5), (2, 32), (2, 100), (1, 1025), (3, 5000), (1, 100_003)]


@pytest.mark.parametrize(("cols", "rows"), SHAPES)
def test_pack_signs_equals_numba(kernels: SimpleNamespace, cols: int, rows: int) -> None:
    m = matrix(cols, rows, seed=rows)
    packed, counts, sums = pack_signs(m)
    got = kernels.signs.triton_pack_signs(m)
    assert same_bits(got[0], torch.from_numpy(packed))
    assert same_bits(got[1], torch.from_numpy(counts))
    assert same_bits(got[2].view(torch.int64), torch.from_numpy(sums).view(torch.int64))


def test_pack_signs_sum_order_shows() -> None:
    # the sums differ in their bits under another order: the comparison above can fail
    m = matrix(1, 5000, seed=5000)
    _, _, sums = pack_signs(m)
    x = m.to(torch.float64)
    plain = float(torch.where(x > 0, x, 0.0).sum())
    assert np.float64(plain).view(np.int64) != sums[0, 0].view(np.int64)


@pytest.mark.parametrize(("cols", "rows"), SHAPES[:-1])
def test_expand_and_residual_equal_numba(kernels: SimpleNamespace, cols: int, rows: int) -> None:
    m = matrix(cols, rows, seed=rows + 1)
    packed, counts, sums = pack_signs(m)
    means, _ = column_means(counts, sums, rows)
    pk, mt = torch.from_numpy(packed), torch.from_numpy(means)
    expected = np.empty((cols, rows), dtype=np.float32)
    assert expand_signs(packed, means, expected)
    values, ok = kernels.signs.triton_expand_signs(pk, mt, rows)
    assert ok
    assert same_bits(values, torch.from_numpy(expected))
    start = matrix(cols, rows, seed=3)
    ref, out = start.numpy().copy(), start.clone()
    assert expand_add_signs(packed, means, ref)
    assert kernels.signs.triton_expand_signs(pk, mt, rows, out=out)[0] is out
    assert same_bits(out, torch.from_numpy(ref))
    kernels.signs.triton_expand_signs(pk, mt, rows, out=out, add=False)
    assert same_bits(out, torch.from_numpy(expected))
    # error feedback's residual, with and without V_hat
    r_ref, v_ref = m.numpy().copy(), np.empty((cols, rows), dtype=np.float32)
    subtract_reconstruction(r_ref, means, v_ref)
    r = m.clone()
    v_hat = kernels.signs.triton_subtract_reconstruction(r, mt, keep=True)
    assert same_bits(r, torch.from_numpy(r_ref))
    assert same_bits(v_hat, torch.from_numpy(v_ref))
    r = m.clone()
    assert kernels.signs.triton_subtract_reconstruction(r, mt) is None
    assert same_bits(r, torch.from_numpy(r_ref))


def test_expand_refuses_set_padding_bits(kernels: SimpleNamespace) -> None:
    m = matrix(2, 37)
    packed, counts, sums = pack_signs(m)
    means, _ = column_means(counts, sums, 37)
    bad = torch.from_numpy(packed.copy())
    bad[1, 4] |= 0x80  # bit 39 of column 1: past the 37 rows
    out = matrix(2, 37, seed=9)
    before = out.clone()
    _, ok = kernels.signs.triton_expand_signs(bad, torch.from_numpy(means), 37, out=out)
    assert not ok
    assert same_bits(out, before)
