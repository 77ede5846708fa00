"""Every quantizer's packings carry the same symbols: "dense" and "entropy" must decode to
exactly what "fixed" decodes to, and "dense" must not be larger than "fixed"."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect

import pytest
import torch

from gradzip.compressors import Compressor, get, names
from gradzip.errors import PayloadError
from gradzip.keys import StreamKey
from gradzip.payload import build_payload, overhead_bits, parse_payload

KEY = StreamKey(run_seed=5, rank=2, step=9, tensor_index=1)


def with_packing_names() -> list[str]:
    return [n for n in names() if "packing" in inspect.signature(get(n).__init__).parameters]


def build(name: str, packing: str, **params: object) -> Compressor:
    cls = get(name)
    return cls(**{**cls.example_params, **params, "packing": packing})


def decode_all(name: str, x: torch.Tensor, **params: object) -> dict[str, tuple[int, torch.Tensor]]:
    """Per packing: the measured wire bits (checked against the documented formula where there
    is one) and the decoded tensor."""
    side = x if get(name).needs_side_information else None
    results = {}
    for packing in ("fixed", "dense", "entropy"):
        comp = build(name, packing, **params)
        enc = comp.encode(x, KEY)
        formula = comp.expected_body_bits(x)
        if formula is not None:
            assert enc.wire_bits == overhead_bits(parse_payload(enc.payload)[0]) + formula
        results[packing] = (enc.wire_bits, comp.decode(enc.payload, expected_key=KEY, side=side))
    return results


def test_quantizers_offer_all_packings() -> None:
    assert {"dqsg", "ndqsg", "half_dither", "qsgd", "terngrad", "hou", "lpc", "qesgd"} <= set(
        with_packing_names()
    )


@pytest.mark.parametrize("name", with_packing_names())
def test_packings_decode_identically(name: str) -> None:
    x = torch.randn(64, 77, generator=torch.Generator().manual_seed(0)) * 1e-3
    results = decode_all(name, x)
    fixed_bits, fixed = results["fixed"]
    for packing in ("dense", "entropy"):
        _, decoded = results[packing]
        assert torch.equal(decoded, fixed), f"{name}: {packing} decodes differently"
    assert results["dense"][0] <= fixed_bits


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("dqsg", {"M": 2, "bucket_size": 100}),
        ("half_dither", {"M": 3, "dither_sum": 3}),
        ("ndqsg", {"L1": 5, "k": 5}),
        ("qsgd", {"s": 5, "bucket_size": 7}),
        ("hou", {"b": 3}),
        ("lpc", {"b": 5, "theta": 0.5}),
    ],
    ids=str,
)
def test_packings_decode_identically_for_other_alphabets(
    name: str, params: dict[str, object]
) -> None:
    x = torch.randn(3001, generator=torch.Generator().manual_seed(10)) * 1e-2
    results = decode_all(name, x, **params)
    for packing in ("dense", "entropy"):
        assert torch.equal(results[packing][1], results["fixed"][1]), (name, packing)


@pytest.mark.slow
@pytest.mark.parametrize("name", with_packing_names())
def test_packings_decode_identically_at_scale(name: str) -> None:
    x = torch.randn(1 << 21, generator=torch.Generator().manual_seed(1)) * 1e-2
    results = decode_all(name, x)
    for packing in ("dense", "entropy"):
        assert torch.equal(results[packing][1], results["fixed"][1]), (name, packing)
    # the entropy coder must not lose against fixed-width packing on 2M symbols
    assert results["entropy"][0] <= results["fixed"][0] * 1.001


@pytest.mark.parametrize("name", with_packing_names())
@pytest.mark.parametrize("packing", ["dense", "entropy"])
def test_header_shape_lies_raise_for_every_packing(name: str, packing: str) -> None:
    """An entropy-coded body under a header claiming 2**40 elements once made the coder try to
    allocate a terabyte and abort the process: absurd sizes must raise a PayloadError."""
    comp = build(name, packing)
    x = torch.randn(300, generator=torch.Generator().manual_seed(2))
    header, body = parse_payload(comp.encode(x, KEY).payload)
    for shape in ((2**40,), (2**31 + 1,)):
        payload = build_payload(dataclasses.replace(header, shape=shape), [bytes(body)])
        with pytest.raises(PayloadError):
            comp.decode(payload)
    for shape in ((3000,), (299,)):  # plausible sizes: a PayloadError or a tensor of that shape
        payload = build_payload(dataclasses.replace(header, shape=shape), [bytes(body)])
        side = torch.zeros(shape) if comp.needs_side_information else None
        with contextlib.suppress(PayloadError):
            assert comp.decode(payload, side=side).shape == shape
