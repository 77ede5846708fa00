"""Half-dithered quantization (spec 1.1): Lemma 2 (it is the stochastic quantizer), unbiasedness,
the triangular dither's constant second moment, the alphabet, zero buckets and bits."""

from __future__ import annotations

import math

import pytest
import torch

from gradzip.codecs.symbols import packed_symbol_bits
from gradzip.compressors.half_dither import HalfDither
from gradzip.keys import StreamKey
from gradzip.payload import overhead_bits, parse_payload

KEY = StreamKey(run_seed=3, rank=1, step=5, tensor_index=0)
N = 100_000
# fixed normalised inputs: grid points, midpoints, near-boundary values, the ends
POINTS = [0.0, 0.3, -0.55, 0.5, 0.9, -1.0, 1.0, 0.25, -0.74]


def repeated(value: float) -> torch.Tensor:
    """``N`` copies of ``value`` and one element 1.0, so that the scale is exactly 1."""
    x = torch.full((N + 1,), value)
    x[0] = 1.0
    return x


@pytest.mark.parametrize("M", [1, 2])
def test_lemma2_half_dither_is_the_stochastic_quantizer(M: int) -> None:
    comp = HalfDither(M=M, bucket_size=None)
    for x in POINTS:
        _, out = comp.round_trip(repeated(x), KEY)
        levels = out[1:].double() * M
        # QSGD/TernGrad form: |x| in [l/M, (l+1)/M], upper level with probability M|x| - l
        low = math.floor(abs(x) * M)
        p_up = abs(x) * M - low
        sign = 1.0 if x >= 0 else -1.0
        upper = levels == sign * (low + 1)
        lower = levels == sign * low
        assert bool((upper | lower).all()), x
        se = math.sqrt(p_up * (1 - p_up) / N)
        assert abs(float(upper.double().mean()) - p_up) <= 5 * se + 1e-12, x


@pytest.mark.parametrize("k", [1, 2, 3])
def test_unbiased_for_every_fixed_input(k: int) -> None:
    comp = HalfDither(M=2, dither_sum=k, bucket_size=None)
    for x in POINTS:
        _, out = comp.round_trip(repeated(x), KEY)
        eps = out[1:].double() - x
        # Var(eps) <= (k+1)/12 Delta^2 for k >= 2 and <= Delta^2/4 for k = 1
        se = math.sqrt(max(k + 1, 3) / 12 * 0.25 / N)
        assert abs(float(eps.mean())) < 5 * se, x


@pytest.mark.parametrize("k", [2, 3])
def test_summed_dither_second_moment_is_independent_of_x(k: int) -> None:
    M = 2
    delta = 1.0 / M
    comp = HalfDither(M=M, dither_sum=k, bucket_size=None)
    expected = (k + 1) * delta**2 / 12  # Delta^2/4 for the triangular dither
    for x in POINTS:
        _, out = comp.round_trip(repeated(x), KEY.with_step(int(100 * x) + 500))
        sq = (out[1:].double() - x).pow(2)
        se = float(sq.std()) / math.sqrt(N)
        assert abs(float(sq.mean()) - expected) <= 5 * se, x


def test_uniform_half_dither_error_depends_on_x() -> None:
    # the contrast to the summed dither: zero error on a grid point, Delta^2/4 at a midpoint
    comp = HalfDither(M=2, bucket_size=None)
    on_grid = comp.round_trip(repeated(0.5), KEY)[1][1:]
    assert torch.equal(on_grid, torch.full((N,), 0.5))
    mid = comp.round_trip(repeated(0.25), KEY)[1][1:].double() - 0.25
    assert float(mid.pow(2).mean()) == pytest.approx(0.25**2, rel=1e-9)


@pytest.mark.parametrize(("k", "alphabet"), [(1, 5), (2, 7), (3, 7), (4, 9)])
def test_alphabet_covers_the_dither_range(k: int, alphabet: int) -> None:
    comp = HalfDither(M=2, dither_sum=k, bucket_size=None)
    assert comp.alphabet == alphabet
    x = torch.ones(20_000)
    x[::2] = -1.0
    enc = comp.encode(x, KEY)
    symbols = enc.streams[0]
    # the extreme symbols are reached from the ends of the range, never beyond (no clamping)
    assert int(symbols.min()) == 0 and int(symbols.max()) == alphabet - 1
    header, _ = parse_payload(enc.payload)
    bits = 32 + packed_symbol_bits(x.numel(), alphabet, "fixed")  # type: ignore[operator]
    assert comp.expected_body_bits(x) == bits
    assert enc.wire_bits == overhead_bits(header) + bits
    assert enc.paper_bits == pytest.approx(32 + x.numel() * math.log2(alphabet))


def test_zero_buckets_and_scales() -> None:
    x = torch.cat((torch.zeros(50), torch.randn(50, generator=torch.Generator().manual_seed(1))))
    _, out = HalfDither(M=1, bucket_size=50, dither_sum=2).round_trip(x, KEY)
    assert torch.equal(out[:50], torch.zeros(50))
    assert float(out[50:].abs().max()) <= 2 * float(x[50:].abs().max()) * 1.0001


def test_local_randomness_is_reproducible_and_not_the_shared_stream() -> None:
    x = torch.randn(1000, generator=torch.Generator().manual_seed(2))
    a = HalfDither(M=1, bucket_size=None).encode(x, KEY)
    assert a.payload == HalfDither(M=1, bucket_size=None).encode(x, KEY).payload
    assert a.payload != HalfDither(M=1, bucket_size=None).encode(x, KEY.with_step(6)).payload
    assert not HalfDither.uses_shared_randomness
    with pytest.raises(ValueError):
        HalfDither(dither_sum=0, bucket_size=None)


# -- the device path (gradzip.device) in non-default configurations ---------------------------
DEVICE_CONFIGS = [
    {"M": 1, "dither_sum": 1},
    {"M": 1, "dither_sum": 2},
    {"M": 5, "dither_sum": 3, "bucket_size": 64},
    {"M": 126, "dither_sum": 2, "bucket_size": None},
    {"M": 300, "dither_sum": 16, "bucket_size": 100},
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

    codec = HalfDither(**params)  # type: ignore[arg-type]
    assert codec.device_resident
    g = torch.Generator().manual_seed(len(params))
    x = torch.randn(1537, generator=g) * torch.rand(1537, generator=g).pow(3) * scale
    x[500:570] = 0.0
    check_twin_bytes(codec, x, KEY)
    check_device_decode(codec, x, KEY)
    assert encode_fake_cuda(codec, (1537,), KEY) == len(codec.encode(x, KEY).payload)


@pytest.mark.parametrize("packing", ["dense", "entropy"])
def test_dense_and_entropy_packings_stay_on_the_host(packing: str) -> None:
    assert not HalfDither(packing=packing).device_resident  # type: ignore[arg-type]
