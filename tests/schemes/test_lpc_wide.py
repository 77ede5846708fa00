"""LPC with wide codes (17 <= b <= 24, spec 3.7's "b = 24"): the codec round-trips at the
wire size ``b*d + 32``, the integer-sum schemes (b), (c) and the ring allreduce keep their
sums exact beyond float32's 2**24, and a group whose code sums would overflow int32 is
refused on every rank before anything is sent."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gradzip.algorithms.svrg.channel import Channel, make_inner_scheme
from gradzip.comm.local import LocalGroup, run_local
from gradzip.comm.transport import Transport
from gradzip.compressors.lpc import LPC
from gradzip.keys import StreamKey
from gradzip.payload import overhead_bits, parse_payload
from gradzip.schemes import IntegerAllreduce, ServerIntegerSum

KEY = StreamKey(run_seed=3, rank=1, step=0, tensor_index=4)
WIDE = 24
S = 2 ** (WIDE - 1) - 1
#: a power of two, so that ``S * STEP / S`` is exactly ``STEP`` in float32
STEP = 2.0**-20


@pytest.mark.parametrize("b", [17, 20, 24])
@pytest.mark.parametrize("theta", [1.0, 0.5])
def test_wide_codes_round_trip_within_one_level(b: int, theta: float) -> None:
    """Decoded values lie within one level of the clipped input (stochastic rounding to a
    neighbour) plus the float32 rounding of the decoded value, half a float32 spacing at the
    clipping edge (at b = 24 and theta = 0.5 a level is only about 1.6 such spacings, so the
    rounding can carry the value beyond one level: about half of all keys show it), the payload is ``b*d + 32`` bits plus its header, and the codes use all
    ``b`` bits (an input at the clipping edge sends the top code ``2s``)."""
    u = torch.randn(1001, generator=torch.Generator().manual_seed(b))
    comp = LPC(b=b, theta=theta)
    enc, out = comp.round_trip(u, KEY)
    body = 32 + 8 * math.ceil(b * 1001 / 8)
    assert comp.expected_body_bits(u) == body
    assert enc.wire_bits == overhead_bits(parse_payload(enc.payload)[0]) + body
    delta = theta * float(u.abs().max()) / comp.s
    top = comp.s * delta
    err = (out.double() - u.double().clamp(-top, top)).abs()
    half_spacing = float(np.spacing(np.float32(top))) / 2
    assert float(err.max()) <= delta * (1 + 1e-6) + half_spacing
    assert float(err.max()) > 0.5 * delta  # really quantized, not passed through
    assert float(out.abs().max()) == pytest.approx(top, rel=1e-6)


def test_b24_is_unbiased_to_float32_resolution() -> None:
    """theta = 1 at b = 24: the mean error of a coordinate half-way between two levels is
    within 5 standard errors of 0 over 4000 keyed encodes (its rounding error is +-delta/2)."""
    comp = LPC(b=WIDE)
    u = torch.tensor([S * STEP, -(S // 3 + 0.5) * STEP, (1000 + 0.5) * STEP])
    trials = 4000
    out = torch.stack([comp.round_trip(u, KEY.with_step(t))[1] for t in range(trials)])
    err = (out.double() - u.double()) / STEP
    assert bool((err[:, 0] == 0).all())  # the top value is on the grid
    for col in (1, 2):
        assert set(err[:, col].tolist()) == {-0.5, 0.5}
        assert abs(float(err[:, col].mean())) < 5 * 0.5 / math.sqrt(trials)


def test_coded_packings_refuse_wide_codes() -> None:
    for packing in ("dense", "entropy"):
        with pytest.raises(ValueError, match="packing='fixed'"):
            LPC(b=17, packing=packing)
        LPC(b=16, packing=packing)  # the widest they take
    with pytest.raises(ValueError, match=r"b must be an int in \[2, 24\]"):
        LPC(b=25)


def on_grid(rank: int) -> torch.Tensor:
    """Worker ``rank``'s vector on the b = 24 grid of step STEP, levels in [S/2, S) and one
    at S (so every worker's ||u||_inf is S * STEP and the common delta is exactly STEP): the
    worker codes are deterministic, near 2**24, and three of them add up beyond 2**25."""
    levels = torch.randint(S // 2, S, (64,), generator=torch.Generator().manual_seed(rank))
    levels[0] = S
    return levels.double() * STEP


@pytest.mark.parametrize("scheme", ["b", "c"])
def test_server_sums_of_wide_codes_are_exact(scheme: str) -> None:
    """Scheme (b) returns the exact mean of the worker codes, rounded once to float32 (half
    an ulp); scheme (c) a mean level re-quantized to an integer (within one level). Summing
    the codes in float32 (exact only below 2**24) would be off by several levels."""
    P = 3

    def fn(t: Transport) -> torch.Tensor:
        channel = Channel(t, make_inner_scheme(scheme, WIDE, 1.0, run_seed=1))
        return channel.average(on_grid(t.rank), 0)

    outs = run_local(P, fn)
    assert all(torch.equal(o, outs[0]) for o in outs)
    exact = torch.stack([on_grid(r) for r in range(P)]).sum(0) / P
    err = (outs[0] - exact).abs() / STEP
    if scheme == "b":
        half_ulp = torch.tensor(exact.to(torch.float32).abs().numpy()).double() * 2.0**-24
        assert bool(((outs[0] - exact).abs() <= half_ulp).all())
    else:
        levels = outs[0] / STEP
        assert torch.equal(levels, levels.round())
        assert float(err.max()) < 1.0


def test_ring_allreduce_of_wide_codes_is_exact() -> None:
    P = 3

    def fn(t: Transport) -> torch.Tensor:
        scheme = IntegerAllreduce(LPC(b=WIDE), run_seed=1)
        return scheme.reduce(t, on_grid(t.rank).to(torch.float32), 0, 0)

    outs = run_local(P, fn)
    assert all(torch.equal(o, outs[0]) for o in outs)
    exact = torch.stack([on_grid(r) for r in range(P)]).sum(0) / P
    half_ulp = exact.abs() * 2.0**-24
    assert bool(((outs[0].double() - exact).abs() <= half_ulp).all())


@pytest.mark.parametrize(
    "make",
    [
        lambda: ServerIntegerSum(LPC(b=WIDE)),
        lambda: ServerIntegerSum(LPC(b=WIDE), downlink="requantize"),
        lambda: IntegerAllreduce(LPC(b=WIDE)),
    ],
    ids=["ps_intsum", "ps_intsum-requantize", "allreduce"],
)
def test_code_sums_beyond_int32_are_refused_before_sending(make: object) -> None:
    """b = 24 codes reach 2**24 - 2: 128 ranks sum to below 2**31, 129 would overflow the
    int32 sums. The check runs before any message (a lone rank of a 129-rank group raises
    at once instead of waiting for its peers)."""
    scheme = make()  # type: ignore[operator]
    scheme.check_sum_range(128)
    lone = LocalGroup(129, timeout=5).endpoint(0)
    with pytest.raises(ValueError, match=r"129 ranks.*int32"):
        scheme.reduce(lone, torch.ones(4), 0, 0)
    assert lone.meter.total(0).sent == 0
