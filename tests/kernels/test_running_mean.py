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


def test_strided_and_float64_means_update_in_place_with_the_same_bits() -> None:
    """Tensors the kernel does not take (a strided view, float64) are updated in place by the
    torch expression: the same bits as the kernel gives a contiguous copy (float32), and the
    float64 expression's own."""
    gen = torch.Generator().manual_seed(9)
    g = torch.randn(2 * 5_000, generator=gen)[::2]
    mean = torch.randn(2 * 5_000, generator=gen)[::2]
    wide, g64 = mean.double(), g.double()
    expected = wide + (g64 - wide) / 3
    kernel = update_running_mean_(mean.contiguous(), g.contiguous(), 3)
    assert not mean.is_contiguous()
    assert update_running_mean_(mean, g, 3) is mean
    assert mean.view(torch.int32).equal(kernel.view(torch.int32))
    assert update_running_mean_(wide, g64, 3) is wide
    assert wide.equal(expected)
