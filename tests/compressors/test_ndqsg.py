"""NDQSG and the nested scalar quantizer (spec 1.5-1.8): the Fig. 3 worked example, the codec
against the scalar functions, the success MSE, failures against the Chebyshev bound and the
sufficient condition, the failure lattice, alpha = 1 equals DQSG, zero buckets, bits."""

from __future__ import annotations

import math

import pytest
import torch

from gradzip.codecs.symbols import packed_symbol_bits
from gradzip.compressors.dqsg import DQSG
from gradzip.compressors.ndqsg import (
    NDQSG,
    chebyshev_failure_bound,
    failure_rate,
    nested_decode,
    nested_encode,
    nested_success_bound,
)
from gradzip.errors import CorruptPayloadError, PayloadMismatchError
from gradzip.keys import StreamKey
from gradzip.payload import overhead_bits, parse_payload
from gradzip.rng import shared_uniform

KEY = StreamKey(run_seed=5, rank=4, step=2, tensor_index=1)
N = 200_000


def test_fig3_worked_example() -> None:
    # Delta1 = 1, Delta2 = 3, alpha = 1, x = -4.2, u = 0.3: t = -3.9, Q1 = -4, Q2 = -3, s = -1
    assert nested_encode(-4.2, 0.3, 1.0, 3) == -1
    assert nested_decode(-1, 0.3, -3.4, 1.0, 3) == pytest.approx(-4.3, abs=1e-12)
    # the coset of s = -1 with this dither: t in {-4, -1, 2, 5} (the spec's "2.7" would give
    # t = 3, s = 0; its own formula puts 1.7 in the coset)
    for x in (-4.3, -1.3, 1.7, 4.7):
        assert nested_encode(x, 0.3, 1.0, 3) == -1
    assert nested_encode(2.7, 0.3, 1.0, 3) == 0
    with pytest.raises(ValueError):
        nested_encode(0.0, 0.0, 1.0, 4)


def side_information(g: torch.Tensor, spread: float, seed: int) -> torch.Tensor:
    """``y = g - z`` with ``z ~ spread * U[-1, 1]`` (normalised units when max|g| = 1)."""
    gen = torch.Generator().manual_seed(seed)
    return g - spread * (2 * torch.rand(g.shape, generator=gen) - 1)


def unit_scale_input(seed: int, n: int = N) -> torch.Tensor:
    g = 2 * torch.rand(n, generator=torch.Generator().manual_seed(seed)) - 1
    g[0] = 1.0  # sigma = 1 exactly: normalised units are the tensor's own
    return g


def test_codec_matches_the_scalar_functions() -> None:
    L1, k, alpha = 3, 5, 0.8
    g = unit_scale_input(1, 300)
    y = side_information(g, 0.6, 2)
    comp = NDQSG(L1=L1, k=k, alpha=alpha, bucket_size=None)
    enc = comp.encode(g, KEY)
    out = comp.decode(enc.payload, side=y)
    u = (shared_uniform(KEY, g.numel()).double() - 0.5) / L1  # the dither in original units
    symbols = enc.streams[0]
    h = (k - 1) // 2
    for i in range(g.numel()):
        s = nested_encode(float(g[i]), float(u[i]), 1 / L1, k, alpha)
        assert int(symbols[i]) - h == s
        expected = nested_decode(s, float(u[i]), float(y[i]), 1 / L1, k, alpha)
        assert float(out[i]) == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("alpha", [1.0, 0.8])
def test_success_mse_formula(alpha: float) -> None:
    L1, k = 3, 3
    d1, d2 = 1 / L1, k / L1
    g = unit_scale_input(3)
    # |alpha*z| stays below the sufficient condition: no failures
    spread = 0.9 * nested_success_bound(d1, k, alpha)
    y = side_information(g, spread, 4)
    comp = NDQSG(L1=L1, k=k, alpha=alpha, bucket_size=None)
    out = comp.round_trip(g, KEY, side=y)[1].double()
    z = g.double() - y.double()
    assert failure_rate(g, out, y, L1=L1, alpha=alpha) == 0.0
    err2 = (out - g.double()).pow(2)
    # spec 1.8 (2), in normalized units: alpha^2 Delta1^2 / 12 + (1 - alpha^2)^2 sigma_z^2
    sigma_z2 = float(z.pow(2).mean())
    formula = alpha**2 * d1**2 / 12 + (1 - alpha**2) ** 2 * sigma_z2
    # per element the error is alpha*c*e + (1 - alpha^2) z with e ~ U[-1/2, 1/2]; its square's
    # variance over the dither is alpha^4 c^4/180 + 4 ((1 - alpha^2) z)^2 alpha^2 c^2/12
    b2 = (1 - alpha**2) ** 2 * sigma_z2
    var = alpha**4 * d1**4 / 180 + 4 * b2 * alpha**2 * d1**2 / 12
    assert abs(float(err2.mean()) - formula) < 5 * math.sqrt(var / N)
    assert d2 > d1


@pytest.mark.parametrize(("alpha", "spread"), [(1.0, 0.6), (1.0, 1.2), (0.7, 1.2)])
def test_failures_bounded_by_chebyshev_and_on_the_lattice(alpha: float, spread: float) -> None:
    L1, k = 3, 3
    d1, d2 = 1 / L1, k / L1
    g = unit_scale_input(5)
    y = side_information(g, spread, 6)
    comp = NDQSG(L1=L1, k=k, alpha=alpha, bucket_size=None)
    out = comp.round_trip(g, KEY, side=y)[1].double()
    z = g.double() - y.double()
    p_fail = failure_rate(g, out, y, L1=L1, alpha=alpha)
    bound = chebyshev_failure_bound(d1, k, alpha, float(z.pow(2).mean()))
    assert 0 < p_fail <= bound
    # the exact failure event, in fine steps: |alpha*z/c + e| > k/2, with e = q1 - t the fine
    # rounding error of t = alpha*g/c + up (Thm 6 models e by the dither itself)
    t = alpha * g.double() / d1 + shared_uniform(KEY, N).double() - 0.5
    e = torch.floor(t + 0.5) - t
    exact = ((alpha * z / d1 + e).abs() > k / 2).double().mean()
    assert p_fail == pytest.approx(float(exact), abs=20 / N)
    # error = -alpha*c*e - (1-alpha^2)*z + m*alpha*Delta2 with |alpha*c*e| <= alpha*Delta1/2
    d = (out - g.double()) + (1 - alpha**2) * z
    m = torch.floor(d / (alpha * d2) + 0.5)
    assert float((d - m * alpha * d2).abs().max()) <= alpha * d1 / 2 + 1e-5
    assert bool((m != 0).any())


def test_alpha_one_small_z_is_dqsg_with_the_fine_step() -> None:
    L1 = 3
    g = torch.randn(N, generator=torch.Generator().manual_seed(7)) * torch.linspace(0.1, 2, N)
    sigma = float(g.abs().max())
    y = g - 0.2 * sigma * (2 * torch.rand(N, generator=torch.Generator().manual_seed(8)) - 1)
    out = NDQSG(L1=L1, bucket_size=None).round_trip(g, KEY, side=y)[1]
    dq = DQSG(M=L1, bucket_size=None).round_trip(g, KEY)[1]  # same key, same dither
    assert float((out - dq).abs().max()) <= 1e-5 * sigma
    e = (out - g).double() / (sigma / L1)
    s = torch.sort(e).values
    cdf = (s + 0.5).clamp(0, 1)
    i = torch.arange(1, N + 1, dtype=torch.float64)
    ks = float(torch.maximum(i / N - cdf, cdf - (i - 1) / N).max())
    assert ks < 2.0 / math.sqrt(N)
    corr = float(torch.corrcoef(torch.stack((e, g.double())))[0, 1])
    assert abs(corr) < 5 / math.sqrt(N)


def test_zero_buckets_side_information_and_bits() -> None:
    g = torch.randn(3, 100, generator=torch.Generator().manual_seed(9))
    g[1] = 0.0
    comp = NDQSG(bucket_size=100)
    y = g + 0.01
    enc, out = comp.round_trip(g, KEY, side=y)
    assert torch.equal(out[1], torch.zeros(100)) and not bool(torch.signbit(out[1]).any())
    header, _ = parse_payload(enc.payload)
    bits = 32 * 3 + packed_symbol_bits(300, 3, "fixed")  # type: ignore[operator]
    assert comp.expected_body_bits(g) == bits
    assert enc.wire_bits == overhead_bits(header) + bits
    assert enc.paper_bits == pytest.approx(96 + 300 * math.log2(3))
    with pytest.raises(ValueError, match="side information"):
        comp.decode(enc.payload)
    with pytest.raises(PayloadMismatchError):
        comp.decode(enc.payload, side=torch.zeros(10))


def test_a_non_finite_output_found_by_the_fused_decoder_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the bound on the output says no clamp is needed, the kernel's own finite check
    decides: a flagged tile raises (the kernel's flag forced here: a finite payload cannot trip
    it, which is the point of the bound)."""
    import gradzip.compressors.ndqsg as module

    g = torch.randn(2000, generator=torch.Generator().manual_seed(4))
    comp = NDQSG(bucket_size=100)
    payload = comp.encode(g, KEY).payload
    real = module.fused_decode_nested
    monkeypatch.setattr(
        module, "fused_decode_nested", lambda *a, **k: real(*a, **k)._replace(nonfinite=True)
    )
    with pytest.raises(CorruptPayloadError, match="non-finite"):
        comp.decode(payload, side=g)


def test_exact_paths_for_large_levels_and_far_side_information() -> None:
    g = unit_scale_input(10, 5000)
    for comp, y in (
        (NDQSG(L1=200, k=7, bucket_size=None), g + 1e-4),
        (NDQSG(bucket_size=None), g * 0 + 1e35),
    ):
        out = comp.round_trip(g, KEY, side=y)[1]
        assert bool(torch.isfinite(out).all())
    out = NDQSG(L1=200, k=7, bucket_size=None).round_trip(g, KEY, side=g + 1e-4)[1]
    assert float((out - g).abs().max()) <= 0.5 / 200 * 1.001


# -- the device path (gradzip.device) in non-default configurations ---------------------------
DEVICE_CONFIGS = [
    {"L1": 3, "k": 3},
    {"L1": 8, "k": 5, "alpha": 0.75, "bucket_size": 64},
    {"L1": 40, "k": 255, "bucket_size": None},
    {"L1": 300, "k": 301, "bucket_size": 100},
    {"L1": 2, "k": 7, "seed_schedule": "chain", "chain_draws": 5000},
]


@pytest.mark.parametrize("params", DEVICE_CONFIGS, ids=str)
@pytest.mark.parametrize("scale", [1.0, 1e-39, 3e37])
def test_device_payload_and_decode_equal_the_host_path(
    params: dict[str, object], scale: float
) -> None:
    from tests.compressors.device_checks import (
        check_device_decode,
        check_twin_bytes,
        encode_fake_cuda,
    )

    codec = NDQSG(**params)  # type: ignore[arg-type]
    assert codec.device_resident
    g = torch.Generator().manual_seed(len(params))
    x = torch.randn(1537, generator=g) * torch.rand(1537, generator=g).pow(3) * scale
    x[500:570] = 0.0
    y = x + 0.1 * scale * torch.randn(1537, generator=g)
    check_twin_bytes(codec, x, KEY)
    check_device_decode(codec, x, KEY, side=y)
    if scale <= 1.0:  # far side information in some buckets: those decode in float64
        far = y.clone()
        far[:700] += 1e31
        check_device_decode(codec, x, KEY, side=far)
    assert encode_fake_cuda(codec, (1537,), KEY) == len(codec.encode(x, KEY).payload)


@pytest.mark.parametrize("packing", ["dense", "entropy"])
def test_dense_and_entropy_packings_stay_on_the_host(packing: str) -> None:
    assert not NDQSG(packing=packing).device_resident  # type: ignore[arg-type]
