"""Fixed-width bit packing against a big-integer reference bit stream."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from gradzip.codecs.bitpack import pack_bits, packed_bytes, unpack_bits
from gradzip.codecs.symbols import (
    pack_symbols,
    packed_symbol_bits,
    symbol_bits,
    twos_complement_values,
    unpack_symbols,
)
from gradzip.errors import CorruptPayloadError, TruncatedPayloadError


def _reference_stream(values: list[int], bits: int) -> bytes:
    acc = 0
    for i, v in enumerate(values):
        acc |= v << (i * bits)
    return acc.to_bytes(packed_bytes(len(values), bits), "little")


@st.composite
def symbol_streams(draw: st.DrawFn) -> tuple[list[int], int]:
    bits = draw(st.integers(min_value=1, max_value=32))
    values = draw(st.lists(st.integers(min_value=0, max_value=2**bits - 1), max_size=70))
    return values, bits


@given(symbol_streams())
def test_pack_matches_lsb_first_reference_and_round_trips(stream: tuple[list[int], int]) -> None:
    values, bits = stream
    symbols = torch.tensor(values, dtype=torch.int64)
    packed = pack_bits(symbols, bits)
    assert packed.dtype == torch.uint8
    assert bytes(packed.numpy().tobytes()) == _reference_stream(values, bits)
    assert unpack_bits(packed, len(values), bits).tolist() == values


@pytest.mark.parametrize("bits", range(1, 33))
def test_every_width_matches_reference_on_random_streams(bits: int) -> None:
    gen = torch.Generator().manual_seed(bits)
    for n in (1, 7, 8, 9, 64, 1003):
        values = torch.randint(0, 2**bits, (n,), generator=gen, dtype=torch.int64)
        packed = pack_bits(values, bits)
        assert bytes(packed.numpy().tobytes()) == _reference_stream(values.tolist(), bits)
        assert torch.equal(unpack_bits(packed, n, bits).long(), values)


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 8, 11, 16, 17, 32])
def test_large_all_max_and_all_zero(bits: int) -> None:
    for fill in (0, 2**bits - 1):
        symbols = torch.full((100_003,), fill, dtype=torch.int64)
        out = unpack_bits(pack_bits(symbols, bits), symbols.numel(), bits)
        assert torch.equal(out.long(), symbols)


def test_wrong_lengths_and_padding_are_named() -> None:
    packed = pack_bits(torch.tensor([1, 2, 3]), 3)  # 9 bits -> 2 bytes
    with pytest.raises(TruncatedPayloadError):
        unpack_bits(packed[:1], 3, 3)
    with pytest.raises(CorruptPayloadError):
        unpack_bits(torch.cat((packed, packed[:1])), 3, 3)
    dirty = packed.clone()
    dirty[-1] |= 0x80
    with pytest.raises(CorruptPayloadError, match="padding"):
        unpack_bits(dirty, 3, 3)
    with pytest.raises(ValueError):
        pack_bits(torch.tensor([1]), 33)


def test_symbol_helpers_fixed_packing() -> None:
    assert [symbol_bits(L) for L in (1, 2, 3, 4, 5, 255, 256, 257)] == [1, 1, 2, 2, 3, 8, 8, 9]
    symbols = torch.randint(0, 5, (1001,), generator=torch.Generator().manual_seed(0))
    packed = pack_symbols(symbols, 5, "fixed")
    assert packed.numel() * 8 == packed_symbol_bits(1001, 5, "fixed")
    assert torch.equal(unpack_symbols(packed, 1001, 5, "fixed").long(), symbols)


@pytest.mark.parametrize("bits", [2, 3, 7, 8, 9, 16, 24])
def test_twos_complement_values_round_trips_every_code(bits: int) -> None:
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1)
    values = torch.arange(low, high, max(1, (high - low) // 4096), dtype=torch.int64)
    values = torch.cat([values, torch.tensor([low, -1, 0, high - 1])])
    codes = values & (2**bits - 1)
    symbols = codes.to(torch.uint8) if bits <= 8 else codes.to(torch.int32)
    assert torch.equal(twos_complement_values(symbols, bits).to(torch.int64), values)
