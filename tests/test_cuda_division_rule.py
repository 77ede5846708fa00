"""The CUDA division-rule emulation the device-path tests run under (tests/cuda_division_rule.py)."""

from __future__ import annotations

import torch

from gradzip.kernels.device_division import divided
from tests.cuda_division_rule import cuda_scalar_division, reciprocal_product


def values() -> torch.Tensor:
    return torch.linspace(1.0, 2.0, 4097, dtype=torch.float64)


def test_a_python_number_divisor_becomes_a_reciprocal_product() -> None:
    x = values()
    true = x / 3.0
    recip = x * (1.0 / 3.0)
    assert not torch.equal(true, recip)  # the two roundings differ somewhere in [1, 2]
    with cuda_scalar_division():
        assert torch.equal(x / 3.0, recip)
        assert torch.equal(torch.div(x, 3.0), recip)
        y = x.clone()
        y /= 3.0
        assert torch.equal(y, recip)
    assert torch.equal(x / 3.0, true)  # nothing left patched


def test_half_precision_divides_through_a_float32_reciprocal() -> None:
    x = values().to(torch.bfloat16)
    want = (x.float() * (torch.ones(()) / torch.tensor(7.0))).to(torch.bfloat16)
    assert torch.equal(reciprocal_product(x, 7.0), want)


def test_a_device_scalar_divisor_keeps_the_true_division() -> None:
    x = values()
    with cuda_scalar_division():
        assert torch.equal(divided(x, 3.0), x / torch.tensor(3.0, dtype=torch.float64))


def test_a_rounding_division_is_left_alone() -> None:
    """Multiples of 49: their quotients are whole, but ``k * 49 * (1 / 49)`` falls just below
    ``k`` for most of them, so a rounding division taken for a reciprocal product would floor
    them to ``k - 1``."""
    k = torch.arange(4097, dtype=torch.float64)
    x = k * 49.0
    assert not torch.equal(torch.floor(x * (1.0 / 49.0)), k)  # the trap is real
    with cuda_scalar_division():
        assert torch.equal(x.div(49.0, rounding_mode="floor"), k)
        assert torch.equal(torch.div(x, 49.0, rounding_mode="trunc"), k)
