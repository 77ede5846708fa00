"""``decode_into_``: bitwise ``decode(payload)`` written into a caller's tensor, or a
PayloadError like ``decode``'s.

The fused codecs (DQSG, the stochastic family, one-bit) write straight into ``out`` from the
decoding kernel (no fresh output); the others decode and copy. Either way the bits must be
``decode``'s, whatever ``out`` held before (-0.0 included: a decoded value is written, not added).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from gradzip.compressors import get, names
from gradzip.errors import PayloadError
from gradzip.keys import StreamKey
from gradzip.payload import build_payload, parse_payload

KEY = StreamKey(run_seed=5, rank=1, step=3, tensor_index=2)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)


def _gradient(n: int) -> torch.Tensor:
    x = torch.randn(n, generator=torch.Generator().manual_seed(9)) * 3
    x[100:700] = 0.0  # a zero bucket (with 512-element buckets)
    x[5] = -0.0
    return x


def _garbage(n: int) -> torch.Tensor:
    out = torch.randn(n, generator=torch.Generator().manual_seed(2))
    out[::3] = -0.0
    return out


def _check(comp: Any, payload: bytes, n: int, side: torch.Tensor | None) -> None:
    out = _garbage(n)
    try:
        decoded = comp.decode(payload, expected_key=KEY, shape=(n,), side=side)
    except PayloadError:
        with pytest.raises(PayloadError):
            comp.decode_into_(payload, out, expected_key=KEY, side=side)
        return
    assert comp.decode_into_(payload, out, expected_key=KEY, side=side) is out
    assert torch.equal(_bits(out), _bits(decoded)), f"{comp.describe()}: not decode's bits"


FUSED = [
    ("dqsg", {"M": 1}),
    ("dqsg", {"M": 2}),
    ("dqsg", {"M": 300}),  # float64 arithmetic, 10-bit symbols
    ("qsgd", {"s": 2}),
    ("terngrad", {}),
    ("onebit", {}),
]


@pytest.mark.parametrize(("name", "params"), FUSED, ids=lambda v: str(v))
def test_fused_decode_into_writes_decodes_bits(name: str, params: dict[str, Any]) -> None:
    comp = get(name)(**params)
    n = 70_001  # several tiles, a partial last one
    x = _gradient(n)
    _check(comp, comp.encode(x, KEY).payload, n, None)


@pytest.mark.parametrize("name", names())
def test_every_codec_decodes_into_exactly_or_refuses(name: str) -> None:
    """Registry-wide, on a valid payload and on payloads with one body byte overwritten
    (valid CRC): ``decode_into_`` refuses what ``decode`` refuses and otherwise writes its
    bits."""
    cls = get(name)
    comp = cls(**cls.example_params)
    n = 600
    x = _gradient(n)
    side = x + 0.01 if comp.needs_side_information else None
    header, body = parse_payload(comp.encode(x, KEY).payload)
    raw = bytes(body)
    _check(comp, build_payload(header, [raw]), n, side)
    for pos in range(0, len(raw), max(1, len(raw) // 16)):
        damaged = raw[:pos] + b"\xff" + raw[pos + 1 :]
        _check(comp, build_payload(header, [damaged]), n, side)


def test_an_empty_payload_decodes_into_an_empty_tensor() -> None:
    comp = get("dqsg")()
    out = torch.empty(0)
    assert comp.decode_into_(b"", out) is out
