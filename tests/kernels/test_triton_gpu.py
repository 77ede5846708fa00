"""The compiled Triton kernels on a CUDA device equal the numba kernels on the CPU bit for bit
(the interpreter tests check the same arithmetic on CPU tensors). Runs where a CUDA device
exists; skipped elsewhere (CI has none)."""

from __future__ import annotations

import zlib
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from gradzip.device.crc32 import crc32_device
from gradzip.kernels.dithered import fused_decode_affine
from gradzip.kernels.onebit_signs import column_means, expand_signs, pack_signs
from gradzip.kernels.philox import SHARED_UNIFORM, philox_one_plus_uniform
from gradzip.kernels.stochastic import fused_symmetric_decode, fused_symmetric_encode
from tests.kernels.test_triton_dithered import CASES, dqsg
from tests.kernels.triton_modes import load_kernels
from tests.kernels.triton_reference import (
    SEED,
    gradient,
    numba_dithered_encode,
    same_bits,
    scales_of,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.fixture(scope="module")
def compiled() -> SimpleNamespace:
    """The kernel modules compiled for the GPU (``TRITON_INTERPRET`` unset when defined)."""
    return load_kernels(interpret=False)


@pytest.mark.parametrize("n", [1, 1031, 1 << 20])
@pytest.mark.parametrize("bucket_size", [0, 512])
def test_compiled_kernels_equal_numba(compiled: SimpleNamespace, n: int, bucket_size: int) -> None:
    x = gradient(n, seed=n, tiny_bucket=bucket_size or None)
    scales = scales_of(x, bucket_size)
    xc, sc = x.cuda(), scales.cuda()
    expected = torch.from_numpy(philox_one_plus_uniform(SEED, SHARED_UNIFORM, 3, n))
    for per_element in (False, True):
        got = compiled.philox.triton_one_plus_uniform(
            SEED, SHARED_UNIFORM, 3, n, "cuda", per_element
        )
        assert same_bits(got.cpu(), expected)
    for _, args, bits in CASES:
        want = numba_dithered_encode(x, scales, bucket_size, bits, **args)
        got = compiled.dithered.triton_dithered_encode(xc, sc, bucket_size, bits=bits, **args)
        assert same_bits(got.cpu(), want)
    packed = numba_dithered_encode(x, scales, bucket_size, 3, **dqsg(3))
    for wide in (False, True):
        args = (7, scales, bucket_size, 3.0, -1.5, True, SEED, SHARED_UNIFORM, wide, "t")
        want = fused_decode_affine(packed, n, *args)
        got = compiled.dithered.triton_decode_affine(packed.cuda(), n, *args)
        assert same_bits(got.cpu(), want)
        out = x.clone()
        fused_decode_affine(packed, n, *args, out=out)
        on_gpu = compiled.dithered.triton_decode_affine(packed.cuda(), n, *args, out=xc.clone())
        assert same_bits(on_gpu.cpu(), out)
    for per, s, clip, bits in ((1, 1, False, 2), (7, 7, True, 4), (200, 200, False, 9)):
        _, symbols, packed = fused_symmetric_encode(
            x, scales, bucket_size, per, s, clip, SEED, bits
        )
        got_s, got_p = compiled.stochastic.triton_symmetric_encode(
            xc, sc, bucket_size, per, s, clip, SEED, bits
        )
        assert same_bits(got_s.cpu(), symbols)
        assert same_bits(got_p.cpu(), packed)
        mults = scales / per
        want = fused_symmetric_decode(packed, n, bits, mults, bucket_size, s, "t")
        got = compiled.stochastic.triton_symmetric_decode(
            packed.cuda(), n, bits, mults, bucket_size, s, "t"
        )
        assert same_bits(got.cpu(), want)


@pytest.mark.parametrize(("cols", "rows"), [(1, 1), (3, 5000), (1, 1 << 20)])
def test_compiled_sign_kernels_equal_numba(compiled: SimpleNamespace, cols: int, rows: int) -> None:
    m = torch.randn(cols, rows, generator=torch.Generator().manual_seed(rows))
    packed, counts, sums = pack_signs(m)
    got = compiled.signs.triton_pack_signs(m.cuda())
    assert same_bits(got[0].cpu(), torch.from_numpy(packed))
    assert same_bits(got[1].cpu(), torch.from_numpy(counts))
    assert torch.equal(got[2].cpu().view(torch.int64), torch.from_numpy(sums).view(torch.int64))
    means, _ = column_means(counts, sums, rows)
    expected = np.empty((cols, rows), dtype=np.float32)
    assert expand_signs(packed, means, expected)
    values, ok = compiled.signs.triton_expand_signs(
        torch.from_numpy(packed).cuda(), torch.from_numpy(means), rows
    )
    assert ok
    assert same_bits(values.cpu(), torch.from_numpy(expected))


@pytest.mark.parametrize("n", [1, 4097, (1 << 24) + 3])
def test_compiled_crc32_equals_zlib(n: int) -> None:
    """The payload checksum's kernel (through the dispatch a CUDA payload takes) gives zlib's
    CRC-32, also past 2^16 blocks."""
    data = torch.randint(
        0, 256, (n,), generator=torch.Generator().manual_seed(n), dtype=torch.uint8
    )
    assert int(crc32_device(data.cuda())) == zlib.crc32(bytes(data.numpy()))
