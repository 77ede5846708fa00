"""The device division rule (:mod:`gradzip.kernels.device_division`): a true division by a 0-d
tensor on the dividend's device, the numba kernels' rounding."""

from __future__ import annotations

import numpy as np
import torch

from gradzip.kernels.device_division import device_scalar, divided


def test_divided_is_one_correctly_rounded_division() -> None:
    scales = torch.rand(20_000, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    got = divided(scales, 7.0).numpy()
    assert np.array_equal(got, scales.numpy() / np.float64(7.0))
    twice_rounded = scales.numpy() * (1.0 / np.float64(7.0))
    assert not np.array_equal(twice_rounded, got)  # the check can tell the two apart


def test_device_scalar_takes_the_dtype_and_device_of_its_model() -> None:
    like = torch.zeros(3, dtype=torch.float32)
    k = device_scalar(3, like)
    assert k.shape == () and k.dtype == torch.float32 and k.device == like.device
    assert float(k) == 3.0
