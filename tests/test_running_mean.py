"""The nested scheme's one-pass running-mean update gives the torch expression's bits."""

from __future__ import annotations

import torch

from gradzip.kernels.running_mean import update_running_mean_


def test_running_mean_update_is_the_torch_expression_bitwise() -> None:
    gen = torch.Generator().manual_seed(4)
    n = 200_003  # several parallel tasks and a partial one
    g = torch.randn(n, generator=gen) * torch.logspace(-30, 30, n)
    g[:7] = torch.tensor([-0.0, 0.0, 1e-45, -1e-45, 3e38, -3e38, 1.0])
    for cnt in (1, 2, 3, 7):
        mean = torch.randn(n, generator=gen) * 1e3
        mean[:3] = torch.tensor([0.0, -0.0, 0.0])
        expected = mean.clone()
        expected += (g - expected) / cnt
        got = update_running_mean_(mean.clone(), g, cnt)
        assert got.view(torch.int32).equal(expected.view(torch.int32)), cnt


def test_other_dtypes_take_the_torch_expression() -> None:
    g = torch.randn(1000, dtype=torch.float64)
    mean = torch.zeros(1000, dtype=torch.float64)
    expected = mean + (g - mean) / 3
    assert update_running_mean_(mean, g, 3).equal(expected)
