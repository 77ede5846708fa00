"""The torch-operations path's own arithmetic (against the kernels: test_fused_paths)."""

from __future__ import annotations

import numpy as np
import torch

from gradzip.kernels.dithered_device import bucket_factors


def test_bucket_factors_divide_once_as_the_kernels_do() -> None:
    """``numer / sigma`` correctly rounded (one IEEE division), not ``numer * (1 / sigma)``,
    which differs in the last bit for most ``sigma`` when ``numer`` is not a power of two."""
    scales = torch.rand(20_000, generator=torch.Generator().manual_seed(3)) + 0.01
    got = bucket_factors(3.0, scales).numpy()
    want = np.float64(3.0) / scales.to(torch.float64).numpy()
    assert np.array_equal(got, want)
    twice_rounded = np.float64(3.0) * (1.0 / scales.to(torch.float64).numpy())
    assert not np.array_equal(twice_rounded, want)  # the check can tell the two apart
