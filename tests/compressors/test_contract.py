"""One contract, every registered compressor: adding a compressor enrols it here.

Checks: shapes and dtypes round-trip (0-d, 1 element, odd sizes, all zeros, 1e-30..1e30),
``wire_bits`` equals the measured payload and the documented formula, encodes are deterministic
given the key and a separately built receiver decodes them, and bad input or bad bytes raise
errors that name the problem.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import gradzip
from gradzip.compressors import Compressor, get, names
from gradzip.errors import (
    KeyMismatchError,
    NonFiniteInputError,
    PayloadError,
    PayloadMismatchError,
    TruncatedPayloadError,
)
from gradzip.keys import StreamKey
from gradzip.payload import build_payload, overhead_bits, parse_payload

KEY = StreamKey(run_seed=99, rank=1, step=4, tensor_index=2)
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
SHAPES = [(), (1,), (7,), (3, 5), (2, 3, 4), (1000,), (33, 17), (130, 3)]


def make(name: str) -> Compressor:
    cls = get(name)
    return cls(**cls.example_params)


def wide_range(n: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Magnitudes spread log-uniformly over 1e-30..1e30 (clipped to what ``dtype`` holds)."""
    gen = torch.Generator().manual_seed(seed)
    exponents = torch.empty(n, dtype=torch.float64).uniform_(-30, 30, generator=gen)
    signs = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0).double()
    values = signs * torch.pow(10.0, exponents)
    if dtype == torch.float16:
        values = values.clamp(-6e4, 6e4)
    return values.to(dtype)


def decode(comp: Compressor, payload: bytes, x: torch.Tensor, **kw: object) -> torch.Tensor:
    side = x if comp.needs_side_information else None
    return comp.decode(payload, side=side, **kw)  # type: ignore[arg-type]


def check_round_trip(comp: Compressor, x: torch.Tensor) -> torch.Tensor:
    enc = comp.encode(x, KEY)
    if x.numel() == 0:
        assert enc.payload == b"" and enc.wire_bits == 0
        return comp.decode(b"", shape=x.shape, dtype=x.dtype)
    out = decode(comp, enc.payload, x, expected_key=KEY, shape=x.shape, dtype=x.dtype)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert bool(torch.isfinite(out).all()), f"{comp.describe()} decoded non-finite values"
    # bytes are the truth: wire bits are the measured payload, and match the documented formula
    assert enc.wire_bits == 8 * len(enc.payload)
    header, _ = parse_payload(enc.payload)
    formula = comp.expected_body_bits(x)
    if formula is not None:
        assert enc.wire_bits == overhead_bits(header) + formula, comp.describe()
    assert enc.paper_bits >= 0 and math.isfinite(enc.paper_bits)
    assert enc.entropy_bits >= 0 and math.isfinite(enc.entropy_bits)
    return out


@pytest.mark.parametrize("name", names())
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_shapes_dtypes_round_trip(name: str, dtype: torch.dtype) -> None:
    comp = make(name)
    gen = torch.Generator().manual_seed(1)
    for shape in SHAPES:
        x = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
        check_round_trip(comp, x)
        zeros = torch.zeros(shape, dtype=dtype)
        out = check_round_trip(comp, zeros)
        assert bool((out == 0).all()), f"{name}: zeros must decode to exact zeros"
    check_round_trip(comp, wide_range(1001, dtype).view(7, 11, 13))
    check_round_trip(comp, torch.zeros((0,), dtype=dtype))
    check_round_trip(comp, torch.zeros((3, 0, 2), dtype=dtype))


@pytest.mark.parametrize("name", names())
def test_deterministic_given_keys_and_separate_receiver(name: str) -> None:
    x = torch.randn(513, generator=torch.Generator().manual_seed(2))
    first = make(name).encode(x, KEY)
    second = make(name).encode(x, KEY)
    assert first.payload == second.payload
    receiver = make(name)
    a = decode(receiver, first.payload, x, expected_key=KEY)
    b = decode(make(name), second.payload, x, expected_key=KEY)
    assert torch.equal(a, b)


@pytest.mark.parametrize("name", names())
def test_mismatched_expectations_are_named(name: str) -> None:
    comp = make(name)
    x = torch.randn(64, generator=torch.Generator().manual_seed(3))
    payload = comp.encode(x, KEY).payload
    with pytest.raises(KeyMismatchError, match="step 4 != expected 5"):
        decode(comp, payload, x, expected_key=KEY.with_step(5))
    with pytest.raises(KeyMismatchError, match="run_seed"):
        decode(comp, payload, x, expected_key=StreamKey(100, 1, 4, 2))
    with pytest.raises(PayloadMismatchError, match="shape"):
        decode(comp, payload, x, shape=(8, 8))
    with pytest.raises(PayloadMismatchError, match="dtype"):
        decode(comp, payload, x, dtype=torch.float64)
    other = next(n for n in names() if n != name)
    with pytest.raises(PayloadMismatchError, match=f"'{name}'"):
        decode(make(other), payload, x)
    with pytest.raises(TruncatedPayloadError):
        comp.decode(b"", shape=(64,))


@pytest.mark.parametrize("name", names())
def test_corrupt_and_truncated_payloads_raise(name: str) -> None:
    comp = make(name)
    x = torch.randn(40, generator=torch.Generator().manual_seed(4))
    payload = comp.encode(x, KEY).payload
    for cut in range(len(payload)):
        with pytest.raises(PayloadError):
            decode(comp, payload[:cut], x)
    for position in range(0, len(payload), max(1, len(payload) // 40)):
        damaged = bytearray(payload)
        damaged[position] ^= 0x24
        with pytest.raises(PayloadError):
            decode(comp, bytes(damaged), x)


@pytest.mark.parametrize("name", names())
def test_body_garbage_with_valid_checksum_never_crashes(name: str) -> None:
    """A sender bug (valid CRC, wrong body) must raise a PayloadError or decode to the right
    shape; an IndexError, a hang or a wrong-shaped tensor would be a defect."""
    comp = make(name)
    x = torch.randn(50, generator=torch.Generator().manual_seed(5))
    header, body = parse_payload(comp.encode(x, KEY).payload)
    gen = torch.Generator().manual_seed(6)
    sizes = {0, 1, 3, len(body) - 1, len(body), len(body) + 1, 2 * len(body) + 8}
    for size in sorted(s for s in sizes if s >= 0):
        for _ in range(3):
            garbage = torch.randint(0, 256, (size,), generator=gen, dtype=torch.uint8)
            payload = build_payload(header, [bytes(garbage.tolist())])
            try:
                out = decode(comp, payload, x)
            except PayloadError:
                continue
            assert out.shape == x.shape


@pytest.mark.parametrize("name", names())
def test_header_shape_lies_raise_instead_of_crashing(name: str) -> None:
    """A valid checksum over a header whose shape does not match its body: an absurd size must
    be refused before anything is allocated, a merely wrong one must fail the body checks."""
    comp = make(name)
    x = torch.randn(50, generator=torch.Generator().manual_seed(7))
    header, body = parse_payload(comp.encode(x, KEY).payload)
    for shape in ((2**40,), (2**31 + 1,), (50_000,), (49,), (51,)):
        payload = build_payload(dataclasses.replace(header, shape=shape), [bytes(body)])
        side = torch.zeros(shape) if comp.needs_side_information and shape[0] < 10**6 else None
        try:
            out = comp.decode(payload, side=side)
        except PayloadError:
            continue
        except ValueError as err:  # only the missing side information of an absurd shape
            assert comp.needs_side_information and side is None, err
            continue
        assert out.shape == shape


@pytest.mark.parametrize("name", names())
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_input_raises(name: str, bad: float) -> None:
    x = torch.randn(10)
    x[3] = bad
    with pytest.raises(NonFiniteInputError):
        make(name).encode(x, KEY)


def test_registry_is_complete_and_consistent() -> None:
    expected = {
        "identity", "fp16", "bf16", "dqsg", "half_dither", "ndqsg", "qsgd", "terngrad",
        "onebit", "threshold", "adaptive", "lpc", "qesgd", "topk", "randk", "hou",
    }  # fmt: skip
    assert expected <= set(names())
    ids = [get(n).codec_id for n in names()]
    assert len(ids) == len(set(ids))
    for n in names():
        assert (get(n).__doc__ or "").strip(), f"{n} has no docstring"
        assert "References" in (get(n).__doc__ or "") or n == "identity", n
    with pytest.raises(KeyError, match="unknown compressor"):
        gradzip.create("nope")
