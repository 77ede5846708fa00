"""LPC's low-precision representation: Lemma 3 (theta = 1), Lemma 4 with kc counted, wire."""

from __future__ import annotations

import math

import pytest
import torch

from gradzip.compressors.lpc import LPC
from gradzip.compressors.terngrad import TernGrad
from gradzip.keys import StreamKey
from gradzip.payload import overhead_bits, parse_payload
from tests.compressors.device_checks import check_device_decode, check_twin_bytes, encode_fake_cuda

KEY = StreamKey(run_seed=3, rank=1, step=0, tensor_index=4)


def sent_delta(payload: bytes) -> float:
    body = parse_payload(payload)[1]
    return float(torch.frombuffer(bytearray(body[:4]), dtype=torch.float32).item())


def decoded(comp: LPC, u: torch.Tensor, trials: int) -> torch.Tensor:
    return torch.stack([comp.round_trip(u, KEY.with_step(t))[1] for t in range(trials)])


def errors(comp: LPC, u: torch.Tensor, trials: int) -> torch.Tensor:
    return decoded(comp, u, trials).double() - u.double()


def lemma3(u: torch.Tensor, delta: float, s: int) -> tuple[torch.Tensor, ...]:
    """Round-up probability, E[e^2] = (v - a)(a + delta - v) and E[e^4], inside the hull."""
    v = (u.abs().double() / delta).clamp(max=s)
    lo = v.floor()
    p = v - lo
    e2 = (v - lo) * (lo + 1 - v) * delta**2
    e4 = ((1 - p) * (v - lo) ** 4 + p * (lo + 1 - v) ** 4) * delta**4
    return p, e2, e4


@pytest.mark.parametrize("b", [2, 4])
def test_theta_one_is_unbiased_with_lemma3_variance(b: int) -> None:
    u = torch.randn(700, generator=torch.Generator().manual_seed(0))
    comp, trials = LPC(b=b), 300
    enc = comp.encode(u, KEY)
    delta = sent_delta(enc.payload)
    s = 2 ** (b - 1) - 1
    assert delta == pytest.approx(float(u.abs().max()) / s, rel=1e-7)
    err = errors(comp, u, trials)
    p, e2, e4 = lemma3(u, delta, s)
    assert float(e2.max()) <= delta**2 / 4
    live = torch.minimum(p, 1 - p) * trials >= 10
    assert int(live.sum()) > 300
    assert float((err.mean(0)[live] / (e2[live] / trials).sqrt()).abs().max()) < 5.5
    total_se = math.sqrt(float((e4 - e2**2).sum()) / trials)
    assert abs(float((err**2).sum(1).mean()) - float(e2.sum())) < 5 * total_se


@pytest.mark.parametrize("theta", [0.02, 0.3, 0.7])
def test_lemma4_with_kc_counted_exactly(theta: float) -> None:
    """E||Q(u) - u||^2 <= [(d - kc) theta^2/(4 s^2) + kc (1 - theta)^2] ||u||_inf^2."""
    gen = torch.Generator().manual_seed(1)
    u = torch.randn(500, generator=gen)
    amax = float(u.abs().max())
    # keep every |u_i| away from the clipping threshold so that kc is unambiguous
    near = (u.abs() - theta * amax).abs() < 1e-3
    u[near] *= 0.99
    comp, trials = LPC(b=3, theta=theta), 300
    s = comp.s
    delta = sent_delta(comp.encode(u, KEY).payload)
    assert delta == pytest.approx(theta * amax / s, rel=1e-7)
    clipped = u.abs() > theta * amax
    kc = int(clipped.sum())
    assert 0 < kc < u.numel()
    # the clipped coordinates are projected deterministically onto +-s*delta, every time
    out = decoded(comp, u, trials)
    err = out.double() - u.double()
    top = torch.tensor(s * delta, dtype=torch.float32)  # the decoder's s * delta in float32
    assert bool((out[:, clipped] == torch.sign(u[clipped]) * top).all())
    assert int((out.abs() == top).all(0).sum()) == kc  # no in-hull value is always at the top
    bound = ((u.numel() - kc) * theta**2 / (4 * s**2) + kc * (1 - theta) ** 2) * amax**2
    _, e2, e4 = lemma3(u, delta, s)
    clip_err = (u.abs().double() - s * delta).clamp(min=0) ** 2
    exact = float(e2[~clipped].sum() + clip_err.sum())
    assert exact <= bound
    mse = (err**2).sum(1).mean()
    total_se = math.sqrt(float((e4[~clipped] - e2[~clipped] ** 2).sum()) / trials)
    assert abs(float(mse) - exact) < 5 * total_se + 1e-9
    assert float(mse) <= bound + 5 * total_se


def test_wire_format_and_zero_vector() -> None:
    u = torch.randn(1001, generator=torch.Generator().manual_seed(2))
    for b in (2, 4, 5):
        comp = LPC(b=b)
        enc = comp.encode(u, KEY)
        body = 32 + 8 * math.ceil(b * 1001 / 8)  # b*d + 32, padded to a byte
        assert comp.expected_body_bits(u) == body
        assert enc.wire_bits == overhead_bits(parse_payload(enc.payload)[0]) + body
        assert enc.paper_bits == pytest.approx(1001 * math.log2(2**b - 1) + 32)
    enc, out = LPC().round_trip(torch.zeros(9), KEY)
    assert sent_delta(enc.payload) == 0.0 and bool((out == 0).all())
    codes = parse_payload(enc.payload)[1][4:]
    assert bytes(codes) == bytes([0x77] * 4 + [0x07])  # index 0 is code s = 7, 4 bits each


def test_ternary_case_matches_terngrad() -> None:
    """b = 2, theta = 1 is TernGrad: the same scale, symbols and decoded values."""
    u = torch.randn(333, generator=torch.Generator().manual_seed(3))
    a = LPC(b=2).encode(u, KEY)
    b = TernGrad().encode(u, KEY)
    assert parse_payload(a.payload)[1] == parse_payload(b.payload)[1]


def test_parameter_validation() -> None:
    for kwargs in ({"b": 1}, {"b": 25}, {"theta": 0.0}, {"theta": 1.5}, {"packing": "x"}):
        with pytest.raises(ValueError):
            LPC(**kwargs)  # type: ignore[arg-type]


def _spread(n: int, seed: int = 0) -> torch.Tensor:
    """A gradient whose 64-element blocks span float32's range: zero blocks, subnormal ones
    (whose steps need the float64 path), ordinary and huge ones."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g)
    scales = torch.tensor([1.0, 0.0, 1e-42, 3e-3, 1e-38, 3e37, 1e-20, 1.0])
    return x * scales.repeat_interleave(64).repeat(-(-n // 512)).narrow(0, 0, n)


@pytest.mark.parametrize("b", [2, 3, 4, 8, 9, 16, 24])
@pytest.mark.parametrize("theta", [1.0, 0.4])
@pytest.mark.parametrize("scale", [0.0, 1e-44, 1.0, 3e38])
def test_device_path_is_the_host_path(b: int, theta: float, scale: float) -> None:
    """Fixed packing, every width and clipping: the device bytes and decode are the host's."""
    codec = LPC(b=b, theta=theta)
    assert codec.device_resident
    key = StreamKey(run_seed=5, rank=1, step=1, tensor_index=0)
    x = (torch.rand(1001, generator=torch.Generator().manual_seed(b)) * 2 - 1) * scale
    check_twin_bytes(codec, x, key)
    check_device_decode(codec, x, key)
    assert encode_fake_cuda(codec, (1001,), key) == len(codec.encode(x, key).payload)


def test_coded_packings_stay_on_the_host() -> None:
    assert not LPC(packing="dense").device_resident
    assert not LPC(packing="entropy").device_resident
