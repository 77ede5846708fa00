"""DQSG (spec 1.2-1.3): uniform signal-independent error, unbiasedness and the bucketed
variance formula, dither regeneration by a separate receiver, zero buckets, wire bits."""

from __future__ import annotations

import math

import pytest
import torch

from gradzip.codecs.symbols import packed_symbol_bits
from gradzip.compressors import create
from gradzip.compressors.dqsg import DQSG
from gradzip.errors import CorruptPayloadError, KeyMismatchError
from gradzip.keys import StreamKey
from gradzip.payload import build_payload, overhead_bits, parse_payload
from gradzip.rng import shared_uniform, shared_uniform_plus_one

KEY = StreamKey(run_seed=7, rank=3, step=11, tensor_index=2)
N = 200_000


def ks_uniform(samples: torch.Tensor, lo: float, hi: float) -> float:
    """Kolmogorov-Smirnov statistic of ``samples`` against ``U[lo, hi]``."""
    s = torch.sort(samples.double().reshape(-1)).values
    n = s.numel()
    cdf = ((s - lo) / (hi - lo)).clamp(0, 1)
    i = torch.arange(1, n + 1, dtype=torch.float64)
    return float(torch.maximum(i / n - cdf, cdf - (i - 1) / n).max())


# P(sqrt(n)*D > 2.0) = 2*exp(-8) ~ 7e-4 under the null; a wrong error law gives D >> this
KS_LIMIT = 2.0 / math.sqrt(N)


def adversarial_inputs(M: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    grid = torch.randint(-M, M + 1, (N,), generator=gen).float() / M  # exactly on grid points
    grid[0] = 1.0
    spike = torch.zeros(N)
    spike[123] = -37.5
    mixed = torch.randn(N, generator=gen) * torch.linspace(0.01, 3.0, N)
    return {"constant": torch.full((N,), 0.3), "grid": grid, "spike": spike, "mixed": mixed}


@pytest.mark.parametrize("M", [1, 2, 5])
def test_error_is_uniform_and_independent_of_the_input(M: int) -> None:
    comp = DQSG(M=M, bucket_size=None)
    for name, g in adversarial_inputs(M).items():
        _, g_hat = comp.round_trip(g, KEY)
        sigma = float(g.abs().max())
        e = (g_hat - g).double() / sigma  # in units of the scale: U[-1/(2M), 1/(2M)]
        assert float(e.abs().max()) <= 0.5 / M * (1 + 1e-5), name
        assert ks_uniform(e, -0.5 / M, 0.5 / M) < KS_LIMIT, name
        if float(g.std()) > 0:
            corr = float(torch.corrcoef(torch.stack((e, g.double())))[0, 1])
            assert abs(corr) < 5 / math.sqrt(N), name


def test_unbiased_with_the_bucketed_variance_formula() -> None:
    M, bs, n, trials = 2, 64, 1000, 400
    gen = torch.Generator().manual_seed(8)
    g = torch.randn(n, generator=gen) * torch.linspace(0.1, 10.0, n)
    g[128:192] = 0.0  # a zero bucket
    comp = DQSG(M=M, bucket_size=bs)
    errors = torch.stack(
        [comp.round_trip(g, KEY.with_step(t))[1].double() - g.double() for t in range(trials)]
    )
    sigma = torch.repeat_interleave(
        torch.stack([g[i : i + bs].abs().max() for i in range(0, n, bs)]).double(),
        torch.tensor([min(bs, n - i) for i in range(0, n, bs)]),
    )
    delta = 1.0 / M
    # per coordinate: mean error within 5 standard errors sigma*Delta/sqrt(12*trials)
    se = sigma * delta / math.sqrt(12 * trials)
    mean = errors.mean(0)
    assert bool((mean.abs() <= 5 * se + 1e-12).all())
    # E||g_hat - g||^2 = Delta^2/12 * sum_b n_b sigma_b^2; Var of one e^2 is (sigma Delta)^4/180
    expected = delta**2 / 12 * float((sigma**2).sum())
    sq = errors.pow(2).sum(1)
    se_sq = math.sqrt(float((sigma * delta).pow(4).sum()) / 180 / trials)
    assert abs(float(sq.mean()) - expected) < 5 * se_sq
    assert bool((errors[:, 128:192] == 0).all())


def test_separate_receiver_regenerates_the_dither() -> None:
    g = torch.randn(5000, generator=torch.Generator().manual_seed(1))
    enc = DQSG(M=3, bucket_size=None).encode(g, KEY)
    a = DQSG(M=3, bucket_size=None).decode(enc.payload, expected_key=KEY)
    b = create("dqsg", M=3, bucket_size=None).decode(enc.payload, expected_key=KEY)
    assert torch.equal(a, b)
    other = DQSG(M=3, bucket_size=None).encode(g, KEY.with_step(12))
    assert other.payload != enc.payload
    c = DQSG(M=3, bucket_size=None).decode(other.payload)
    assert not torch.equal(a, c)  # another step, another dither
    with pytest.raises(KeyMismatchError, match="step 11 != expected 12"):
        DQSG(M=3, bucket_size=None).decode(enc.payload, expected_key=KEY.with_step(12))


def test_zero_buckets_decode_to_zero_and_keep_the_stream_aligned() -> None:
    gen = torch.Generator().manual_seed(2)
    a, b, c = (torch.randn(100, generator=gen) for _ in range(3))
    comp = DQSG(M=1, bucket_size=100)
    with_zero = comp.round_trip(torch.cat((a, torch.zeros(100), c)), KEY)[1]
    without = comp.round_trip(torch.cat((a, b, c)), KEY)[1]
    assert torch.equal(with_zero[100:200], torch.zeros(100))
    assert not bool(torch.signbit(with_zero[100:200]).any())  # +0.0, not -0.0
    # the third bucket sees the same dither whether or not the second one was zero
    assert torch.equal(with_zero[200:], without[200:])
    assert torch.equal(
        DQSG(bucket_size=None).round_trip(torch.zeros(7, 3), KEY)[1], torch.zeros(7, 3)
    )


@pytest.mark.parametrize("M", [1, 2, 3, 7, 200])
def test_wire_and_paper_bits(M: int) -> None:
    g = torch.randn(10, 101, generator=torch.Generator().manual_seed(3))
    for comp, nb in (
        (DQSG(M=M, bucket_size=None), 1),
        (DQSG(M=M, bucket_size=100), 11),
        (DQSG(M=M, partitions=4), 4),
    ):
        enc = comp.encode(g, KEY)
        header, _ = parse_payload(enc.payload)
        bits = 32 * nb + packed_symbol_bits(g.numel(), 2 * M + 1, "fixed")  # type: ignore[operator]
        assert comp.expected_body_bits(g) == bits
        assert enc.wire_bits == overhead_bits(header) + bits
        assert enc.paper_bits == pytest.approx(32 * nb + g.numel() * math.log2(2 * M + 1))
        assert enc.side_bits == 32 * nb


def test_partitions_make_k_scales_and_exclude_bucket_size() -> None:
    g = torch.randn(1000, generator=torch.Generator().manual_seed(4))
    g[:250] *= 100
    _, out = DQSG(M=1, partitions=4).round_trip(g, KEY)
    # the quiet partitions get their own, smaller scale: their error stays below sigma_b/2
    assert float((out[250:] - g[250:]).abs().max()) <= 0.5 * float(g[250:].abs().max()) * 1.0001
    with pytest.raises(ValueError, match="either"):
        DQSG(bucket_size=10, partitions=2)
    assert DQSG(partitions=5).bucket_size_for(3) == 1  # tiny tensors: fewer than K partitions


def test_clip_std_bounds_the_scale() -> None:
    g = torch.randn(10_000, generator=torch.Generator().manual_seed(6))
    g[17] = 1000.0
    std = float(torch.std(g, correction=0))
    _, out = DQSG(M=1, clip_std=2.5, bucket_size=None).round_trip(g, KEY)
    assert float(out.abs().max()) <= 2.5 * std * 1.5 * 1.0001
    constant = torch.full((50,), 4.0)  # std 0: left alone, not clipped to zero
    assert float(DQSG(clip_std=1.0, bucket_size=None).round_trip(constant, KEY)[1].mean()) != 0.0
    # the variance of values near the float32 limit overflows float32: still a valid payload
    huge = torch.tensor([3e38, -3e38, 1.0, 2.0] * 10)
    _, out = DQSG(clip_std=1.0, bucket_size=None).round_trip(huge, KEY)
    assert bool(torch.isfinite(out).all())
    assert float(out.abs().max()) <= float(huge.double().std(correction=0)) * 1.5 * 1.0001


def test_large_m_and_subnormal_scales_take_the_exact_path() -> None:
    g = torch.randn(20_000, generator=torch.Generator().manual_seed(9))
    for M, x in ((1000, g), (1, g * 1e-40)):
        _, out = DQSG(M=M, bucket_size=None).round_trip(x, KEY)
        sigma = float(x.abs().max())
        assert float((out.double() - x.double()).abs().max()) <= 0.5 / M * sigma * 1.001


def test_symbol_out_of_range_is_corrupt() -> None:
    comp = DQSG(M=1, bucket_size=None)
    header, body = parse_payload(comp.encode(torch.randn(8), KEY).payload)
    bad = bytes(body[:4]) + b"\xff\xff"  # symbol 3 does not exist for M = 1
    with pytest.raises(CorruptPayloadError, match="symbol"):
        comp.decode(build_payload(header, [bad]))
    nan_scale = b"\x00\x00\xc0\x7f" + bytes(body[4:])
    with pytest.raises(CorruptPayloadError, match="scale"):
        comp.decode(build_payload(header, [nan_scale]))


def test_dither_stream_is_pinned() -> None:
    """The shared stream is part of the wire contract: Philox4x32-10, key = the seed's 32-bit
    halves, counter (0, 0, domain 0, 0) for the first block, each word split into two 16-bit
    halves (low first), half ``h`` giving ``u = (h + 1/2) * 2**-16``. Changing it silently would
    break mixed-version runs. (Values: the first block for the default key's seed
    8599044273385858556; its words' top 23 bits are the values this test pinned for the
    format-2 stream, 2239500, 6243369, 280989, 2748532, so the words themselves did not change.
    The halves below are these hex words split by hand.)"""
    from gradzip.kernels.philox import philox_block

    seed = 8599044273385858556
    words = (0x4458187F, 0xBE885263, 0x08933A6D, 0x53E0E90E)
    assert philox_block((0, 0, 0, 0), (seed & 0xFFFFFFFF, seed >> 32)) == words
    assert [w >> 9 for w in words] == [2239500, 6243369, 280989, 2748532]
    halves = [0x187F, 0x4458, 0x5263, 0xBE88, 0x3A6D, 0x0893, 0xE90E, 0x53E0]
    u = shared_uniform(StreamKey(), 8).double()
    assert u.tolist() == [(h + 0.5) * 2**-16 for h in halves]
    assert torch.equal(shared_uniform_plus_one(KEY, 999), shared_uniform(KEY, 999) + 1)


# -- the device path (gradzip.device) in non-default configurations ---------------------------
DEVICE_CONFIGS = [
    {"M": 1},
    {"M": 3, "bucket_size": 64},
    {"M": 127, "bucket_size": None},
    {"M": 128, "bucket_size": 100},
    {"M": 1000, "bucket_size": 512},
    {"M": 2, "partitions": 3},
    {"M": 4, "clip_std": 1.5},
    {"M": 4, "clip_std": 1.5, "bucket_size": 128},
    {"M": 2, "seed_schedule": "chain", "chain_draws": 5000},
]


def device_input(n: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.rand(n, generator=g).pow(3) * scale
    x[n // 3 : n // 3 + 70] = 0.0  # a zero bucket where buckets are small
    return x


@pytest.mark.parametrize("params", DEVICE_CONFIGS, ids=str)
@pytest.mark.parametrize("scale", [1.0, 1e-39, 3e37])
def test_device_payload_equals_host_payload(params: dict[str, object], scale: float) -> None:
    from tests.compressors.device_checks import check_device_decode, check_twin_bytes

    codec = DQSG(**params)  # type: ignore[arg-type]
    assert codec.device_resident
    x = device_input(1537, seed=len(params), scale=scale)
    check_twin_bytes(codec, x, KEY)
    check_device_decode(codec, x, KEY)


@pytest.mark.parametrize("params", DEVICE_CONFIGS[:4], ids=str)
def test_device_path_of_half_precision_and_fake_cuda(params: dict[str, object]) -> None:
    from tests.compressors.device_checks import (
        check_device_decode,
        check_twin_bytes,
        encode_fake_cuda,
    )

    codec = DQSG(**params)  # type: ignore[arg-type]
    x = (device_input(999, seed=4) * 60000.0).clamp(-65504, 65504).to(torch.float16)
    check_twin_bytes(codec, x, KEY)
    check_device_decode(codec, x, KEY)
    assert encode_fake_cuda(codec, (999,), KEY) == len(codec.encode(x.float(), KEY).payload)


@pytest.mark.parametrize("packing", ["dense", "entropy"])
def test_dense_and_entropy_packings_stay_on_the_host(packing: str) -> None:
    assert not DQSG(M=2, packing=packing).device_resident  # type: ignore[arg-type]
    assert DQSG(M=2).device_resident
