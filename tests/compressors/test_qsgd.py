"""QSGD: unbiasedness and the variance formula (Monte Carlo over keys), sizes, Elias coding."""

from __future__ import annotations

import math

import pytest
import torch

from gradzip.compressors import create, get, names
from gradzip.compressors.buckets import per_element
from gradzip.compressors.qsgd import QSGD
from gradzip.errors import CorruptPayloadError, PayloadError
from gradzip.keys import StreamKey
from gradzip.payload import build_payload, overhead_bits, parse_payload
from tests.compressors.device_checks import check_device_decode, check_twin_bytes, encode_fake_cuda

KEY = StreamKey(run_seed=7, rank=2, step=0, tensor_index=3)


def two_point_moments(
    x: torch.Tensor, steps: torch.Tensor, s: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-coordinate E[e^2], E[e^4] and P(round up) of stochastic rounding on step*{0..s}."""
    steps = torch.as_tensor(steps, dtype=torch.float64).expand(x.shape)
    v = torch.where(steps > 0, x.abs().double() / steps, 0.0).clamp(max=s)
    lo = v.floor()
    p = v - lo
    a = lo - v  # error (in steps) when rounding down, probability 1 - p
    b = lo + 1 - v  # when rounding up, probability p
    e2 = ((1 - p) * a**2 + p * b**2) * steps**2
    e4 = ((1 - p) * a**4 + p * b**4) * steps**4
    return e2, e4, p


def monte_carlo(comp: object, x: torch.Tensor, trials: int) -> torch.Tensor:
    """Decoded outputs of ``trials`` encodes with keys differing in the step (float64)."""
    out = torch.empty((trials, x.numel()), dtype=torch.float64)
    for t in range(trials):
        _, y = comp.round_trip(x, KEY.with_step(t))  # type: ignore[attr-defined]
        out[t] = y.reshape(-1).double()
    return out


def check_unbiased_and_variance(
    comp: object, x: torch.Tensor, steps: torch.Tensor, s: int, trials: int = 300
) -> None:
    """Mean within 5 standard errors per coordinate; total squared error within 5 s.e."""
    samples = monte_carlo(comp, x, trials)
    e2, e4, p = two_point_moments(x, steps, s)
    err = samples - x.double()
    se = (e2 / trials).sqrt()
    mean_err = err.mean(0)
    exact = e2 == 0
    assert bool((mean_err[exact].abs() <= 1e-6 * x.abs().double()[exact]).all())
    # the normal approximation of the mean needs both outcomes to be frequent
    live = torch.minimum(p, 1 - p) * trials >= 10
    assert int(live.sum()) > x.numel() // 2
    z = mean_err[live] / se[live]
    assert float(z.abs().max()) < 5.5, float(z.abs().max())
    total = (err**2).sum(1).mean()
    total_se = math.sqrt(float((e4 - e2**2).sum()) / trials)
    assert abs(float(total) - float(e2.sum())) < 5 * total_se + 1e-9


def test_variance_bound_per_coordinate() -> None:
    x = torch.linspace(-1, 1, 1001)
    e2, _, _ = two_point_moments(x, torch.tensor(1 / 3, dtype=torch.float64), 3)
    assert float(e2.max()) <= 1 / (4 * 9) + 1e-12


@pytest.mark.parametrize("s", [1, 3])
def test_unbiased_with_the_documented_variance(s: int) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1200, generator=gen) * torch.linspace(0.01, 3, 1200)
    x[5] = 0.0
    x[700:800] = 0.0  # a zero bucket (bucket 7)
    comp = QSGD(s=s, bucket_size=100)
    scales = x.view(12, 100).abs().amax(1).double()
    steps = (scales / s).repeat_interleave(100)
    check_unbiased_and_variance(comp, x, steps, s)


def test_l2_norm_scale_and_unbiasedness() -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(500, generator=gen)
    comp = QSGD(s=2, norm="l2", bucket_size=250)
    _header, body = parse_payload(comp.encode(x, KEY).payload)
    sent = torch.frombuffer(bytearray(body[:8]), dtype=torch.float32)
    norms = x.view(2, 250).double().norm(dim=1).float()
    assert torch.equal(sent, norms)
    steps = (norms.double() / 2).repeat_interleave(250)
    check_unbiased_and_variance(comp, x, steps, 2, trials=200)


def test_exact_body_bits_and_paper_bits() -> None:
    x = torch.randn(1001, generator=torch.Generator().manual_seed(2))
    cases = [
        (QSGD(bucket_size=None), 32 + 8 * math.ceil(2 * 1001 / 8)),
        (QSGD(s=1, bucket_size=100), 32 * 11 + 8 * math.ceil(2 * 1001 / 8)),
        (QSGD(s=3, bucket_size=1000), 32 * 2 + 8 * math.ceil(3 * 1001 / 8)),
        (QSGD(s=127, bucket_size=None), 32 + 8 * 1001),
    ]
    for comp, bits in cases:
        enc = comp.encode(x, KEY)
        assert comp.expected_body_bits(x) == bits
        assert enc.wire_bits == overhead_bits(parse_payload(enc.payload)[0]) + bits
    enc = QSGD(s=1, bucket_size=100).encode(x, KEY)
    assert enc.paper_bits == pytest.approx(1001 * math.log2(3) + 32 * 11)
    # QSG / TernGrad with M = 1 cost the same paper bits as DQSG M = 1 (seed 000, Table 1)
    tern = create("terngrad", bucket_size=100).encode(x, KEY)
    assert tern.paper_bits == pytest.approx(enc.paper_bits)
    if "dqsg" in names():
        dqsg = get("dqsg")(M=1, bucket_size=None).encode(x, KEY)  # type: ignore[call-arg]
        assert QSGD(bucket_size=None).encode(x, KEY).paper_bits == pytest.approx(dqsg.paper_bits)


def test_elias_coding_round_trip_and_size_formula() -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(3000, generator=gen) * (torch.rand(3000, generator=gen) < 0.3)
    for s, norm, bucket in [(1, "l2", None), (2, "max", 512), (7, "max", None)]:
        plain = QSGD(s=s, norm=norm, bucket_size=bucket)
        coded = QSGD(s=s, norm=norm, bucket_size=bucket, coding="elias")
        _enc_p, out_p = plain.round_trip(x, KEY)
        enc_c, out_c = coded.round_trip(x, KEY)
        assert torch.equal(out_p, out_c)  # same levels, only the coding differs
        header = parse_payload(enc_c.payload)[0]
        body_bits = coded.elias_body_bits(enc_c.streams[0], x.numel())
        assert enc_c.wire_bits == overhead_bits(header) + body_bits
        assert coded.expected_body_bits(x) is None
        assert enc_c.paper_bits <= body_bits - 64
    # the sparse code beats 2 bits per coordinate on a sparse, l2-scaled input
    enc = QSGD(norm="l2", coding="elias", bucket_size=None).encode(x, KEY)
    assert enc.wire_bits < QSGD(norm="l2", bucket_size=None).encode(x, KEY).wire_bits


def test_elias_all_zero_and_single_values() -> None:
    comp = QSGD(coding="elias", bucket_size=4)
    for x in (torch.zeros(9), torch.tensor([-2.5]), torch.tensor([0.0, 0.0, 0.0, 1e-30, 5.0])):
        _enc, out = comp.round_trip(x, KEY)
        assert out.shape == x.shape and bool(torch.isfinite(out).all())
        assert bool((out[x == 0] == 0).all())


def test_elias_garbage_is_rejected() -> None:
    comp = QSGD(coding="elias", bucket_size=None)
    x = torch.randn(50, generator=torch.Generator().manual_seed(4))
    header, body = parse_payload(comp.encode(x, KEY).payload)
    bad_count = bytes(body[:4]) + (10**6).to_bytes(8, "little") + bytes(body[12:])
    with pytest.raises(CorruptPayloadError, match="non-zeros"):
        comp.decode(build_payload(header, [bad_count]))
    with pytest.raises(PayloadError):
        comp.decode(build_payload(header, [bytes(body) + b"\x00"]))


def test_corrupt_symbols_and_scales_are_named() -> None:
    comp = QSGD(s=2, bucket_size=None)  # 5 symbols in 3 bits: 5..7 are invalid
    x = torch.randn(16, generator=torch.Generator().manual_seed(5))
    header, body = parse_payload(comp.encode(x, KEY).payload)
    bad = bytearray(body)
    bad[4] = 0xFF
    with pytest.raises(CorruptPayloadError, match="alphabet"):
        comp.decode(build_payload(header, [bytes(bad)]))
    bad = bytearray(body)
    bad[:4] = torch.tensor([-1.0]).numpy().tobytes()
    with pytest.raises(CorruptPayloadError, match="scale"):
        comp.decode(build_payload(header, [bytes(bad)]))


def test_deterministic_and_step_dependent() -> None:
    x = torch.randn(300, generator=torch.Generator().manual_seed(6))
    comp = QSGD(s=2, bucket_size=None)
    assert comp.encode(x, KEY).payload == QSGD(s=2, bucket_size=None).encode(x, KEY).payload
    a = comp.round_trip(x, KEY)[1]
    b = comp.round_trip(x, KEY.with_step(1))[1]
    assert not torch.equal(a, b)


def test_the_common_grid_quantizes_on_the_agreed_scale() -> None:
    x = torch.tensor([0.5, -1.0, 0.25, 0.0])
    grid = QSGD(s=4, bucket_size=2).common_grid()
    assert grid is not None
    assert grid.grid_statistic(x).tolist() == [1.0, 0.25]
    scales = torch.tensor([2.0, 2.0])  # agreed: at least every rank's own
    steps = grid.grid_steps(scales)
    assert steps.tolist() == [0.5, 0.5]
    symbols = grid.grid_symbols(x, scales, KEY)
    assert int(symbols.min()) >= 0 and int(symbols.max()) <= 8
    values = (symbols.double() - 4) * per_element(steps, 4, 2)
    assert bool(((values / 0.5) == (values / 0.5).round()).all())  # multiples of 2/4
    assert bool(((values - x.double()).abs() < 0.5).all())


def test_parameter_validation() -> None:
    for kwargs in ({"s": 0}, {"norm": "l1"}, {"coding": "huffman"}, {"packing": "zip"}):
        with pytest.raises(ValueError):
            QSGD(**kwargs, bucket_size=None)  # type: ignore[arg-type]


VARIANTS = [
    ("qsgd", {"coding": "elias"}),
    ("qsgd", {"coding": "elias", "norm": "l2", "bucket_size": 5}),
    ("qsgd", {"norm": "l2", "s": 5, "bucket_size": 7}),
    ("qsgd", {"s": 300, "bucket_size": 3}),
    ("terngrad", {"clip_sigma": 2.5, "bucket_size": 4}),
    ("hou", {"b": 3, "scaled": True}),
    ("hou", {"b": 16}),
    ("lpc", {"theta": 0.5, "b": 3}),
    ("lpc", {"b": 16}),
    ("qesgd", {"delta": 0.01, "bits": 3}),
    ("qesgd", {"delta": 1e-38, "bits": 16}),
    ("qesgd", {"delta": 1e30, "bits": 1}),
]


@pytest.mark.parametrize(("name", "params"), VARIANTS, ids=str)
def test_non_default_variants_round_trip_and_reject_bad_bytes(
    name: str, params: dict[str, object]
) -> None:
    """The registry-wide contract runs only ``example_params``; this covers the other options."""
    comp = create(name, **params)
    gen = torch.Generator().manual_seed(9)
    wide = torch.pow(10.0, torch.empty(1001, dtype=torch.float64).uniform_(-30, 30, generator=gen))
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        for x in (
            torch.randn((33, 17), generator=gen, dtype=torch.float64).to(dtype),
            torch.randn((), dtype=torch.float64).to(dtype),
            torch.zeros(7, dtype=dtype),
            (wide * torch.sign(torch.randn(1001, generator=gen, dtype=torch.float64)))
            .clamp(-6e4, 6e4)
            .to(dtype),
        ):
            enc = comp.encode(x, KEY)
            out = comp.decode(enc.payload, expected_key=KEY, shape=x.shape, dtype=x.dtype)
            assert bool(torch.isfinite(out).all())
            assert bool((out[x == 0] == 0).all())
            bits = comp.expected_body_bits(x)
            if bits is not None:
                assert enc.wire_bits == overhead_bits(parse_payload(enc.payload)[0]) + bits
    payload = comp.encode(torch.randn(40, generator=gen), KEY).payload
    for cut in range(len(payload)):
        with pytest.raises(PayloadError):
            comp.decode(payload[:cut])
    header, body = parse_payload(payload)
    for size in sorted({0, 1, 3, len(body) - 1, len(body) + 1, 2 * len(body) + 8}):
        for _ in range(5):
            garbage = torch.randint(0, 256, (size,), generator=gen, dtype=torch.uint8)
            try:
                out = comp.decode(build_payload(header, [bytes(garbage.tolist())]))
            except PayloadError:
                continue
            assert out.shape == (40,)


def _spread(n: int, seed: int = 0) -> torch.Tensor:
    """A gradient whose 64-element blocks span float32's range: zero blocks, subnormal ones
    (whose steps need the float64 path), ordinary and huge ones."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g)
    scales = torch.tensor([1.0, 0.0, 1e-42, 3e-3, 1e-38, 3e37, 1e-20, 1.0])
    return x * scales.repeat_interleave(64).repeat(-(-n // 512)).narrow(0, 0, n)


@pytest.mark.parametrize(
    ("s", "bucket_size"),
    [(1, None), (1, 100), (3, 64), (127, 512), (128, 512), (1000, 96), (2**15, None)],
)
@pytest.mark.parametrize("zero", [False, True])
@pytest.mark.parametrize("n", [1, 13, 1000, 2049])
def test_device_path_is_the_host_path(s: int, bucket_size: int | None, n: int, zero: bool) -> None:
    """Device-resident configurations: the device payload's bytes and decode are the host's
    (fixed packing, max-abs norm, symbols; float32 and float64 rounding paths, s beyond a byte)."""
    codec = QSGD(s=s, bucket_size=bucket_size)
    assert codec.device_resident
    key = StreamKey(run_seed=3, rank=2, step=5, tensor_index=1)
    x = _spread(n, seed=s) * (0.0 if zero else 1.0)  # zero: signed zeros, a +0.0 scale
    check_twin_bytes(codec, x, key)
    check_device_decode(codec, x, key)
    assert encode_fake_cuda(codec, (n,), key) == len(codec.encode(x, key).payload)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_device_path_of_narrow_dtypes(dtype: torch.dtype) -> None:
    codec = QSGD(s=3, bucket_size=64)
    x = (torch.randn(700, generator=torch.Generator().manual_seed(1)) * 1.5e4).to(dtype)
    check_twin_bytes(codec, x, KEY)
    check_device_decode(codec, x, KEY)


@pytest.mark.parametrize(
    "params", [{"norm": "l2"}, {"coding": "elias"}, {"packing": "dense"}, {"packing": "entropy"}]
)
def test_host_configurations_are_not_device_resident(params: dict[str, str]) -> None:
    assert not QSGD(s=2, **params).device_resident  # type: ignore[arg-type]
