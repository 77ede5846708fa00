"""A payload can never cost more than its size: declared sizes are checked against the body
before anything is allocated, failed allocations and non-finite output raise PayloadErrors.

Every hostile payload here carries a valid CRC, so it really reaches the decoders.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

import numpy as np
import pytest
import torch

import gradzip
from gradzip.codecs import entropy
from gradzip.compressors import Compressor, get, names
from gradzip.compressors._decode_guards import UNVOUCHED_ELEMENTS_PER_BYTE
from gradzip.errors import CorruptPayloadError, PayloadError
from gradzip.keys import StreamKey
from gradzip.payload import build_payload, parse_payload

KEY = StreamKey(run_seed=3, rank=1, step=2, tensor_index=0)


def _declaring(comp: Compressor, x: torch.Tensor, numel: int) -> bytes:
    """``comp``'s payload of ``x`` with a header that declares ``numel`` elements."""
    header, body = parse_payload(comp.encode(x, KEY).payload)
    return build_payload(dataclasses.replace(header, shape=(numel,)), [bytes(body)])


def _never_decode(*args: Any) -> torch.Tensor:
    raise AssertionError("the body was decoded: the declared size was not refused first")


# the cases: tiny payloads declaring 2**28..2**31 elements, decoded README-style
TINY_HUGE = [
    ("randk", {"k": 1}, 2**31),
    ("topk", {"k": 1}, 2**31),
    ("qsgd", {"coding": "elias", "norm": "l2"}, 2**28),
    ("randk", {"k": 4}, 2**28),
    ("adaptive", {"proportion": 32}, 2**28),
    ("threshold", {"tau": 10.0}, 2**28),
    ("dqsg", {"M": 2, "packing": "entropy"}, 2**28),
    ("qsgd", {"s": 4, "packing": "entropy"}, 2**31),
    ("terngrad", {"packing": "entropy"}, 2**30),
    ("lpc", {"packing": "entropy"}, 2**29),
]


@pytest.mark.parametrize(("name", "params", "numel"), TINY_HUGE)
def test_tiny_payloads_declaring_huge_tensors_are_refused_before_decoding(
    name: str, params: dict[str, Any], numel: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    comp = gradzip.create(name, **params)
    payload = _declaring(comp, torch.zeros(10), numel)
    assert len(payload) < 300
    monkeypatch.setattr(type(comp), "_decode_flat", _never_decode)
    with pytest.raises(PayloadError, match=f"{numel} elements"):
        comp.decode(payload)


def test_a_caller_passing_shape_vouches_for_a_sparse_tensor() -> None:
    # a genuine top-1 of a 2**22-element zero tensor: ~40 bytes for 4 million elements
    comp = gradzip.create("topk", k=1)
    x = torch.zeros(2**22)
    x[12345] = 2.5
    payload = comp.encode(x, KEY).payload
    assert x.numel() > UNVOUCHED_ELEMENTS_PER_BYTE * len(payload)
    with pytest.raises(CorruptPayloadError, match="pass shape="):
        comp.decode(payload)
    out = comp.decode(payload, shape=x.shape)
    assert torch.equal(out, x)
    # round_trip knows the shape it encoded, so it decodes as well
    assert torch.equal(comp.round_trip(x, KEY)[1], x)


def test_a_dense_body_too_short_for_the_declared_count_is_refused_even_with_shape(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    comp = gradzip.create("dqsg", M=2)
    payload = _declaring(comp, torch.randn(50), 2**20)
    monkeypatch.setattr(type(comp), "_decode_flat", _never_decode)
    with pytest.raises(PayloadError, match="need a body of at least"):
        comp.decode(payload, shape=(2**20,))


def test_an_entropy_model_needing_more_data_than_sent_is_refused_before_decoding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a model claiming 2**28 ternary symbols, one third of each, behind 4 bytes of data: the
    # decoder used to run ~10**7 coder steps before noticing
    n = 2**28
    model = entropy._varint_bytes(np.array([0, 2, 1, n // 3, n // 3], dtype=np.int64))
    data = torch.from_numpy(np.concatenate([model, np.array([1, 2, 3, 4], dtype=np.uint8)]))
    monkeypatch.setattr(entropy, "_decode_supers", _never_decode)
    with pytest.raises(CorruptPayloadError, match="coded data"):
        entropy.entropy_decode(data, n, 3)


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 GiB"),
        MemoryError(),
    ],
    ids=["torch", "python"],
)
def test_a_failed_allocation_surfaces_as_a_payload_error(
    error: BaseException, monkeypatch: pytest.MonkeyPatch
) -> None:
    comp = gradzip.create("identity")
    payload = comp.encode(torch.randn(5), KEY).payload

    def fail(*args: Any) -> torch.Tensor:
        raise error

    monkeypatch.setattr(type(comp), "_decode_flat", fail)
    with pytest.raises(PayloadError, match="cannot be allocated"):
        comp.decode(payload)


def test_other_runtime_errors_are_not_disguised(monkeypatch: pytest.MonkeyPatch) -> None:
    comp = gradzip.create("identity")
    payload = comp.encode(torch.randn(5), KEY).payload

    def bug(*args: Any) -> torch.Tensor:
        raise RuntimeError("shape mismatch in a decoder")

    monkeypatch.setattr(type(comp), "_decode_flat", bug)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        comp.decode(payload)


# -- non-finite output ---------------------------------------------------------------------------
_F32 = struct.Struct("<f")
_H = struct.Struct("<H")
#: float32 NaN, float32 Inf, a finite scale whose products overflow; float16 and bfloat16 NaN,
#: and the largest int16 (the fp16 exponent field)
_WORDS = [_F32.pack(float("nan")), _F32.pack(float("inf")), _F32.pack(3e38)]
_HALVES = [_H.pack(0x7E00), _H.pack(0x7FC0), _H.pack(0x7FFF)]


def _crafted(comp: Compressor, x: torch.Tensor) -> list[bytes]:
    """Payloads with a valid CRC whose body has one float32 or 16-bit slot overwritten with a
    value that decodes to NaN or Inf if nothing checks it."""
    header, body = parse_payload(comp.encode(x, KEY).payload)
    raw = bytes(body)
    out = []
    for width, patterns in ((4, _WORDS), (2, _HALVES)):
        for pos in range(0, min(len(raw), 48) - width + 1, width):
            for pattern in patterns:
                damaged = raw[:pos] + pattern + raw[pos + width :]
                out.append(build_payload(header, [damaged]))
    return out


def _gradient(dtype: torch.dtype) -> torch.Tensor:
    x = torch.randn(64, generator=torch.Generator().manual_seed(11))
    x[0] = 4.0  # a dominant coordinate: large levels, so a huge scale overflows
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("name", names())
def test_no_codec_decodes_a_corrupt_body_to_nan_or_inf(name: str, dtype: torch.dtype) -> None:
    """Registry-wide contract: a crafted body either raises a PayloadError or decodes to
    finite values, exactly as encoders refuse non-finite input."""
    cls = get(name)
    comp = cls(**cls.example_params)
    x = _gradient(dtype)
    side = x if comp.needs_side_information else None
    for payload in _crafted(comp, x):
        try:
            out = comp.decode(payload, shape=x.shape, side=side)
        except PayloadError:
            continue
        assert bool(torch.isfinite(out).all()), f"{comp.describe()} decoded NaN or Inf"


# the cases, each of which decoded to NaN or Inf: each must now be refused
NON_FINITE = [
    ("identity", {}, torch.float32),
    ("fp16", {}, torch.float32),
    ("bf16", {}, torch.float32),
    ("topk", {"ratio": 0.1}, torch.float32),
    ("randk", {"ratio": 0.1}, torch.float32),
    ("lpc", {"b": 24}, torch.float32),
    ("qsgd_l2", {"bits": 8}, torch.float32),
    ("onebit", {}, torch.float16),
]


@pytest.mark.parametrize(("name", "params", "dtype"), NON_FINITE)
def test_corrupt_bodies_that_decoded_to_nan_or_inf_are_refused(
    name: str, params: dict[str, Any], dtype: torch.dtype
) -> None:
    comp = gradzip.create(name, **params)
    refused = 0
    for payload in _crafted(comp, _gradient(dtype)):
        try:
            out = comp.decode(payload)
        except PayloadError as err:
            refused += "non-finite" in str(err)
            continue
        assert bool(torch.isfinite(out).all()), f"{comp.describe()} decoded NaN or Inf"
    assert refused, f"no crafted {name} payload reached the non-finite check"
