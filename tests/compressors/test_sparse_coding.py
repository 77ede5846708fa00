"""Sub-bit sparsifiers: top-k with Rice-coded index gaps, top-k and rand-k with low-width values
(fp16, bf16, QSGD or DQSG payloads of the kept values): exact index sets, the value codecs'
own guarantees, measured bits, the original wire unchanged, and validation of every part."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
import torch

import gradzip
from gradzip.codecs.golomb_rice import rice_encode
from gradzip.compressors._sparse_coding import index_gaps
from gradzip.compressors.randk import randk_indices
from gradzip.errors import (
    CorruptPayloadError,
    PayloadError,
    PayloadMismatchError,
    TruncatedPayloadError,
)
from gradzip.feedback import ErrorFeedback
from gradzip.keys import StreamKey
from gradzip.payload import build_payload, parse_payload

KEY = StreamKey(run_seed=11, rank=1, step=4, tensor_index=2)
CODINGS = [
    {"index_coding": "rice"},
    {"value_codec": "fp16"},
    {"index_coding": "rice", "value_codec": "bf16"},
    {"index_coding": "rice", "value_codec": "qsgd"},
    {"index_coding": "fixed", "value_codec": "dqsg", "value_levels": 2},
    {"index_coding": "rice", "value_codec": "qsgd", "value_levels": 3},
]


def normal(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def kept_set(x: torch.Tensor, k: int) -> torch.Tensor:
    """The top-k indices with ties to the smaller index (no ties in a normal sample)."""
    return torch.sort(torch.topk(x.abs(), k).indices).values


@pytest.mark.parametrize("coding", CODINGS)
def test_topk_codings_keep_the_same_set_and_code_values_with_their_codec(
    coding: dict[str, object],
) -> None:
    x = normal(20_011)
    comp = gradzip.create("topk", ratio=0.01, **coding)
    enc = comp.encode(x, KEY)
    out = comp.decode(enc.payload, expected_key=KEY, shape=x.shape)
    idx = kept_set(x, 200)
    outside = torch.ones(x.numel(), dtype=torch.bool)
    outside[idx] = False
    assert torch.equal(out[outside], torch.zeros(int(outside.sum())))
    kept, got = x[idx], out[idx]
    codec = coding.get("value_codec", "fp32")
    if codec == "fp32":
        assert torch.equal(got, kept)
    elif codec in ("fp16", "bf16"):
        dtype = torch.float16 if codec == "fp16" else torch.bfloat16
        assert torch.equal(got, kept.to(dtype).to(torch.float32))
    else:  # a max-norm grid of the kept values with `levels` steps a side
        levels = int(coding.get("value_levels", 1))  # type: ignore[call-overload]
        scale = float(kept.abs().max())
        step = scale / levels
        assert float((got - kept).abs().max()) <= step * (1 + 1e-6)
    # receivers decode alike, also by adding into a buffer
    again = torch.full_like(x, 0.5)
    comp.decode_add_(enc.payload, again, expected_key=KEY)
    assert torch.equal(again, out + 0.5)


@pytest.mark.parametrize("codec", ["qsgd", "dqsg"])
def test_quantized_kept_values_are_unbiased(codec: str) -> None:
    """Over 2,000 keys the decoded kept values average to the kept values: each draw's error
    lies within one step (``2 max|v|`` at one level), so its variance is at most ``step^2/4``
    and the mean of 2,000 draws is within 5 standard deviations, ``5 step / (2 sqrt(2000))``."""
    x = normal(1000, seed=3)
    comp = gradzip.create("topk", k=40, value_codec=codec)
    idx = kept_set(x, 40)
    total = torch.zeros(40, dtype=torch.float64)
    draws = 2000
    for step in range(draws):
        key = StreamKey(run_seed=5, rank=0, step=step, tensor_index=0)
        total += comp.decode(comp.encode(x, key).payload)[idx].double()
    scale = float(x[idx].abs().max())
    step_size = scale  # one level a side: grid steps of max|v|
    tolerance = 5 * step_size / (2 * math.sqrt(draws))
    assert float((total / draws - x[idx].double()).abs().max()) <= tolerance


def test_rice_indices_cost_about_log2_d_over_k_bits_and_values_two() -> None:
    """At 1% kept of 2^20 values: original wire 20 + 32 bits a kept value; Rice gaps about
    log2(100) + 1.5; ternary QSGD values 2 bits, plus two small headers."""
    d = 1 << 20
    x = normal(d, seed=4)
    k = d // 100
    sizes = {}
    for coding in ({}, {"index_coding": "rice"}, {"index_coding": "rice", "value_codec": "qsgd"}):
        enc = gradzip.create("topk", k=k, **coding).encode(x, KEY)
        sizes[tuple(coding.values())] = enc
    original = sizes[()].wire_bits / k
    rice = sizes[("rice",)].wire_bits / k - 32
    both = sizes[("rice", "qsgd")].wire_bits / k
    assert 52 <= original <= 52.1
    assert math.log2(100) + 0.5 <= rice <= math.log2(100) + 2.0
    assert both <= rice + 2.1
    assert both * k / d < 0.11  # bits a coordinate


def test_default_wire_is_unchanged_and_a_different_coding_is_refused() -> None:
    x = normal(5000, seed=5)
    default = gradzip.create("topk", ratio=0.02).encode(x, KEY).payload
    spelled = gradzip.create("topk", ratio=0.02, index_coding="fixed", value_codec="fp32")
    assert spelled.encode(x, KEY).payload == default
    rice = gradzip.create("topk", ratio=0.02, index_coding="rice")
    with pytest.raises(PayloadMismatchError):
        rice.decode(default)
    with pytest.raises(PayloadMismatchError):
        gradzip.create("topk", ratio=0.02).decode(rice.encode(x, KEY).payload)


def test_coding_options_are_validated() -> None:
    with pytest.raises(ValueError, match="index_coding"):
        gradzip.create("topk", k=3, index_coding="elias")
    with pytest.raises(ValueError, match="value_codec"):
        gradzip.create("topk", k=3, value_codec="int8")
    with pytest.raises(ValueError, match="value_levels"):
        gradzip.create("topk", k=3, value_codec="fp16", value_levels=2)
    with pytest.raises(ValueError, match="value_levels"):
        gradzip.create("randk", k=3, value_codec="qsgd", value_levels=0)


def rice_body(idx: list[int], values: bytes, rice_k: int = 2) -> bytes:
    gaps = index_gaps(np.asarray(idx, dtype=np.int64))
    return values + struct.pack("<I", rice_k) + rice_encode(gaps, rice_k).tobytes()


def test_rice_index_stream_is_validated() -> None:
    comp = gradzip.create("topk", k=3, index_coding="rice")
    header, _ = parse_payload(comp.encode(normal(10), KEY).payload)
    values = torch.ones(3).numpy().tobytes()

    def decode(body: bytes) -> torch.Tensor:
        return comp.decode(build_payload(header, [body]))

    assert decode(rice_body([0, 4, 9], values)).tolist() == [1, 0, 0, 0, 1, 0, 0, 0, 0, 1]
    with pytest.raises(CorruptPayloadError, match="holds 2 indices"):
        decode(rice_body([0, 4], values))
    with pytest.raises(CorruptPayloadError, match="holds 4 indices"):
        decode(rice_body([0, 4, 5, 6], values))
    with pytest.raises(CorruptPayloadError, match="out of range"):
        decode(rice_body([0, 4, 10], values))
    with pytest.raises(CorruptPayloadError, match="Rice parameter"):
        decode(values + struct.pack("<I", 40) + b"\xff" * 4)
    with pytest.raises(CorruptPayloadError, match="whole 32-bit words"):
        decode(rice_body([0, 4, 9], values) + b"\0")
    with pytest.raises(TruncatedPayloadError):
        decode(values + b"\0\0")


@pytest.mark.parametrize(("name", "coding"), [("topk", CODINGS[3]), ("randk", CODINGS[1])])
def test_every_truncation_and_byte_flip_of_a_coded_body_is_refused_or_decodes_finite(
    name: str, coding: dict[str, object]
) -> None:
    """Bodies re-framed with a valid checksum, so the parsers of the coded parts are what is
    exercised: a shorter body always raises a PayloadError; a flipped byte either raises one or
    decodes to finite values of the right shape."""
    coding = {k: v for k, v in coding.items() if name == "topk" or k != "index_coding"}
    comp = gradzip.create(name, k=8, **coding)
    header, body = parse_payload(comp.encode(normal(300, seed=6), KEY).payload)
    body = bytes(body)
    for cut in range(len(body)):
        with pytest.raises(PayloadError):
            comp.decode(build_payload(header, [body[:cut]]))
    for at in range(len(body)):
        flipped = bytearray(body)
        flipped[at] ^= 0x5A
        try:
            out = comp.decode(build_payload(header, [bytes(flipped)]))
        except PayloadError:
            continue
        assert out.shape == (300,) and bool(torch.isfinite(out).all())


@pytest.mark.parametrize("codec", ["fp16", "qsgd"])
def test_randk_low_width_values_keep_the_shared_index_set(codec: str) -> None:
    """Half the bits or less for 2,000 kept values (the value payload's own header included)."""
    x = normal(40_000, seed=7)
    comp = gradzip.create("randk", ratio=0.05, value_codec=codec)
    enc = comp.encode(x, KEY)
    out = comp.decode(enc.payload, expected_key=KEY, shape=x.shape)
    idx = torch.from_numpy(randk_indices(KEY, 40_000, 2000))
    mask = torch.zeros(40_000, dtype=torch.bool)
    mask[idx] = True
    assert torch.equal(out[~mask], torch.zeros(38_000))
    assert enc.wire_bits < 0.52 * gradzip.create("randk", ratio=0.05).encode(x, KEY).wire_bits


def test_error_feedback_carries_the_dropped_and_the_quantization_error() -> None:
    """With error feedback the residual is exactly what was not delivered, ``v - decode``."""
    x = normal(3000, seed=8)
    comp = gradzip.create("topk", ratio=0.01, index_coding="rice", value_codec="qsgd")
    feedback = ErrorFeedback(comp)
    encoded, v_hat = feedback.round_trip(x, KEY)
    assert torch.equal(feedback.residual(KEY.tensor_index).view(-1), (x - v_hat).view(-1))
    assert torch.equal(comp.decode(encoded.payload, expected_key=KEY, shape=x.shape), v_hat)
