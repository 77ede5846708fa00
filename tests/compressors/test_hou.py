"""Hou's b-bit max-norm quantizer: unbiasedness, variance, the omega bound and scaled variant."""

from __future__ import annotations

import math

import pytest
import torch

from gradzip.compressors.hou import Hou
from gradzip.keys import StreamKey
from gradzip.payload import overhead_bits, parse_payload

KEY = StreamKey(run_seed=5, rank=3, step=0, tensor_index=0)


def moments(x: torch.Tensor, s: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """E[e_i^2], E[e_i^4] and the round-up probability of |x_i| on ||x||_inf/s * {0..s}."""
    step = x.abs().max().double() / s
    v = x.abs().double() / step
    lo = v.floor()
    p = v - lo
    e2 = ((1 - p) * (v - lo) ** 2 + p * (lo + 1 - v) ** 2) * step**2
    e4 = ((1 - p) * (v - lo) ** 4 + p * (lo + 1 - v) ** 4) * step**4
    return e2, e4, p


def errors(comp: Hou, x: torch.Tensor, trials: int) -> torch.Tensor:
    return torch.stack(
        [comp.round_trip(x, KEY.with_step(t))[1].double() - x.double() for t in range(trials)]
    )


def test_levels_and_exact_bits() -> None:
    assert Hou().s == 127 and Hou(b=2).s == 1 and Hou(b=4).s == 7
    x = torch.randn(999, generator=torch.Generator().manual_seed(0))
    for b in (2, 3, 8, 12):
        comp = Hou(b=b)
        enc = comp.encode(x, KEY)
        body = 32 + 8 * math.ceil(b * 999 / 8)  # 32 + b*d, padded to a byte
        assert comp.expected_body_bits(x) == body
        assert enc.wire_bits == overhead_bits(parse_payload(enc.payload)[0]) + body
        assert enc.paper_bits == pytest.approx(999 * math.log2(2**b - 1) + 32)
    for bad in (1, 17, 8.0, True):
        with pytest.raises(ValueError, match="b must"):
            Hou(b=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("b", [2, 4])
def test_unbiased_with_the_per_coordinate_variance(b: int) -> None:
    x = torch.randn(800, generator=torch.Generator().manual_seed(1)) ** 3
    comp, trials = Hou(b=b), 300
    err = errors(comp, x, trials)
    e2, e4, p = moments(x, comp.s)
    # the normal approximation of the mean needs both outcomes to be frequent
    live = torch.minimum(p, 1 - p) * trials >= 10
    z = err.mean(0)[live] / (e2[live] / trials).sqrt()
    assert float(z.abs().max()) < 5.5
    total_se = math.sqrt(float((e4 - e2**2).sum()) / trials)
    assert abs(float((err**2).sum(1).mean()) - float(e2.sum())) < 5 * total_se


def omega(d: int, s: int) -> float:
    return min(d / (4 * s**2), math.sqrt(d) / s)


@pytest.mark.parametrize(
    "x",
    [
        torch.ones(64) * 0.5,  # all coordinates at mid-grid: the d/(4s^2) bound is tight
        torch.randn(400, generator=torch.Generator().manual_seed(2)),
        torch.cat((torch.tensor([10.0]), torch.full((99,), 0.05))),  # one spike
    ],
)
def test_variance_below_omega_norm_squared(x: torch.Tensor) -> None:
    """E||Q(v) - v||^2 <= omega ||v||^2: exactly (formula) and by Monte Carlo."""
    for b in (2, 3):
        comp = Hou(b=b)
        bound = omega(x.numel(), comp.s) * float(x.double().norm() ** 2)
        e2, e4, _ = moments(x, comp.s)
        assert float(e2.sum()) <= bound * (1 + 1e-9)
        trials = 300
        mse = float((errors(comp, x, trials) ** 2).sum(1).mean())
        assert mse <= bound + 5 * math.sqrt(float((e4 - e2**2).sum()) / trials)


def test_scaled_variant_is_delta_approximate() -> None:
    """C = Q/(1+omega): E||C(v) - v||^2 <= (1 - delta)||v||^2 with delta = 1/(1+omega)."""
    gen = torch.Generator().manual_seed(3)
    for x, b in ((torch.randn(300, generator=gen), 2), (torch.ones(16), 2), (torch.randn(50), 3)):
        plain, scaled = Hou(b=b), Hou(b=b, scaled=True)
        w = omega(x.numel(), plain.s)
        assert scaled.omega(x.numel()) == pytest.approx(w)
        delta = 1 / (1 + w)
        trials = 300
        sq = torch.empty(trials, dtype=torch.float64)
        for t in range(trials):
            q = plain.round_trip(x, KEY.with_step(t))[1]
            c = scaled.round_trip(x, KEY.with_step(t))[1]
            assert torch.allclose(c.double(), q.double() * delta, rtol=1e-6, atol=0)
            sq[t] = (c.double() - x.double()).norm() ** 2
        bound = (1 - delta) * float(x.double().norm() ** 2)
        assert float(sq.mean()) <= bound + 5 * float(sq.std()) / math.sqrt(trials)


def test_only_the_unscaled_variant_offers_a_common_grid() -> None:
    """The scaled variant's decode factor ``1/(1 + omega)`` is not a level step the ranks can
    share, so the integer-sum schemes must not be offered it."""
    grid = Hou(b=4).common_grid()
    assert grid is not None and grid.grid_levels() == 7
    assert Hou(b=4, scaled=True).common_grid() is None
    assert Hou(b=4).contraction_delta(10) == pytest.approx(1 - Hou(b=4).omega(10))


def test_zero_and_tiny_tensors() -> None:
    comp = Hou()
    assert bool((comp.round_trip(torch.zeros(7), KEY)[1] == 0).all())
    out = comp.round_trip(torch.tensor([3e-39, -1e-40]), KEY)[1]  # subnormal scale
    assert bool(torch.isfinite(out).all())


# -- the device path (gradzip.device) in non-default configurations ---------------------------
@pytest.mark.parametrize("params", [{}, {"b": 2}, {"b": 9}, {"b": 16, "scaled": True}], ids=str)
@pytest.mark.parametrize("scale", [1.0, 1e-39, 3e37])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_device_payload_and_decode_equal_the_host_path(
    params: dict[str, object], scale: float, dtype: torch.dtype
) -> None:
    from tests.compressors.device_checks import (
        check_device_decode,
        check_twin_bytes,
        encode_fake_cuda,
    )

    codec = Hou(**params)  # type: ignore[arg-type]
    assert codec.device_resident
    g = torch.Generator().manual_seed(len(params))
    x = torch.randn(1537, generator=g) * torch.rand(1537, generator=g).pow(3) * scale
    if dtype == torch.float16:
        x = (x / scale * 60000.0).clamp(-65504, 65504).to(dtype)
    check_twin_bytes(codec, x, KEY)
    check_device_decode(codec, x, KEY)
    assert encode_fake_cuda(codec, (1537,), KEY) == len(codec.encode(x.float(), KEY).payload)


@pytest.mark.parametrize("packing", ["dense", "entropy"])
def test_dense_and_entropy_packings_stay_on_the_host(packing: str) -> None:
    assert not Hou(packing=packing).device_resident  # type: ignore[arg-type]
