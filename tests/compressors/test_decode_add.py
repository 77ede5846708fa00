"""``decode_add_``: bitwise ``out + decode(payload)``, or a PayloadError with ``out`` untouched;
``decode_into_``: bitwise ``decode(payload)`` written into ``out``, or ``decode``'s refusal.

The fused codecs (DQSG, half dither, the stochastic family, LPC) add into ``out`` inside the
decoding kernel; these tests pin that to the bits of decoding and then adding, and check that a
corrupt body with a valid CRC never half-updates ``out`` (a symbol outside the alphabet in the
last tile must be found before the first tile is added).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import gradzip
from gradzip.compressors import get, names
from gradzip.errors import PayloadError
from gradzip.keys import StreamKey
from gradzip.payload import build_payload, parse_payload

KEY = StreamKey(run_seed=5, rank=1, step=3, tensor_index=2)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)


def _base(n: int, negative_zeros: bool = True) -> torch.Tensor:
    out = torch.randn(n, generator=torch.Generator().manual_seed(2))
    if negative_zeros:  # -0.0 + +0.0 is +0.0: the zero buckets' values must really be added
        out[::7] = -0.0
    return out


def _gradient(n: int) -> torch.Tensor:
    x = torch.randn(n, generator=torch.Generator().manual_seed(9)) * 3
    x[100:700] = 0.0  # a zero bucket (with 512-element buckets)
    return x


def _check(comp: Any, payload: bytes, base: torch.Tensor, side: torch.Tensor | None) -> bool:
    """Assert the contract for one payload; True if it was refused."""
    out = base.clone()
    try:
        decoded = comp.decode(payload, expected_key=KEY, shape=base.shape, side=side)
    except PayloadError:
        with pytest.raises(PayloadError):
            comp.decode_add_(payload, out, expected_key=KEY, side=side)
        assert torch.equal(_bits(out), _bits(base)), "a refused payload changed out"
        return True
    expected = base.clone().add_(decoded)
    assert comp.decode_add_(payload, out, expected_key=KEY, side=side) is out
    assert torch.equal(_bits(out), _bits(expected)), f"{comp.describe()}: not decode-then-add"
    return False


FUSED = [
    ("dqsg", {"M": 1}),
    ("dqsg", {"M": 2}),  # 3-bit symbols: the unpacking check pass
    ("dqsg", {"M": 300}),  # float64 arithmetic, 10-bit symbols
    ("dqsg", {"M": 1, "bucket_size": None}),
    ("half_dither", {"M": 2}),
    ("qsgd", {"s": 1}),
    ("qsgd", {"s": 2}),
    ("qsgd", {"s": 7}),  # 15 of the 16 four-bit codes: the byte-table check
    ("terngrad", {}),
    ("hou", {"b": 3, "scaled": True}),
    ("lpc", {"b": 4}),
    ("ndqsg", {}),  # decodes and adds (no fused path)
]


@pytest.mark.parametrize(("name", "params"), FUSED, ids=lambda v: str(v))
def test_decode_add_is_decode_then_add_bitwise(name: str, params: dict[str, Any]) -> None:
    comp = gradzip.create(name, **params)
    n = 3 * 4096 + 37  # several tiles, a partial last one
    x = _gradient(n)
    side = x + 0.01 if comp.needs_side_information else None
    payload = comp.encode(x, KEY).payload
    assert not _check(comp, payload, _base(n), side)


@pytest.mark.parametrize(("name", "params"), FUSED, ids=lambda v: str(v))
def test_a_symbol_outside_the_alphabet_in_the_last_tile_leaves_out_untouched(
    name: str, params: dict[str, Any]
) -> None:
    comp = gradzip.create(name, **params)
    n = 3 * 4096 + 40  # a whole number of bytes for every width: no padding bits
    x = _gradient(n)
    side = x + 0.01 if comp.needs_side_information else None
    header, body = parse_payload(comp.encode(x, KEY).payload)
    raw = bytes(body)
    refused = 0
    for pos in (len(raw) - 1, len(raw) - 2, len(raw) // 2):
        damaged = raw[:pos] + b"\xff" + raw[pos + 1 :]
        refused += _check(comp, build_payload(header, [damaged]), _base(n), side)
    alphabet_is_full = name == "lpc"  # 2**b - 1 symbols: 0xff bytes may stay in range
    assert refused or alphabet_is_full, f"{comp.describe()}: no damaged payload was refused"


def registry_payloads(name: str) -> tuple[Any, torch.Tensor | None, list[bytes]]:
    """``name``'s compressor (example parameters), the side information it needs, and the
    payload of a 600-value gradient followed by copies with one body byte overwritten (the
    CRC recomputed, so only the codec's own checks can refuse them)."""
    cls = get(name)
    comp = cls(**cls.example_params)
    x = _gradient(600)
    side = x + 0.01 if comp.needs_side_information else None
    header, body = parse_payload(comp.encode(x, KEY).payload)
    raw = bytes(body)
    damaged = [
        raw[:pos] + b"\xff" + raw[pos + 1 :] for pos in range(0, len(raw), max(1, len(raw) // 16))
    ]
    return comp, side, [build_payload(header, [body]) for body in [raw, *damaged]]


@pytest.mark.parametrize("name", names())
def test_every_codec_adds_exactly_or_refuses(name: str) -> None:
    """Registry-wide: the decode_add_ contract on a valid payload and on payloads whose body has
    one byte overwritten (valid CRC). No -0.0 in ``out``: the sparse codecs add only their kept
    values, which is decode-then-add for every ``out`` but ``-0.0`` (their documented
    precondition)."""
    comp, side, payloads = registry_payloads(name)
    base = _base(600, negative_zeros=False)
    for payload in payloads:
        _check(comp, payload, base, side)


# -- decode_into_: decode's bits written into a caller's tensor ---------------------------------
def _check_into(comp: Any, payload: bytes, n: int, side: torch.Tensor | None) -> None:
    """``decode_into_`` refuses what ``decode`` refuses, else writes exactly its bits, whatever
    ``out`` held (-0.0 included: a decoded value is written, not added)."""
    out = _base(n)
    try:
        decoded = comp.decode(payload, expected_key=KEY, shape=(n,), side=side)
    except PayloadError:
        with pytest.raises(PayloadError):
            comp.decode_into_(payload, out, expected_key=KEY, side=side)
        return
    assert comp.decode_into_(payload, out, expected_key=KEY, side=side) is out
    assert torch.equal(_bits(out), _bits(decoded)), f"{comp.describe()}: not decode's bits"


@pytest.mark.parametrize(("name", "params"), [*FUSED, ("onebit", {})], ids=lambda v: str(v))
def test_decode_into_writes_decodes_bits(name: str, params: dict[str, Any]) -> None:
    comp = get(name)(**params)
    n = 70_001  # several tiles, a partial last one
    x = _gradient(n)
    x[5] = -0.0
    side = x + 0.01 if comp.needs_side_information else None
    _check_into(comp, comp.encode(x, KEY).payload, n, side)


@pytest.mark.parametrize("name", names())
def test_every_codec_decodes_into_exactly_or_refuses(name: str) -> None:
    comp, side, payloads = registry_payloads(name)
    for payload in payloads:
        _check_into(comp, payload, 600, side)


def test_an_empty_payload_decodes_into_an_empty_tensor() -> None:
    out = torch.empty(0)
    assert get("dqsg")().decode_into_(b"", out) is out
