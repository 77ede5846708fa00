"""Shared inputs and numba references of the Triton kernel tests."""

from __future__ import annotations

import numpy as np
import torch

from gradzip.kernels.buckets import effective_bucket_size, num_buckets
from gradzip.kernels.dithered import fused_encode
from gradzip.kernels.packed import packed_bytes
from gradzip.kernels.stochastic_torch import bucket_absmax_torch

#: element counts: one element, below a byte of symbols, around the 1024-element program, a
#: prime, and one of about 100k (many programs)
SIZES = (1, 5, 8, 1023, 1031, 4099, 100_003)
SEED = 0x2F1E_0D3C_4B5A_6978


def gradient(n: int, seed: int = 0, tiny_bucket: int | None = None) -> torch.Tensor:
    """A float32 test tensor: Gaussian, with exact zeros; with ``tiny_bucket`` (a bucket size),
    the second bucket holds subnormals, whose factor ``numer/sigma`` overflows float32 (the
    kernels' per-bucket float64 path) and the third is all zeros (a zero bucket)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g)
    x[::17] = 0.0
    if tiny_bucket is not None and n > 3 * tiny_bucket:
        x[tiny_bucket : 2 * tiny_bucket] *= 1e-45
        x[2 * tiny_bucket : 3 * tiny_bucket] = 0.0
    return x


def scales_of(x: torch.Tensor, bucket_size: int) -> torch.Tensor:
    """Each bucket's ``max|x_B|`` (float32; one for a one-bucket tensor)."""
    return bucket_absmax_torch(x, effective_bucket_size(x.numel(), bucket_size))


def numba_dithered_encode(
    x: torch.Tensor, scales: torch.Tensor, bucket_size: int, bits: int, **args: object
) -> torch.Tensor:
    """The packed symbols of :func:`gradzip.kernels.dithered.fused_encode` (scales given)."""
    n = x.numel()
    nb = max(1, num_buckets(n, bucket_size))
    out = np.zeros(4 * nb + packed_bytes(n, bits), dtype=np.uint8)
    if effective_bucket_size(n, bucket_size) == 0:
        _, packed = fused_encode(x, scales, bucket_size, bits=bits, out=out, **args)  # type: ignore[arg-type]
    else:  # the kernel computes the scales itself: they must be the given ones
        sc, packed = fused_encode(x, None, bucket_size, bits=bits, out=out, **args)  # type: ignore[arg-type]
        assert torch.equal(torch.from_numpy(sc.copy()), scales)
    return torch.from_numpy(packed.copy())


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal as bit patterns (float32 compared by their int32 views: -0.0 differs from 0.0)."""
    if a.dtype == torch.float32:
        a, b = a.view(torch.int32), b.view(torch.int32)
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
