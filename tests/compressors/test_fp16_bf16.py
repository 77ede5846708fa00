"""fp16 (power-of-two scaled half precision) and bf16 (plain bfloat16 cast) baselines."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import gradzip
from gradzip.compressors.fp16 import scale_exponent
from gradzip.errors import CorruptPayloadError
from gradzip.keys import StreamKey
from gradzip.payload import build_payload, parse_payload

KEY = StreamKey(run_seed=5, rank=0, step=1, tensor_index=3)
F32_MAX = float(torch.finfo(torch.float32).max)
FLOATS32 = st.floats(
    min_value=-F32_MAX, max_value=F32_MAX, allow_nan=False, allow_infinity=False, width=32
)


def round_trip(name: str, x: torch.Tensor) -> torch.Tensor:
    comp = gradzip.create(name)
    enc = comp.encode(x, KEY)
    assert enc.wire_bits == 8 * len(enc.payload)
    return comp.decode(enc.payload, expected_key=KEY)


def wide(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    exponents = torch.empty(n, dtype=torch.float64).uniform_(-30, 30, generator=gen)
    signs = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0).double()
    return (signs * torch.pow(10.0, exponents)).float()


def fp16_reference(x: torch.Tensor) -> torch.Tensor:
    """x / 2**e rounded once to float16 by NumPy (from float64, exact), times 2**e, rounded
    once to float32 and saturated at float32's maximum."""
    absmax = float(x.abs().max())
    e = scale_exponent(absmax)
    scaled = x.double().numpy() * 2.0**-e  # exact in float64
    ref = torch.from_numpy(scaled.astype(np.float16).astype(np.float64) * 2.0**e)
    return ref.clamp(-F32_MAX, F32_MAX).float().double()


def check_fp16_bounds(x: torch.Tensor, out: torch.Tensor) -> None:
    assert bool(torch.isfinite(out).all())
    e = scale_exponent(float(x.abs().max()))
    xd, od = x.double(), out.double()
    err = (od - xd).abs()
    normal = xd.abs() >= 2.0 ** (e - 14)
    # relative error 2**-11 in float16's normal range, absolute 2**(e-25) below it
    assert bool((err[normal] <= 2.0**-11 * xd.abs()[normal]).all())
    assert bool((err[~normal] <= 2.0 ** (e - 25)).all())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fp16_wide_range_never_overflows_and_matches_single_rounding(seed: int) -> None:
    x = wide(4001, seed)
    out = round_trip("fp16", x)
    check_fp16_bounds(x, out)
    assert torch.equal(out.double(), fp16_reference(x))


@pytest.mark.parametrize(
    "values",
    [
        [65504.0, 65519.0, 65520.0, 65536.0, -1e5, 1.0],
        [65504.0, -65504.0, 6.1e-5, 5.96e-8],
        [F32_MAX, -F32_MAX, 1.0, 1e-45],
        [1e-45, -3e-42, 1e-40, 0.0],
        [2.0**15 - 2.0**4, 2.0**14, 3.0 * 2.0**-20],
    ],
)
def test_fp16_boundaries_are_finite_and_within_bounds(values: list[float]) -> None:
    x = torch.tensor(values, dtype=torch.float32)
    out = round_trip("fp16", x)
    check_fp16_bounds(x, out)
    # the largest magnitude is never flushed and keeps full precision
    i = int(x.abs().argmax())
    assert abs(float(out[i]) - float(x[i])) <= 2.0**-11 * abs(float(x[i]))


def test_fp16_plain_cast_would_overflow_but_fp16_does_not() -> None:
    x = torch.tensor([7e4, -1e5, 3.0])
    assert not bool(torch.isfinite(x.to(torch.float16)).all())
    out = round_trip("fp16", x)
    assert bool(torch.isfinite(out).all())
    assert torch.allclose(out, x, rtol=2.0**-11, atol=0)


def test_fp16_scale_exponent_puts_max_in_a_safe_binade() -> None:
    for absmax in [1e-45, 1e-30, 0.3, 1.0, 65504.0, 1e30, F32_MAX]:
        e = scale_exponent(absmax)
        assert 2.0**14 <= absmax * 2.0**-e < 2.0**15
    assert scale_exponent(0.0) == 0


def test_fp16_zeros_decode_to_exact_zeros_and_bits() -> None:
    x = torch.zeros(33)
    comp = gradzip.create("fp16")
    enc = comp.encode(x, KEY)
    assert torch.equal(comp.decode(enc.payload), x)
    assert comp.expected_body_bits(x) == 16 + 16 * 33
    assert enc.paper_bits == 16 + 16 * 33


def test_fp16_rejects_an_impossible_exponent() -> None:
    comp = gradzip.create("fp16")
    header, body = parse_payload(comp.encode(torch.ones(4), KEY).payload)
    bad = build_payload(header, [struct.pack("<h", 900), bytes(body[2:])])
    with pytest.raises(CorruptPayloadError, match="exponent 900"):
        comp.decode(bad)


@given(arrays(np.float32, st.integers(1, 64), elements=FLOATS32))
def test_fp16_property_bounds(values: np.ndarray) -> None:
    x = torch.from_numpy(values.copy())
    out = round_trip("fp16", x)
    check_fp16_bounds(x, out)
    assert torch.equal(out.double(), fp16_reference(x))


@pytest.mark.parametrize("seed", [0, 1])
def test_bf16_equals_the_plain_cast(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for x in (wide(3001, seed), torch.randn(1000, generator=gen), torch.tensor([1e-40, -2e-39])):
        out = round_trip("bf16", x)
        assert torch.equal(out, x.to(torch.bfloat16).to(torch.float32))


def test_bf16_error_bound_and_saturation() -> None:
    x = wide(2000, 7)
    out = round_trip("bf16", x)
    assert bool(((out - x).abs() <= 2.0**-8 * x.abs()).all())
    top = torch.tensor([F32_MAX, -F32_MAX, 1.0])
    assert not bool(torch.isfinite(top.to(torch.bfloat16)).all())  # a plain cast overflows
    out = round_trip("bf16", top)
    big = float(torch.finfo(torch.bfloat16).max)
    assert out.tolist() == [big, -big, 1.0]


@given(arrays(np.float32, st.integers(1, 64), elements=FLOATS32))
def test_bf16_property_equals_cast_where_finite(values: np.ndarray) -> None:
    x = torch.from_numpy(values.copy())
    out = round_trip("bf16", x)
    ref = x.to(torch.bfloat16).to(torch.float32)
    finite = torch.isfinite(ref)
    assert torch.equal(out[finite], ref[finite])
    assert bool(torch.isfinite(out).all())


def test_bits_of_both() -> None:
    x = torch.randn(100)
    for name, body_bits in (("fp16", 16 + 1600), ("bf16", 1600)):
        comp = gradzip.create(name)
        enc = comp.encode(x, KEY)
        _, body = parse_payload(enc.payload)
        assert 8 * len(body) == body_bits == comp.expected_body_bits(x)


@pytest.mark.parametrize("n", [3, (1 << 20) + 5])
def test_fp16_refuses_a_body_decoding_to_non_finite_values(n: int) -> None:
    # the decoder checks each block as it widens it (no separate pass): a half Inf or NaN
    # anywhere, the last block included, is refused
    comp = gradzip.create("fp16")
    header, body = parse_payload(comp.encode(torch.ones(n), KEY).payload)
    for bad in (0x7C00, 0x7E00):  # +Inf, NaN
        halves = np.frombuffer(body[2:], dtype=np.uint16).copy()
        halves[-1] = bad
        payload = build_payload(header, [bytes(body[:2]), halves.tobytes()])
        with pytest.raises(CorruptPayloadError, match="non-finite"):
            comp.decode(payload)


@pytest.mark.parametrize("name", ["identity", "fp16", "bf16"])
def test_payload_is_one_read_only_buffer_that_decodes_alike_as_bytes(name: str) -> None:
    comp = gradzip.create(name)
    x = torch.randn(1000, generator=torch.Generator().manual_seed(3))
    enc = comp.encode(x, KEY)
    assert isinstance(enc.payload, memoryview) and enc.payload.readonly
    as_bytes = bytes(enc.payload)
    assert torch.equal(comp.decode(enc.payload), comp.decode(as_bytes))


# -- the device path (issue 28): bf16 near float32's maximum, identity in every dtype --------
def test_bf16_device_path_saturates_as_the_host_path() -> None:
    from tests.compressors.device_checks import check_device_decode, check_twin_bytes

    codec = gradzip.create("bf16")
    big = torch.finfo(torch.float32).max
    x = torch.tensor([big, -big, 1.0, -0.0, 3e-39, 2.0**-140, big * 0.999])
    check_twin_bytes(codec, x, KEY)
    check_device_decode(codec, x, KEY)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_identity_device_path_in_every_dtype(dtype: torch.dtype) -> None:
    from tests.compressors.device_checks import check_device_decode, check_twin_bytes

    codec = gradzip.create("identity")
    x = (torch.randn(33, 65) * 3).to(dtype)
    x.view(-1)[5] = -0.0
    check_twin_bytes(codec, x, KEY)
    check_device_decode(codec, x, KEY)
