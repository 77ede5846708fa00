"""The Triton kernels of the symmetric stochastic quantizers (QSGD, TernGrad, Hou, LPC) equal the
numba kernels bit for bit, run on CPU tensors by Triton's interpreter (see
:mod:`tests.kernels.triton_modes` for why the kernel modules are loaded by
:func:`load_kernels`)."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch

from gradzip.errors import CorruptPayloadError
from gradzip.kernels.stochastic import fused_symmetric_decode, fused_symmetric_encode
from gradzip.kernels.triton_dispatch import forced_triton
from tests.kernels.triton_modes import load_kernels
from tests.kernels.triton_reference import SEED, SIZES, gradient, same_bits, scales_of


@pytest.fixture
def kernels(monkeypatch: pytest.MonkeyPatch) -> Iterator[SimpleNamespace]:
    """The interpreted kernel modules, with CPU tensors let through."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with forced_triton():
        yield load_kernels(interpret=True)


#: (name, per, s, clip, bits): TernGrad / QSGD s=1 (2 bits), QSGD s=3 and s=7 (3, 4 bits),
#: s=127 (8 bits), s=200 (float64 path, 9 bits), LPC-like (per 1, clipped), symbols only
GRIDS = [
    ("terngrad", 1, 1, False, 2),
    ("qsgd-s3", 3, 3, False, 3),
    ("qsgd-s7-clip", 7, 7, True, 4),
    ("qsgd-s127", 127, 127, False, 8),
    ("qsgd-s200-wide", 200, 200, False, 9),
    ("lpc", 1, 2, True, 3),
    ("symbols-only", 3, 3, False, 0),
]


def numba_encode(
    x: torch.Tensor, scales: torch.Tensor, bucket_size: int, grid: tuple[object, ...], seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    _, per, s, clip, bits = grid
    _, symbols, packed = fused_symmetric_encode(x, scales, bucket_size, per, s, clip, seed, bits)  # type: ignore[arg-type]
    return symbols, packed


@pytest.mark.parametrize("n", SIZES[:-1])
@pytest.mark.parametrize("bucket_size", [0, 512])
@pytest.mark.parametrize("grid", GRIDS, ids=[g[0] for g in GRIDS])
def test_symmetric_encode_equals_numba(
    kernels: SimpleNamespace, n: int, bucket_size: int, grid: tuple[object, ...]
) -> None:
    x = gradient(n, seed=n, tiny_bucket=bucket_size or None)
    scales = scales_of(x, bucket_size)
    symbols, packed = numba_encode(x, scales, bucket_size, grid, SEED)
    _, per, s, clip, bits = grid
    got = kernels.stochastic.triton_symmetric_encode(
        x, scales, bucket_size, per, s, clip, SEED, bits
    )
    assert same_bits(got[0], symbols)
    assert same_bits(got[1], packed)


def test_symmetric_encode_equals_numba_on_100k_elements_and_depends_on_the_seed(
    kernels: SimpleNamespace,
) -> None:
    n = SIZES[-1]
    x = gradient(n, tiny_bucket=512)
    scales = scales_of(x, 512)
    symbols, packed = numba_encode(x, scales, 512, GRIDS[0], SEED)
    encode = kernels.stochastic.triton_symmetric_encode
    got = encode(x, scales, 512, 1, 1, False, SEED, 2)
    assert same_bits(got[0], symbols)
    assert same_bits(got[1], packed)
    other = encode(x, scales, 512, 1, 1, False, SEED + 1, 2)
    assert not same_bits(other[1], packed)  # the comparison can fail


@pytest.mark.parametrize("n", [1, 1031, 4099])
@pytest.mark.parametrize("bucket_size", [0, 512])
@pytest.mark.parametrize("grid", GRIDS[:-1], ids=[g[0] for g in GRIDS[:-1]])
def test_symmetric_decode_equals_numba(
    kernels: SimpleNamespace, n: int, bucket_size: int, grid: tuple[object, ...]
) -> None:
    x = gradient(n, seed=n + 1, tiny_bucket=bucket_size or None)
    scales = scales_of(x, bucket_size)
    _, packed = numba_encode(x, scales, bucket_size, grid, SEED)
    _, per, s, _, bits = grid
    mults = scales / float(per)  # type: ignore[arg-type]
    args = (n, bits, mults, bucket_size, s, "t")
    expected = fused_symmetric_decode(packed, *args)  # type: ignore[arg-type]
    decode = kernels.stochastic.triton_symmetric_decode
    assert same_bits(decode(packed, *args), expected)
    start = gradient(n, seed=7)
    out, ref = start.clone(), start.clone()
    fused_symmetric_decode(packed, *args, out=ref)  # type: ignore[arg-type]
    assert decode(packed, *args, out=out) is out
    assert same_bits(out, ref)
    decode(packed, *args, out=out, add=False)
    assert same_bits(out, expected)


def test_symmetric_decode_rejects_symbols_outside_the_alphabet_before_adding(
    kernels: SimpleNamespace,
) -> None:
    n = 1031
    x = gradient(n)
    scales = scales_of(x, 0)
    _, packed = numba_encode(x, scales, 0, GRIDS[0], SEED)
    packed = packed.clone()
    packed[100] = 0xFF  # four symbols 3: outside TernGrad's {0, 1, 2}
    decode = kernels.stochastic.triton_symmetric_decode
    with pytest.raises(CorruptPayloadError, match="alphabet"):
        decode(packed, n, 2, scales, 0, 1, "t")
    out = gradient(n, seed=3)
    before = out.clone()
    with pytest.raises(CorruptPayloadError, match="alphabet"):
        decode(packed, n, 2, scales, 0, 1, "t", out=out)
    assert same_bits(out, before)
