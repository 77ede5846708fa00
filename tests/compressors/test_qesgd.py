"""QESGD's Q_{delta,b}: grid, two's complement wire, clipping, Lemma 1, delta == 0."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from gradzip.compressors.qesgd import QESGD
from gradzip.keys import StreamKey
from gradzip.payload import overhead_bits, parse_payload
from tests.compressors.device_checks import check_device_decode, check_twin_bytes, encode_fake_cuda

KEY = StreamKey(run_seed=1, rank=0, step=0, tensor_index=9)
DELTA = 2.0**-4  # a power of two: v/delta and k*delta are exact in float32


def decoded(comp: QESGD, v: torch.Tensor, trials: int) -> torch.Tensor:
    return torch.stack([comp.round_trip(v, KEY.with_step(t))[1].double() for t in range(trials)])


def test_grid_points_and_clipping_are_deterministic() -> None:
    comp = QESGD(delta=DELTA, bits=4)  # k in [-8, 7]: range [-0.5, 0.4375]
    k = torch.arange(-8, 8, dtype=torch.float32)
    assert torch.equal(comp.round_trip(k * DELTA, KEY)[1], k * DELTA)
    outside = torch.tensor([0.44, 3.0, 1e30, -0.51, -7.0, -1e30])
    out = comp.round_trip(outside, KEY)[1]
    assert out.tolist() == [7 * DELTA] * 3 + [-8 * DELTA] * 3


def test_twos_complement_wire_and_bits() -> None:
    comp = QESGD(delta=1.0, bits=8)
    k = torch.tensor([-128, -1, 0, 1, 127, -5], dtype=torch.float32)
    enc = comp.encode(k, KEY)
    body = parse_payload(enc.payload)[1]
    assert bytes(body) == k.to(torch.int8).numpy().tobytes()
    assert enc.paper_bits == 8 * 6
    x = torch.randn(1001, generator=torch.Generator().manual_seed(0))
    for bits in (1, 3, 8, 12, 16):
        comp = QESGD(delta=0.01, bits=bits)
        enc = comp.encode(x, KEY)
        body_bits = 8 * math.ceil(bits * 1001 / 8)  # b*d, padded to a byte; delta not sent
        assert comp.expected_body_bits(x) == body_bits
        assert enc.wire_bits == overhead_bits(parse_payload(enc.payload)[0]) + body_bits
    # b = 3: k = -1 is 0b111, k = -4 is 0b100, k = 3 is 0b011
    enc = QESGD(delta=1.0, bits=3).encode(torch.tensor([-1.0, -4.0, 3.0]), KEY)
    assert bytes(parse_payload(enc.payload)[1]) == bytes([0b11_100_111, 0b0])


def test_unbiased_inside_the_range_with_its_variance() -> None:
    comp, trials = QESGD(delta=DELTA, bits=5), 400  # range [-1, 0.9375]
    v = torch.linspace(-0.99, 0.93, 500)
    out = decoded(comp, v, trials)
    a = torch.floor(v.double() / DELTA) * DELTA
    p = (v.double() - a) / DELTA
    var = (v.double() - a) * (a + DELTA - v.double())  # = (a' - v)(v - a' + delta), a' = a + delta
    assert float(var.max()) <= DELTA**2 / 4
    live = torch.minimum(p, 1 - p) * trials >= 10
    z = (out.mean(0) - v.double())[live] / (var[live] / trials).sqrt()
    assert float(z.abs().max()) < 5.5
    e4 = (1 - p) * (v.double() - a) ** 4 + p * (a + DELTA - v.double()) ** 4
    mse = ((out - v.double()) ** 2).sum(1).mean()
    assert abs(float(mse) - float(var.sum())) < 5 * math.sqrt(float((e4 - var**2).sum()) / trials)


def test_lemma1_on_random_pairs() -> None:
    """E[(Q(v') - v)^2] <= (v' - v)^2 + delta^2/4 for v in the hull and any v'."""
    gen = torch.Generator().manual_seed(1)
    comp, trials = QESGD(delta=DELTA, bits=4), 300
    lo, hi = -8 * DELTA, 7 * DELTA
    v = lo + (hi - lo) * torch.rand(400, generator=gen, dtype=torch.float64)
    v_prime = (torch.randn(400, generator=gen, dtype=torch.float64) * 0.6).float()
    assert bool((v_prime > hi).any() and (v_prime < lo).any())  # some outside the range
    out = decoded(comp, v_prime, trials)
    sq = (out - v) ** 2
    bound = (v_prime.double() - v) ** 2 + DELTA**2 / 4
    se = sq.std(0) / math.sqrt(trials)
    assert bool((sq.mean(0) <= bound + 5 * se + 1e-12).all())
    # the same, exactly, from the two-point law of Q(v')
    w = v_prime.double().clamp(lo, hi)
    a = torch.floor(w / DELTA) * DELTA
    p = (w - a) / DELTA
    exact = (1 - p) * (a - v) ** 2 + p * (a + DELTA - v) ** 2
    assert bool((exact <= bound + 1e-12).all())
    assert float((sq.mean(0) - exact).abs().max()) < 5 * float(se.max()) + 1e-12


def test_delta_zero_warns_and_gives_zeros() -> None:
    with pytest.warns(UserWarning, match="delta == 0"):
        comp = QESGD(delta=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # encoding does not warn again
        enc, out = comp.round_trip(torch.randn(10), KEY)
    assert bool((out == 0).all()) and enc.wire_bits > 0


def test_parameter_validation() -> None:
    for kwargs in (
        {"delta": -1.0},
        {"delta": float("nan")},
        {"delta": float("inf")},
        {"delta": 1e-60},  # underflows float32
        {"delta": 0.1, "bits": 0},
        {"delta": 0.1, "bits": 17},
        {"delta": 0.1, "packing": "x"},
    ):
        with pytest.raises(ValueError):
            QESGD(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        QESGD()  # type: ignore[call-arg]


def test_unbiased_near_the_top_of_a_16_bit_grid() -> None:
    """At |v/delta| ~ 3e4 float32 would round v/delta + u to 2^-9 and bias the rounding; the
    16-bit grid computes the index in float64."""
    delta, n, trials = 1e-3, 200_000, 20
    comp = QESGD(delta=delta, bits=16)
    x = torch.full((n,), 30.0003)
    v = float(x[0]) / float(torch.tensor(delta, dtype=torch.float32))  # in grid steps
    frac = v - math.floor(v)
    total = torch.zeros(n, dtype=torch.float64)
    for t in range(trials):
        total += comp.round_trip(x, KEY.with_step(t))[1].double()
    bias_steps = (float(total.mean()) / trials - float(x[0])) / delta
    standard_error = math.sqrt(frac * (1 - frac) / (n * trials))
    assert abs(bias_steps) < 5 * standard_error


@pytest.mark.parametrize("bits", [1, 2, 7, 8, 9, 16])
@pytest.mark.parametrize("delta", [1e-3, 0.3, 1e-41, 0.0])
@pytest.mark.parametrize("n", [1, 11, 2049])
def test_device_path_is_the_host_path(bits: int, delta: float, n: int) -> None:
    """Fixed packing, every width (float32 and float64 rounding), a subnormal and a zero step:
    the device payload's bytes and decode are the host's."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        codec = QESGD(delta, bits=bits)
    assert codec.device_resident
    key = StreamKey(run_seed=6, rank=3, step=4, tensor_index=2)
    x = torch.randn(n, generator=torch.Generator().manual_seed(bits)) * 0.05
    check_twin_bytes(codec, x, key)
    check_device_decode(codec, x, key)
    assert encode_fake_cuda(codec, (n,), key) == len(codec.encode(x, key).payload)


def test_coded_packings_stay_on_the_host() -> None:
    assert not QESGD(1e-3, packing="dense").device_resident
