"""Dense (radix) packing: layout against a big-integer reference, size formula, validation."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from gradzip.codecs.radix import pack_radix, radix_group, radix_packed_bytes, unpack_radix
from gradzip.codecs.symbols import pack_symbols, packed_symbol_bits, unpack_symbols
from gradzip.errors import CorruptPayloadError, PayloadError, TruncatedPayloadError

ALPHABETS = [1, 2, 3, 4, 5, 7, 9, 17, 100, 255, 256, 257, 1000, 4097, 33145, 65535, 65536]


def _planes(words: list[int], w: int) -> bytes:
    """Reference layout: limb i (32 bits, the last one w mod 32) of every word as its own
    LSB-first bit plane."""
    out = b""
    for i in range(-(-w // 32)):
        b = min(32, w - 32 * i)
        acc = 0
        for j, word in enumerate(words):
            acc |= ((word >> (32 * i)) & ((1 << b) - 1)) << (j * b)
        out += acc.to_bytes((len(words) * b + 7) // 8, "little")
    return out


def _reference(values: list[int], L: int) -> bytes:
    k, w = radix_group(L)
    groups, r = divmod(len(values), k)
    full = [sum(d * L**j for j, d in enumerate(values[g * k : g * k + k])) for g in range(groups)]
    out = _planes(full, w) if groups and w else b""
    if r and w:
        tail = sum(d * L**j for j, d in enumerate(values[groups * k :]))
        out += _planes([tail], (L**r - 1).bit_length())
    return out


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[int], int]:
    L = draw(st.one_of(st.sampled_from(ALPHABETS), st.integers(min_value=1, max_value=300)))
    value = st.integers(min_value=0, max_value=L - 1)
    kind = draw(st.sampled_from(["any", "equal", "max"]))
    n = draw(st.integers(min_value=0, max_value=90))
    if kind == "any":
        return draw(st.lists(value, min_size=n, max_size=n)), L
    fill = L - 1 if kind == "max" else draw(value)
    return [fill] * n, L


@given(streams(), st.sampled_from([torch.int64, torch.int32]))
def test_round_trip_matches_reference_layout(
    stream: tuple[list[int], int], dtype: torch.dtype
) -> None:
    values, L = stream
    symbols = torch.tensor(values, dtype=dtype)
    packed = pack_radix(symbols, L)
    assert packed.dtype == torch.uint8
    assert packed.numel() == radix_packed_bytes(len(values), L)
    assert bytes(packed.numpy().tobytes()) == _reference(values, L)
    out = unpack_radix(packed, len(values), L)
    assert out.dtype == (torch.uint8 if L <= 256 else torch.int32)
    assert out.tolist() == values
    assert symbols.tolist() == values  # the input is not modified


def test_group_choices_documented_examples() -> None:
    assert radix_group(3) == (5, 8)  # 5 ternary symbols per byte
    assert radix_group(5) == (3, 7)  # 3 five-level symbols in 7 bits
    assert radix_group(257) == (12, 97)
    for b in range(1, 17):
        assert radix_group(2**b) == (1, b)


@pytest.mark.parametrize("L", [*range(2, 301), 1000, 4097, 8193, 32769, 33145, 65535, 65536])
def test_size_formula_within_one_percent(L: int) -> None:
    k, w = radix_group(L)
    assert L**k <= 2**w
    n = 10**7
    bits = 8 * radix_packed_bytes(n, L)
    assert n * math.log2(L) <= bits <= 1.01 * n * math.log2(L)
    assert radix_packed_bytes(n + 1, L) >= radix_packed_bytes(n, L)


@pytest.mark.parametrize("L", [2, 3, 5, 6, 17, 33, 255, 257, 4097, 65536])
def test_large_streams_round_trip(L: int) -> None:
    gen = torch.Generator().manual_seed(L)
    symbols = torch.randint(0, L, (100_003,), generator=gen)
    symbols[:5] = L - 1
    packed = pack_radix(symbols, L)
    assert packed.numel() == radix_packed_bytes(symbols.numel(), L)
    assert torch.equal(unpack_radix(packed, symbols.numel(), L).long(), symbols)


@pytest.mark.parametrize("L", [3, 5, 17, 257, 65535])
def test_wrong_sizes_are_named(L: int) -> None:
    packed = pack_radix(torch.arange(40) % L, L)
    with pytest.raises(TruncatedPayloadError, match="dense"):
        unpack_radix(packed[:-1], 40, L)
    with pytest.raises(CorruptPayloadError, match="dense"):
        unpack_radix(torch.cat((packed, packed[:1])), 40, L)


@pytest.mark.parametrize("L", [3, 5, 7, 17, 257, 4097])
def test_group_word_out_of_range_is_corrupt(L: int) -> None:
    """Words of all ones (2**w - 1 >= L**k for these L) with clean padding: only the range
    check can reject them, for full groups and for the tail group."""
    k, w = radix_group(L)
    assert L**k < 2**w
    bad = torch.tensor(list(_planes([2**w - 1] * 3, w)), dtype=torch.uint8)
    with pytest.raises(CorruptPayloadError, match="group word"):
        unpack_radix(bad, 3 * k, L)
    w_tail = (L - 1).bit_length()
    tail = torch.tensor(list(_planes([2**w_tail - 1], w_tail)), dtype=torch.uint8)
    with pytest.raises(CorruptPayloadError, match="group word"):
        unpack_radix(tail, 1, L)


def test_dirty_padding_is_corrupt() -> None:
    packed = pack_radix(torch.tensor([1, 2, 0, 1, 2, 1]), 3)  # 5 symbols -> 1 byte, 1 -> 2 bits
    dirty = packed.clone()
    dirty[-1] |= 0x80
    with pytest.raises(PayloadError):
        unpack_radix(dirty, 6, 3)


def test_strided_and_2d_inputs() -> None:
    base = (torch.arange(1200) * 7919 % 5).view(40, 30)
    for symbols in (base[:, 3], base.t(), base[::2, ::3], base.to(torch.uint8)[:, 1]):
        flat = symbols.reshape(-1)
        packed = pack_radix(symbols, 5)
        assert torch.equal(unpack_radix(packed, flat.numel(), 5).long(), flat.long())


def test_bad_alphabet_and_dtype() -> None:
    with pytest.raises(ValueError):
        radix_packed_bytes(3, 65537)
    with pytest.raises(ValueError):
        pack_radix(torch.tensor([0]), 0)
    with pytest.raises(TypeError):
        unpack_radix(torch.zeros(1, dtype=torch.int32), 1, 3)


@pytest.mark.parametrize("L", [2, 3, 5, 11, 256, 257, 65536])
def test_symbols_dense_round_trip(L: int) -> None:
    symbols = (torch.arange(1001) * 7919) % L
    packed = pack_symbols(symbols, L, "dense")
    assert 8 * packed.numel() == packed_symbol_bits(1001, L, "dense")
    assert torch.equal(unpack_symbols(packed, 1001, L, "dense").long(), symbols)
