"""The sign-bit kernels of one-bit quantization (:mod:`gradzip.kernels.onebit_signs`): the
numba passes against a reference, their torch twins and the defined order of the column
sums."""

from __future__ import annotations

import numba
import numpy as np
import pytest
import torch

from gradzip.kernels.onebit_signs import (
    column_means,
    column_means_torch,
    expand_add_signs,
    expand_signs,
    expand_signs_torch,
    pack_signs,
    pack_signs_torch,
    sign_sums_torch,
    subtract_reconstruction,
)


def _reference_pack(m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The previous encoder's bits: a zero-padded bool buffer through ``np.packbits``."""
    cols, rows = m.shape
    words = -(-rows // 32)
    bits = np.zeros((cols, 32 * words), dtype=np.bool_)
    bits[:, :rows] = m >= 0
    return np.packbits(bits, axis=1, bitorder="little"), np.count_nonzero(bits, axis=1)


#: the last two span several parallel tasks of 2**17 entries (a flat bucket is one column),
#: one ending in a partial task and word, one in whole tasks
SHAPES = [
    (1, 1),
    (1, 31),
    (1, 32),
    (1, 33),
    (3, 64),
    (5, 95),
    (7, 1000),
    (64, 3),
    (2, 4099),
    (1, 3 * 2**17 + 4099),
    (2, 2**18),
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("transposed", [False, True])
def test_sign_kernels_match_the_reference_and_the_torch_twin(
    shape: tuple[int, int], transposed: bool
) -> None:
    gen = torch.Generator().manual_seed(shape[0] * 7919 + shape[1])
    base = torch.randn(shape, generator=gen)
    base[base.abs() < 0.1] = 0.0
    base.view(-1)[::5] = -0.0  # -0.0 counts as non-negative
    m = base.t() if transposed else base  # a strided view, as group="in" gives
    packed, counts, sums = pack_signs(m)
    ref_packed, ref_n_pos = _reference_pack(m.numpy())
    assert np.array_equal(packed, ref_packed) and np.array_equal(counts[:, 0], ref_n_pos)
    assert np.array_equal(counts[:, 1], (m < 0).sum(dim=1).numpy())
    twin_packed, twin_counts, twin_sums = pack_signs_torch(m)
    assert np.array_equal(twin_packed.numpy(), packed)
    assert np.array_equal(twin_counts.numpy(), counts)
    assert twin_sums.numpy().tobytes() == sums.tobytes()  # bitwise, the defined order
    exact = torch.stack([m.double().clamp(min=0).sum(1), m.double().clamp(max=0).sum(1)], 1)
    assert torch.allclose(torch.from_numpy(sums), exact, rtol=1e-12, atol=0)
    rows = m.shape[1]
    assert np.array_equal(
        column_means(counts, sums, rows)[0],
        column_means_torch(twin_counts, twin_sums, rows).numpy(),
    )
    means = torch.randn((m.shape[0], 2), generator=gen)
    # the output is written through the same kind of strided view
    rows_first = torch.full((m.shape[1], m.shape[0]), float("nan"))
    out = rows_first.t() if transposed else torch.full(m.shape, float("nan"))
    assert expand_signs(packed, means.numpy(), out.numpy())
    twin, ok = expand_signs_torch(torch.from_numpy(packed), means, m.shape[1])
    assert ok and torch.equal(out, twin)
    assert torch.equal(out, torch.where(m >= 0, means[:, :1], means[:, 1:]))


@pytest.mark.parametrize("shape", [(37, 2000), (2, 5 * 2**17 + 17)])
def test_sign_kernels_do_not_depend_on_the_thread_count(shape: tuple[int, int]) -> None:
    m = torch.randn(shape, generator=torch.Generator().manual_seed(4))
    means = np.random.default_rng(0).standard_normal((shape[0], 2)).astype(np.float32)
    results = []
    before = numba.get_num_threads()
    try:
        for threads in sorted({1, numba.config.NUMBA_NUM_THREADS}):
            numba.set_num_threads(threads)
            packed, counts, sums = pack_signs(m)
            out = np.empty(shape, dtype=np.float32)
            assert expand_signs(packed, means, out)
            results.append((packed.tobytes(), counts.tobytes(), sums.tobytes(), out.tobytes()))
    finally:
        numba.set_num_threads(before)
    assert all(r == results[0] for r in results)


@pytest.mark.parametrize("shape", [(3, 70), (1, 2**17 + 33)])
def test_expand_add_and_the_residual_equal_torch_operations(shape: tuple[int, int]) -> None:
    """The adding decode is ``out + V_hat`` and the feedback step ``m - V_hat`` (and
    ``V_hat``) bitwise, one float32 operation per entry, across whole and partial tasks."""
    gen = torch.Generator().manual_seed(shape[1])
    m = torch.randn(shape, generator=gen)
    m.view(-1)[::7] = -0.0
    means = torch.randn((shape[0], 2), generator=gen)
    v_hat = torch.where(m >= 0, means[:, :1], means[:, 1:])
    packed = pack_signs(m)[0]
    out = torch.randn(shape, generator=gen)
    expected = out + v_hat
    assert expand_add_signs(packed, means.numpy(), out.numpy())
    assert torch.equal(out, expected)
    residual, kept = m.clone(), torch.full(shape, float("nan"))
    subtract_reconstruction(residual.numpy(), means.numpy(), kept.numpy())
    assert torch.equal(residual, m - v_hat) and torch.equal(kept, v_hat)
    residual = m.clone()
    subtract_reconstruction(residual.numpy(), means.numpy())
    assert torch.equal(residual, m - v_hat)


@pytest.mark.parametrize("rows", [5, 33])
def test_set_padding_bits_are_refused_by_both_paths(rows: int) -> None:
    packed = pack_signs(torch.ones((2, rows)))[0]
    packed[1, -1] |= 0x80
    out = np.empty((2, rows), dtype=np.float32)
    means = np.ones((2, 2), dtype=np.float32)
    untouched = out.copy()
    assert not expand_signs(packed, means, out)
    assert not expand_add_signs(packed, means, out)
    assert out.tobytes() == untouched.tobytes()
    assert not expand_signs_torch(torch.from_numpy(packed), torch.from_numpy(means), rows)[1]


def _tree_sums(m: torch.Tensor) -> torch.Tensor:
    """A reference of the defined summation order written from its definition: per lane, the
    zero-padded power-of-two tree over words, then the tree over the 32 lanes (Python floats,
    which are IEEE float64)."""
    out = []
    for row in m.double().tolist():
        pair = []
        for keep in (lambda v: v > 0, lambda v: v < 0):
            vals = [v if keep(v) else 0.0 for v in row]
            words = -(-len(vals) // 32)
            slots = 1 << max(words - 1, 0).bit_length()
            vals += [0.0] * (32 * slots - len(vals))
            lanes = [vals[j::32] for j in range(32)]
            level = [_tree(lane) for lane in lanes]
            pair.append(_tree(level))
        out.append(pair)
    return torch.tensor(out, dtype=torch.float64)


def _tree(vals: list[float]) -> float:
    while len(vals) > 1:
        vals = [vals[i] + vals[i + 1] for i in range(0, len(vals), 2)]
    return vals[0]


@pytest.mark.parametrize("shape", [(3, 1), (2, 31), (2, 33), (3, 97), (1, 5000), (4, 1025)])
def test_column_sums_follow_the_documented_order(shape: tuple[int, int]) -> None:
    """Kernel, torch twin and a from-the-definition reference agree bit for bit; long
    columns exercise the kernel's binary-counter merges against the padded tree."""
    gen = torch.Generator().manual_seed(shape[1])
    m = torch.randn(shape, generator=gen) * torch.logspace(-20, 20, shape[1]).float()
    m.view(-1)[::7] = -0.0
    sums = pack_signs(m)[2]
    assert sums.tobytes() == _tree_sums(m).numpy().tobytes()
    assert sums.tobytes() == sign_sums_torch(m).numpy().tobytes()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_the_packing_pass_sees_non_finite_entries(bad: float) -> None:
    m = torch.randn(3, 40, generator=torch.Generator().manual_seed(1))
    assert column_means(*pack_signs(m)[1:], 40)[1]
    m[1, 17] = bad
    assert not column_means(*pack_signs(m)[1:], 40)[1]
