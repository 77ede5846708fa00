"""Decoding without ``shape=`` costs at most what the payload's size allows (issue 26, item 4).

For every registered compressor and the coding options that change how a body is read
(:func:`gradzip_lab.bench.hostile_payloads.variants`), a genuine payload has its header rewritten
to declare up to 2**31 elements, with its CRC recomputed, and is decoded the README's way.
Deterministic instead of timed: a declared size beyond the codec's unvouched cap must be refused
before the body is decoded (the decoder is replaced by one that fails the test), and a size
within it must decode or raise a GradzipError, never more elements than the cap. The time and
memory those caps buy are measured by ``benchmarks/hostile_decode.py``.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
import torch

import gradzip
from gradzip.compressors import Compressor, names
from gradzip.compressors._decode_guards import (
    UNVOUCHED_CODED_ELEMENTS_PER_BYTE,
    UNVOUCHED_ELEMENTS_PER_BYTE,
)
from gradzip.errors import GradzipError, PayloadError
from gradzip_lab.bench import hostile_payloads as hp

VARIANTS = hp.variants()
IDS = [hp.label(name, params) for name, params in VARIANTS]


@cache
def _genuine(index: int, numel: int) -> tuple[Compressor, bytes, torch.Tensor | None]:
    """Variant ``index``, its payload of a ``numel``-element gradient, and its side info."""
    name, params = VARIANTS[index]
    comp = gradzip.create(name, **params)
    x = hp.gradient(numel)
    if name == "qesgd" and params.get("bits") == 16:
        x = x.abs()  # a 16-bit entropy model of signed values sends 65536 counts (~65 KB)
    side = x.reshape(-1) if comp.needs_side_information else None
    return comp, bytes(comp.encode(x, hp.KEY).payload), side


def _never_decode(*args: Any) -> torch.Tensor:
    raise AssertionError("the body was decoded: the declared size was not refused first")


def test_every_registered_compressor_is_covered() -> None:
    assert {name for name, _ in VARIANTS} == set(names())
    # the entropy-coded options the issue names are among the variants
    for name in ("qesgd", "lpc", "hou", "dqsg", "qsgd"):
        assert (name, "entropy") in {(n, p.get("packing")) for n, p in VARIANTS}


@pytest.mark.parametrize("index", range(len(VARIANTS)), ids=IDS)
def test_without_shape_a_64_kib_payload_stands_for_at_most_2_mi_elements(index: int) -> None:
    comp = gradzip.create(VARIANTS[index][0], **VARIANTS[index][1])
    per_byte = comp.unvouched_elements_per_byte()
    assert per_byte in (UNVOUCHED_ELEMENTS_PER_BYTE, UNVOUCHED_CODED_ELEMENTS_PER_BYTE)
    assert per_byte * hp.MAX_PAYLOAD_BYTES <= 1 << 21
    if VARIANTS[index][1].get("packing") == "entropy":
        assert per_byte * hp.MAX_PAYLOAD_BYTES <= 1 << 20


@pytest.mark.parametrize("index", range(len(VARIANTS)), ids=IDS)
def test_a_size_beyond_the_unvouched_cap_is_refused_before_decoding(
    index: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a payload of 16384 values is several KB (65 KB for 16-bit QESGD entropy-coded): under the
    # old cap of 2**16 elements a byte, 2**28 elements passed and decoded for seconds
    comp, payload, side = _genuine(index, 1 << 14)
    per_byte = comp.unvouched_elements_per_byte()
    just_over = per_byte * (len(hp.declaring(payload, (1 << 31,))) + 16)
    just_over += -just_over % 64  # a whole number of 64-element rows
    monkeypatch.setattr(type(comp), "_decode_flat", _never_decode)
    for numel in (just_over, *hp.DECLARED):
        for shape in hp.shapes(numel):
            hostile = hp.declaring(payload, shape)
            if numel <= per_byte * len(hostile):
                assert numel <= 1 << 21  # 2**20 is within the cap of a payload of 32 KB or more
                continue
            with pytest.raises(PayloadError) as refused:
                comp.decode(hostile, side=side)
            if comp.needs_side_information:
                continue  # refused as not matching the receiver's side information
            message = str(refused.value)
            assert f"{numel} elements" in message
            # the cap's refusal names shape=, the body's floor and the format's own limit
            # (2**31 elements a payload) their sizes
            assert any(
                text in message
                for text in ("shape=", "need a body of at least", "one payload holds at most")
            )


@pytest.mark.parametrize("index", range(len(VARIANTS)), ids=IDS)
def test_a_size_within_the_cap_decodes_or_is_refused_as_a_payload_error(index: int) -> None:
    comp, payload, side = _genuine(index, 1 << 10)
    per_byte = comp.unvouched_elements_per_byte()
    cap = per_byte * len(hp.declaring(payload, (1 << 31,)))
    for numel in (cap - cap % 64, 1 << 12, 1 << 10, 1 << 9):
        for shape in hp.shapes(numel):
            hostile = hp.declaring(payload, shape)
            try:
                out = comp.decode(hostile, side=side)
            except GradzipError:
                continue
            assert out.shape == shape
            assert out.numel() <= per_byte * len(hostile)


def test_a_refused_size_names_the_limit_and_shape_lifts_it() -> None:
    comp = gradzip.create("qsgd", s=4, packing="entropy")
    x = torch.zeros(1 << 16)
    x[7] = 1.0  # a stream of almost only zeros: a few bytes for 65536 elements
    payload = comp.encode(x, hp.KEY).payload
    with pytest.raises(PayloadError, match=r"UNVOUCHED_CODED_ELEMENTS_PER_BYTE.*shape="):
        comp.decode(payload)
    assert torch.equal(comp.decode(payload, shape=x.shape), x)
