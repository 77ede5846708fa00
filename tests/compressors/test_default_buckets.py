"""The max-norm quantizers' defaults train wide layers: one float32 scale per 512 entries.

With one scale per tensor (the papers' setting), every entry's error scales with the tensor's
largest entry. A wide layer's gradient has rows of very different magnitudes (here: the scale
of each 4096-entry row drawn log-uniformly over three decades, as neurons' gradients are), so
that error swamps the small rows: through the DDP hook a 784-4096-4096-4096-10 MLP diverged
within 7 steps with dqsg M=2, qsgd and terngrad (``benchmarks/wide_mlp_defaults.py`` repeats
that run). The tests check the default's mean squared error against its bucketed variance
formula, which the per-tensor default exceeds several times over.
"""

from __future__ import annotations

import pytest
import torch

import gradzip
from gradzip.compressors.buckets import DEFAULT_BUCKET_SIZE
from gradzip.keys import StreamKey

ROWS, WIDTH = 128, 4096


def wide_gradient() -> torch.Tensor:
    gen = torch.Generator().manual_seed(5)
    row_scales = 10 ** (-3 * torch.rand(ROWS, 1, generator=gen))
    return (torch.randn(ROWS, WIDTH, generator=gen) * row_scales).flatten()


def bucket_max_squares(g: torch.Tensor, bucket: int) -> torch.Tensor:
    """``n_b * sigma_b^2`` summed over the buckets: the variance formulas' common factor."""
    sigma = g.view(-1, bucket).abs().amax(dim=1)
    return bucket * (sigma.double() ** 2).sum()


def squared_error(name: str, g: torch.Tensor, **params: object) -> float:
    comp = gradzip.create(name, **params)
    _, out = comp.round_trip(g, StreamKey(run_seed=1, tensor_index=0))
    return float(((out.double() - g.double()) ** 2).sum())


def test_the_default_bucket_is_512_for_every_max_norm_quantizer() -> None:
    for name in ("dqsg", "ndqsg", "half_dither", "qsgd", "terngrad", "qsgd_l2"):
        assert gradzip.create(name).bucket_size == DEFAULT_BUCKET_SIZE == 512, name
        assert gradzip.create(name, bucket_size=None).bucket_size == 0, name  # the papers'


def test_default_dqsg_error_is_its_bucketed_variance() -> None:
    """DQSG's error is exactly uniform: E||e||^2 = (Delta^2/12) sum_b n_b sigma_b^2. Over 2^19
    entries the measured sum is within a few percent of it (its relative standard deviation
    here is about 1%, from the few largest rows)."""
    g = wide_gradient()
    delta = 1 / 2
    bucketed = (delta**2 / 12) * float(bucket_max_squares(g, 512))
    per_tensor = (delta**2 / 12) * g.numel() * float(g.abs().max()) ** 2
    assert per_tensor > 10 * bucketed  # the input is what makes the default matter
    assert squared_error("dqsg", g, M=2) == pytest.approx(bucketed, rel=0.05)


@pytest.mark.parametrize(("name", "levels"), [("qsgd", 1), ("terngrad", 1)])
def test_default_stochastic_rounding_error_stays_under_its_bucketed_bound(
    name: str, levels: int
) -> None:
    """Stochastic rounding to steps of sigma_b/s has variance at most step^2/4 per entry, so
    E||e||^2 <= sum_b n_b sigma_b^2 / (4 s^2). With one scale per tensor the error is about
    sigma_max * sum|g_i|, nearly twice that bound on this input."""
    g = wide_gradient()
    bound = float(bucket_max_squares(g, 512)) / (4 * levels**2)
    per_tensor_expectation = float(g.abs().max() * g.abs().sum() - (g.double() ** 2).sum())
    assert per_tensor_expectation > 1.5 * bound
    assert squared_error(name, g) < 1.02 * bound
