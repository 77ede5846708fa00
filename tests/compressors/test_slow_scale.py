"""Slow checks (``pytest -m slow``, run by CI): the statistical laws at a sample size where a
subtly wrong dither (coarse resolution, an offset, correlated streams) shows, and every
compressor on a tensor of 2^22 coordinates."""

from __future__ import annotations

import math

import pytest
import torch

from gradzip.compressors import get, names
from gradzip.compressors.buckets import bucket_absmax, per_element
from gradzip.compressors.dqsg import DQSG
from gradzip.compressors.ndqsg import NDQSG
from gradzip.keys import StreamKey
from gradzip.payload import overhead_bits, parse_payload

pytestmark = pytest.mark.slow

N = 1 << 22
KEY = StreamKey(run_seed=31, rank=5, step=1001, tensor_index=3)
# P(sqrt(n) * D > 2.0) ~ 7e-4 under the null hypothesis; the keys are fixed, so no flakes. A
# dither with 8-bit resolution would give D ~ 1/512, i.e. sqrt(n) * D ~ 4.
KS_LIMIT = 2.0 / math.sqrt(N)


def ks_uniform01(samples: torch.Tensor) -> float:
    s = torch.sort(samples.double().reshape(-1)).values.clamp(0, 1)
    n = s.numel()
    i = torch.arange(1, n + 1, dtype=torch.float64)
    return float(torch.maximum(i / n - s, s - (i - 1) / n).max())


def gradient_like(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    scale = torch.logspace(-4, 1, N, dtype=torch.float32)
    g = torch.randn(N, generator=gen) * scale
    g[: N // 8] = 0.25  # a constant stretch
    g[N // 8 : N // 4] = torch.randint(-3, 4, (N // 8,), generator=gen).float() / 3  # on grid
    return g


@pytest.mark.parametrize("M", [1, 2, 7])
@pytest.mark.parametrize("kind", ["constant", "gradient_like"])
def test_dqsg_error_is_uniform_at_scale(M: int, kind: str) -> None:
    # a constant input is the hardest case: every error then comes from the dither alone
    g = torch.full((N,), -0.3) if kind == "constant" else gradient_like(M)
    comp = DQSG(M=M, bucket_size=4096)
    _, g_hat = comp.round_trip(g, KEY)
    sigma = per_element(bucket_absmax(g, 4096, float(g.abs().max())), N, 4096).double()
    e = (g_hat.double() - g.double()) / sigma * M  # U[-1/2, 1/2] in units of the step
    assert ks_uniform01(e + 0.5) < KS_LIMIT
    if kind != "constant":
        corr = float(torch.corrcoef(torch.stack((e, g.double())))[0, 1])
        assert abs(corr) < 5 / math.sqrt(N)
    # mean and variance of U[-1/2, 1/2]: 0 and 1/12, within 5 standard errors
    assert abs(float(e.mean())) < 5 * math.sqrt(1 / 12 / N)
    assert abs(float(e.var()) - 1 / 12) < 5 * math.sqrt((1 / 80 - 1 / 144) / N)


def test_ndqsg_with_close_side_information_is_dqsg_at_scale() -> None:
    g = gradient_like(11)
    side = g + 0.01 * float(g.abs().max()) * torch.randn(
        N, generator=torch.Generator().manual_seed(12)
    )
    comp = NDQSG(bucket_size=None)  # L1 = 3, k = 3, alpha = 1; one scale: sigma below
    enc = comp.encode(g, KEY)
    g_hat = comp.decode(enc.payload, expected_key=KEY, side=side)
    sigma = float(g.abs().max())
    e = (g_hat.double() - g.double()) / (sigma / 3)  # fine step units: U[-1/2, 1/2]
    assert float(e.abs().max()) <= 0.5 + 1e-4  # |z| is far below the success bound: no failure
    assert ks_uniform01(e + 0.5) < KS_LIMIT


@pytest.mark.parametrize("name", names())
def test_every_compressor_at_2_to_the_22(name: str) -> None:
    cls = get(name)
    comp = cls(**cls.example_params)
    x = torch.randn(2048, 2048, generator=torch.Generator().manual_seed(3)) * 1e-2
    enc = comp.encode(x, KEY)
    side = x if comp.needs_side_information else None
    out = comp.decode(enc.payload, expected_key=KEY, side=side)
    assert out.shape == x.shape and bool(torch.isfinite(out).all())
    header, _ = parse_payload(enc.payload)
    formula = comp.expected_body_bits(x)
    if formula is not None:
        assert enc.wire_bits == overhead_bits(header) + formula
    again = comp.decode(cls(**cls.example_params).encode(x, KEY).payload, side=side)
    assert torch.equal(out, again)
