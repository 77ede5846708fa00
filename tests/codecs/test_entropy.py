"""Entropy coding: round trips, size against the empirical entropy, corruption handling."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from gradzip.codecs.entropy import entropy_decode, entropy_encode, group_size, model_size
from gradzip.codecs.symbols import pack_symbols, packed_symbol_bits, unpack_symbols
from gradzip.errors import CorruptPayloadError, PayloadError, TruncatedPayloadError

ALPHABETS = [1, 2, 3, 4, 5, 9, 10, 17, 90, 91, 255, 256, 257, 1000, 65535, 65536]

DISTRIBUTIONS = {
    "ternary P(0)=0.9": [0.05, 0.9, 0.05],
    "5-level peaked": [0.02, 0.1, 0.76, 0.1, 0.02],
    "9-level peaked": [0.001, 0.01, 0.05, 0.2, 0.478, 0.2, 0.05, 0.01, 0.001],
    "ternary near-uniform": [0.3, 0.36, 0.34],
    "binary P(1)=0.3": [0.7, 0.3],
    "17-level near-uniform": [1 / 17] * 17,
    "ternary P(0)=0.99": [0.005, 0.99, 0.005],
}


def _entropy_bits(symbols: np.ndarray) -> float:
    counts = np.bincount(symbols)
    p = counts[counts > 0] / symbols.size
    return float(-(p * np.log2(p)).sum() * symbols.size)


def _round_trip(values: list[int] | np.ndarray, L: int) -> torch.Tensor:
    symbols = torch.as_tensor(np.asarray(values, dtype=np.int64))
    data = entropy_encode(symbols, L)
    assert data.dtype == torch.uint8 and data.dim() == 1
    out = entropy_decode(data, symbols.numel(), L)
    assert out.dtype == (torch.uint8 if L <= 256 else torch.int32)
    assert torch.equal(out.long(), symbols)
    return data


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[int], int]:
    L = draw(st.sampled_from(ALPHABETS))
    n = draw(st.integers(min_value=0, max_value=200))
    kind = draw(st.sampled_from(["any", "equal", "max", "skewed", "two"]))
    value = st.integers(min_value=0, max_value=L - 1)
    if kind == "any":
        return draw(st.lists(value, min_size=n, max_size=n)), L
    if kind in ("equal", "max"):
        return [L - 1 if kind == "max" else draw(value)] * n, L
    common, rare = draw(value), draw(value)
    rare_at = draw(st.sets(st.integers(min_value=0, max_value=max(n - 1, 0)), max_size=5))
    values = [rare if i in rare_at else common for i in range(n)]
    if kind == "two" and n:
        values[-1] = L - 1
    return values, L


@given(streams())
def test_round_trip(stream: tuple[list[int], int]) -> None:
    values, L = stream
    data = _round_trip(values, L)
    if not values:
        assert data.numel() == 0


@pytest.mark.parametrize("L", [2, 3, 5, 256, 65536])
@pytest.mark.parametrize("n", [1, 2, 7, 8, 9, 1000, 100_003])
def test_edge_streams(L: int, n: int) -> None:
    _round_trip(np.zeros(n), L)
    _round_trip(np.full(n, L - 1), L)
    alternating = np.zeros(n, dtype=np.int64)
    alternating[::2] = L - 1  # the symbols in between are unused
    _round_trip(alternating, L)


def test_all_equal_stream_is_only_a_model() -> None:
    data = _round_trip(np.full(1_000_000, 4), 9)
    assert data.numel() == 2  # lo, span
    assert model_size(data, 1_000_000, 9) == 2


def test_group_sizes() -> None:
    assert [group_size(u) for u in (2, 3, 4, 5, 9, 10, 90, 91, 65536)] == [
        8,
        8,
        4,
        4,
        4,
        2,
        2,
        1,
        1,
    ]


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_size_within_two_percent_of_entropy(name: str) -> None:
    probs = DISTRIBUTIONS[name]
    symbols = np.random.default_rng(7).choice(len(probs), size=100_000, p=probs)
    data = _round_trip(symbols, len(probs))
    assert data.numel() <= 1.02 * _entropy_bits(symbols) / 8


@pytest.mark.parametrize("n", [100_000, 1_000_000])
def test_very_low_entropy_within_two_percent_of_entropy_plus_model(n: int) -> None:
    symbols = np.random.default_rng(11).choice(3, size=n, p=[0.0005, 0.999, 0.0005])
    data = _round_trip(symbols, 3)
    model = model_size(data, n, 3)
    assert model <= 10
    assert data.numel() <= 1.02 * (_entropy_bits(symbols) / 8 + model)


def test_low_entropy_choices_cut_the_overhead() -> None:
    """Smaller groups and the mode as digit 0 (module docstring): mean overhead over n*H/8 plus
    the model is about 2 bytes; without either choice it is about 3."""
    overheads = []
    for seed in range(12):
        symbols = np.random.default_rng(seed).choice(3, size=100_000, p=[0.0005, 0.999, 0.0005])
        data = _round_trip(symbols, 3)
        model = model_size(data, symbols.size, 3)
        overheads.append(data.numel() - model - _entropy_bits(symbols) / 8)
    assert np.mean(overheads) <= 2.5


VERY_SKEWED = {
    "ternary P(0)=0.98": [0.01, 0.98, 0.01],
    "ternary P(0)=0.9999": [0.00005, 0.9999, 0.00005],
    "5-level P(0)=0.995": [0.001, 0.0015, 0.995, 0.0015, 0.001],
}


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS) + sorted(VERY_SKEWED))
def test_documented_absolute_bound(name: str) -> None:
    """bytes <= model + 1.001 * n*H/8 + 4 (the module docstring's guarantee)."""
    probs = {**DISTRIBUTIONS, **VERY_SKEWED}[name]
    symbols = np.random.default_rng(13).choice(len(probs), size=200_000, p=probs)
    data = _round_trip(symbols, len(probs))
    model = model_size(data, symbols.size, len(probs))
    assert data.numel() <= model + 1.001 * _entropy_bits(symbols) / 8 + 4


def test_large_alphabet_size() -> None:
    """16-bit symbols, a few thousand of them used: the model is a small part."""
    rng = np.random.default_rng(5)
    symbols = np.clip(rng.normal(32768, 300, size=200_000).round(), 0, 65535).astype(np.int64)
    data = _round_trip(symbols, 65536)
    assert data.numel() <= 1.02 * (_entropy_bits(symbols) / 8 + model_size(data, 200_000, 65536))
    assert data.numel() <= 1.05 * _entropy_bits(symbols) / 8


def _sample_stream() -> tuple[torch.Tensor, int]:
    symbols = np.random.default_rng(3).choice(5, size=3001, p=[0.02, 0.1, 0.76, 0.1, 0.02])
    return entropy_encode(torch.as_tensor(symbols), 5), symbols.size


def test_every_truncation_raises() -> None:
    data, n = _sample_stream()
    for cut in range(data.numel()):
        with pytest.raises(PayloadError):
            entropy_decode(data[:cut], n, 5)
    with pytest.raises(TruncatedPayloadError):
        entropy_decode(data[:0], n, 5)
    with pytest.raises(TruncatedPayloadError):
        entropy_decode(data[:3], n, 5)


def test_extra_bytes_and_wrong_count_raise() -> None:
    data, n = _sample_stream()
    with pytest.raises(CorruptPayloadError):
        entropy_decode(torch.cat((data, torch.tensor([7], dtype=torch.uint8))), n, 5)
    with pytest.raises(CorruptPayloadError):
        entropy_decode(torch.cat((data, torch.tensor([0], dtype=torch.uint8))), n, 5)
    for wrong in (n - 1, n + 1, 2 * n, 1):
        with pytest.raises(PayloadError):
            entropy_decode(data, wrong, 5)
    with pytest.raises(CorruptPayloadError):
        entropy_decode(data, n, 3)  # the model names symbols beyond the alphabet
    with pytest.raises(CorruptPayloadError):
        entropy_decode(torch.tensor([1], dtype=torch.uint8), 0, 5)


def test_random_corruption_never_crashes() -> None:
    data, n = _sample_stream()
    gen = np.random.default_rng(0)
    caught = 0
    for _ in range(300):
        bad = data.clone()
        at = int(gen.integers(0, data.numel()))
        bad[at] ^= int(gen.integers(1, 256))
        try:
            out = entropy_decode(bad, n, 5)
        except PayloadError:
            caught += 1
        else:  # a flip the checks cannot see must still give n legal symbols
            assert out.numel() == n and int(out.max()) < 5
    assert caught >= 290


def test_malformed_models_are_named() -> None:
    def u8(*values: int) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.uint8)

    with pytest.raises(CorruptPayloadError, match="outside"):
        entropy_decode(u8(5, 0), 4, 5)  # lo = 5 >= L
    with pytest.raises(CorruptPayloadError, match="outside"):
        entropy_decode(u8(1, 4), 4, 5)  # hi = 5 >= L
    with pytest.raises(CorruptPayloadError, match="overlong"):
        entropy_decode(u8(0x80, 0x00, 0), 4, 5)
    with pytest.raises(CorruptPayloadError, match="after its model"):
        entropy_decode(u8(1, 0, 9), 4, 5)
    with pytest.raises(CorruptPayloadError, match="mode"):
        entropy_decode(u8(0, 1, 2, 1), 4, 5)  # mode offset 2 > span 1
    with pytest.raises(CorruptPayloadError, match="exceed"):
        entropy_decode(u8(0, 1, 0, 9), 4, 5)  # a count above n
    with pytest.raises(CorruptPayloadError, match="canonical"):
        entropy_decode(u8(0, 1, 1, 0), 4, 5)  # symbol 0 unused
    with pytest.raises(CorruptPayloadError, match="canonical"):
        entropy_decode(u8(0, 1, 0, 3), 4, 5)  # the implied mode count 1 < 3
    with pytest.raises(CorruptPayloadError, match="zero byte"):
        entropy_decode(u8(0, 1, 0, 1, 5, 0), 4, 5)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        entropy_encode(torch.tensor([3]), 3)
    with pytest.raises(ValueError):
        entropy_encode(torch.tensor([-1]), 3)
    with pytest.raises(ValueError):
        entropy_encode(torch.tensor([0]), 65537)
    with pytest.raises(TypeError):
        entropy_decode(torch.zeros(2, dtype=torch.int32), 1, 3)
    with pytest.raises(TypeError):
        entropy_encode(torch.zeros(2), 3)


def test_strided_and_2d_inputs() -> None:
    base = torch.as_tensor(np.random.default_rng(1).integers(0, 5, size=(40, 30)))
    for symbols in (base[:, 3], base.t(), base[::2, ::3]):
        data = entropy_encode(symbols, 5)
        flat = symbols.reshape(-1)
        assert torch.equal(entropy_decode(data, flat.numel(), 5).long(), flat)


@pytest.mark.parametrize("L", [2, 3, 5, 255, 65536])
def test_symbols_entropy_round_trip(L: int) -> None:
    symbols = torch.as_tensor(np.random.default_rng(L).integers(0, min(L, 7), size=1001))
    assert packed_symbol_bits(1001, L, "entropy") is None
    packed = pack_symbols(symbols, L, "entropy")
    assert torch.equal(unpack_symbols(packed, 1001, L, "entropy").long(), symbols)


def test_ten_byte_varint_is_rejected() -> None:
    """Nine 7-bit groups cover every count; a tenth byte could only overflow."""
    ten = [0x81] * 9 + [0x01]
    with pytest.raises(CorruptPayloadError, match="overlong"):
        entropy_decode(torch.tensor([*ten, 0], dtype=torch.uint8), 4, 5)
