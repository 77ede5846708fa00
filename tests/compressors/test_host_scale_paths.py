"""The host (NumPy) paths of the per-payload scale checks and multipliers give what the torch
operations they replace give, bit for bit, and reject what those reject."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradzip.compressors._scaled_body import check_scales
from gradzip.compressors._scaled_stochastic import FLOAT32_MAX, decoder_steps, finite_values_bound
from gradzip.errors import CorruptPayloadError


def _awkward_scales(count: int, seed: int) -> torch.Tensor:
    """Random float32 scales over every binade, with zeros, subnormals and float32's largest."""
    rng = np.random.default_rng(seed)
    exponents = rng.uniform(-149, 128, size=count)
    top = float(np.finfo(np.float32).max)
    values = np.minimum(rng.uniform(1, 2, size=count) * 2.0**exponents, top).astype(np.float32)
    values[::7] = 0.0
    values[1::11] = np.float32(1e-45)  # the smallest subnormal
    values[2::13] = np.finfo(np.float32).max
    return torch.from_numpy(values)


@pytest.mark.parametrize("s", [1, 3, 16, 127, 2**15])
@pytest.mark.parametrize("count", [1, 5, 4096])
def test_host_decoder_steps_are_the_float64_division_rounded_once(s: int, count: int) -> None:
    scales = _awkward_scales(count, seed=s + count)
    expected = (scales.to(torch.float64) / s).to(torch.float32)
    got = decoder_steps(scales, s)
    assert got.dtype == torch.float32
    assert torch.equal(got.view(torch.int32), expected.view(torch.int32))


@pytest.mark.parametrize("count", [1, 3, 1000])
def test_host_finite_bound_agrees_with_the_torch_maximum(count: int) -> None:
    mults = _awkward_scales(count, seed=count)
    for s in (1, 16, 2**15):
        expected = float(mults.max()) * s <= FLOAT32_MAX
        assert finite_values_bound(mults, s) is expected
    assert finite_values_bound(torch.empty(0), 16) is True


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf"), -1.0, -1e-45])
@pytest.mark.parametrize("count", [1, 2, 777])
def test_host_scale_check_rejects_what_no_sender_writes(bad: float, count: int) -> None:
    scales = _awkward_scales(count, seed=count)
    check_scales(scales, "qsgd")  # a valid set passes
    scales[count // 2] = bad
    with pytest.raises(CorruptPayloadError, match="qsgd payload holds a negative or non-finite"):
        check_scales(scales, "qsgd")


def test_host_scale_check_accepts_negative_zero_as_torch_did() -> None:
    check_scales(torch.tensor([-0.0, 1.0]), "qsgd")
    check_scales(torch.empty(0), "qsgd")
