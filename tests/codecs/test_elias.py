"""Elias gamma/delta codes: bit lengths, exact bit patterns, round trips and bad streams."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from gradzip.codecs import elias
from gradzip.errors import CorruptPayloadError, PayloadError, TruncatedPayloadError

values = st.lists(
    st.one_of(st.integers(1, 16), st.integers(1, 2**62), st.sampled_from([1, 2**62, 2**63 - 1])),
    max_size=60,
)


def test_bit_lengths_match_elias() -> None:
    v = np.array([1, 2, 3, 4, 7, 8, 16, 2**62])
    assert elias.gamma_bits(v).tolist() == [1, 3, 3, 5, 5, 7, 9, 125]
    # delta: L - 1 + 2*floor(log2 L) + 1 with L = bit length
    assert elias.delta_bits(v).tolist() == [1, 4, 4, 5, 5, 8, 9, 62 + 2 * 5 + 1]


def test_exact_bit_patterns() -> None:
    # gamma(1) = "1"; gamma(2) = "0 1 0"; gamma(3) = "0 1 1"; LSB-first in one byte
    assert elias.encode_gamma(np.array([1])).tolist() == [0b1]
    assert elias.encode_gamma(np.array([2])).tolist() == [0b010]
    assert elias.encode_gamma(np.array([3])).tolist() == [0b110]
    # 1 then 3: "1" + "011" -> bits 1,0,1,1 -> 0b1101
    assert elias.encode_gamma(np.array([1, 3])).tolist() == [0b1101]
    # delta(4): L = 3 -> gamma(3) = 0 1 1, then the 2 low bits of 4 (0, 0)
    assert elias.encode_delta(np.array([4])).tolist() == [0b00110]


@given(values)
def test_gamma_round_trip(xs: list[int]) -> None:
    v = np.array(xs, dtype=np.int64)
    data = elias.encode_gamma(v)
    assert data.dtype == torch.uint8
    assert data.numel() == -(-int(elias.gamma_bits(v).sum()) // 8)
    assert elias.decode_gamma(data, len(xs)).tolist() == xs


@given(values)
def test_delta_round_trip(xs: list[int]) -> None:
    v = torch.tensor(xs, dtype=torch.int64)
    data = elias.encode_delta(v)
    assert data.numel() == -(-int(elias.delta_bits(v).sum()) // 8)
    assert elias.decode_delta(data, len(xs)).tolist() == xs


@given(st.lists(st.tuples(st.integers(1, 2**40), st.integers(0, 1), st.integers(1, 300))))
def test_interleaved_records_round_trip(rows: list[tuple[int, int, int]]) -> None:
    cols = [np.array([r[i] for r in rows], dtype=np.int64) for i in range(3)]
    kinds = ("delta", "bit", "gamma")
    columns = list(zip(kinds, cols, strict=True))
    data = elias.encode_records(columns)
    assert data.numel() == -(-elias.record_bits(columns) // 8)
    out = elias.decode_records(data, len(rows), kinds)
    for got, want in zip(out, cols, strict=True):
        assert got.tolist() == want.tolist()


def test_empty_streams() -> None:
    assert elias.encode_gamma(np.array([], dtype=np.int64)).numel() == 0
    assert elias.decode_delta(torch.empty(0, dtype=torch.uint8), 0).numel() == 0
    with pytest.raises(CorruptPayloadError, match="extra bytes"):
        elias.decode_gamma(torch.zeros(1, dtype=torch.uint8), 0)
    with pytest.raises(TruncatedPayloadError, match="empty"):
        elias.decode_gamma(torch.empty(0, dtype=torch.uint8), 3)


def test_invalid_values_are_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        elias.encode_gamma(np.array([3, 0]))
    with pytest.raises(ValueError, match="positive"):
        elias.delta_bits(np.array([-1]))
    with pytest.raises(ValueError, match="bit"):
        elias.encode_records([("bit", np.array([2]))])
    with pytest.raises(ValueError, match="kind"):
        elias.encode_records([("omega", np.array([2]))])


def test_truncated_extra_and_padding_errors() -> None:
    v = np.array([1000, 3, 2**50, 7])
    for encode, decode in (
        (elias.encode_gamma, elias.decode_gamma),
        (elias.encode_delta, elias.decode_delta),
    ):
        data = encode(v)
        for cut in range(data.numel()):
            with pytest.raises(TruncatedPayloadError):
                decode(data[:cut], 4)
        with pytest.raises(TruncatedPayloadError):
            decode(data, 5)  # one more value than the stream holds
        longer = torch.cat((data, torch.zeros(1, dtype=torch.uint8)))
        with pytest.raises(CorruptPayloadError, match="extra"):
            decode(longer, 4)
    data = elias.encode_gamma(np.array([1]))  # 1 bit used, 7 padding bits
    with pytest.raises(CorruptPayloadError, match="padding"):
        elias.decode_gamma(data | 0x80, 1)


def test_impossible_codes_are_corrupt() -> None:
    # 64 zero bits then a one: a gamma code of a value >= 2**64
    data = torch.zeros(17, dtype=torch.uint8)
    data[8] = 1
    with pytest.raises(CorruptPayloadError, match="impossible"):
        elias.decode_gamma(data, 1)
    # delta with L >= 64 (6 zero bits before the length's leading one)
    data = torch.tensor([0b0100_0000, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF],
                        dtype=torch.uint8)  # fmt: skip
    with pytest.raises(CorruptPayloadError, match="impossible"):
        elias.decode_delta(data, 1)


@given(st.binary(max_size=40), st.integers(0, 80))
def test_garbage_never_crashes(raw: bytes, count: int) -> None:
    data = torch.tensor(list(raw), dtype=torch.uint8)
    for decode in (elias.decode_gamma, elias.decode_delta):
        try:
            out = decode(data, count)
        except PayloadError:
            continue
        assert out.numel() == count and bool((out >= 1).all())


def test_long_streams_use_the_blocked_walk() -> None:
    """More than 32768 records: the decoder jumps K = 2**R records at a time (R > 0)."""
    rng = np.random.default_rng(0)
    for count in (32768, 70001, 300000):
        v = rng.geometric(0.3, size=count).astype(np.int64)
        v[::997] = 2**40 + 17
        for encode, decode in (
            (elias.encode_gamma, elias.decode_gamma),
            (elias.encode_delta, elias.decode_delta),
        ):
            data = encode(v)
            assert np.array_equal(decode(data, count).numpy(), v)
            with pytest.raises(TruncatedPayloadError):
                decode(data, count + 1)
        cols = [("delta", v), ("bit", v & 1), ("gamma", v[::-1].copy())]
        out = elias.decode_records(elias.encode_records(cols), count, ("delta", "bit", "gamma"))
        for got, (_, want) in zip(out, cols, strict=True):
            assert np.array_equal(got.numpy(), want)
