"""Delta + Golomb-Rice coding (spec 5.5): round trips, the exact bit formula, bad streams."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gradzip.codecs.golomb_rice import auto_k, rice_bits, rice_decode, rice_encode
from gradzip.compressors._groups import decode_entries, encode_entries, entry_bits
from gradzip.errors import CorruptPayloadError, PayloadError, TruncatedPayloadError


def reference_bits(values: list[int], k: int) -> str:
    """The spec's bit string, written out one value at a time (LSB-first remainder)."""
    out = []
    for v in values:
        q, r = v >> k, v & ((1 << k) - 1)
        out.append("1" * q + "0" + "".join(str((r >> b) & 1) for b in range(k)))
    return "".join(out)


def stream_bits(words: np.ndarray) -> str:
    return "".join(str(b) for b in np.unpackbits(words.view(np.uint8), bitorder="little"))


@pytest.mark.parametrize("k", [0, 1, 4, 7, 31])
def test_bit_layout_matches_the_spec(k: int) -> None:
    values = [0, 1, 5, 16, 17, 100, 3, 2**20 + 7]
    values = [v for v in values if (v >> k) < 5000]
    words = rice_encode(np.array(values, dtype=np.int64), k)
    expected = reference_bits(values, k)
    bits = stream_bits(words)
    assert bits[: len(expected)] == expected
    assert set(bits[len(expected) :]) <= {"1"} and len(bits) - len(expected) < 32
    assert words.size * 32 == rice_bits(np.array(values, dtype=np.int64), k)


def test_empty_list_is_one_all_ones_word() -> None:
    words = rice_encode(np.empty(0, dtype=np.int64), 4)
    assert words.tolist() == [0xFFFFFFFF]
    assert rice_decode(words, 4).size == 0
    assert rice_bits(np.empty(0, dtype=np.int64), 4) == 32


@pytest.mark.parametrize("k", [0, 2, 4, 9, "auto"])
@pytest.mark.parametrize("density", [0.0005, 0.03, 0.5, 1.0])
def test_sparse_round_trip_random_sets(k: int | str, density: float) -> None:
    rng = np.random.default_rng(7)
    numel = 20_000
    for trial in range(4):
        mask = rng.random(numel) < density
        if trial == 0:
            mask[0] = True  # first index 0: delta = 0 first
        if trial == 1:
            mask[1:-1] = False  # one huge gap: quotient far above 32
            mask[-1] = True
        idx = torch.from_numpy(np.flatnonzero(mask))
        sign = torch.from_numpy(rng.random(idx.numel()) < 0.5)
        words = encode_entries(idx, sign, "golomb_rice", k)
        assert 32 * words.size == entry_bits(idx, sign, "golomb_rice", k)
        got_idx, got_sign = decode_entries(memoryview(words).cast("B"), numel, "golomb_rice", k)
        assert torch.equal(got_idx, idx) and torch.equal(got_sign, sign)


def test_huge_quotients_and_exact_bit_formula() -> None:
    values = np.array([0, 2**16, 1, 40 * 16 + 3, 2**12], dtype=np.int64)
    for k in (0, 4):
        words = rice_encode(values, k)
        assert ((values >> k) >= 32).any()
        total = int(sum((int(v) >> k) + 1 + k for v in values))
        assert 32 * words.size == 32 * math.ceil(total / 32) == rice_bits(values, k)
        assert rice_decode(words, k).tolist() == values.tolist()


def test_auto_k_rule() -> None:
    values = np.full(10, 100, dtype=np.int64)
    # ln2 * 100 = 69.3; log2 = 6.11 -> 6
    assert auto_k(values) == 6
    assert auto_k(np.array([0, 1], dtype=np.int64)) == 0
    assert auto_k(np.empty(0, dtype=np.int64)) == 0
    rng = np.random.default_rng(1)
    for _ in range(200):
        v = rng.integers(0, 2 ** rng.integers(1, 40), size=rng.integers(1, 30))
        expected = max(0, math.floor(math.log2(math.log(2) * v.mean()) + 0.5)) if v.any() else 0
        assert auto_k(v) == min(31, expected)


def test_uint32_entry_format() -> None:
    idx = torch.tensor([0, 3, 2**31 - 1])
    sign = torch.tensor([True, False, True])
    words = encode_entries(idx, sign, "uint32", 4)
    assert words.tolist() == [1, 6, 2**32 - 1]
    with pytest.raises(ValueError, match="2\\*\\*31"):
        encode_entries(torch.tensor([2**31]), torch.tensor([True]), "uint32", 4)
    got = decode_entries(memoryview(words).cast("B"), 2**31, "uint32", 4)
    assert torch.equal(got[0], idx) and torch.equal(got[1], sign)


def test_bad_streams_raise_payload_errors() -> None:
    values = np.array([3, 70, 9, 1000], dtype=np.int64)
    words = rice_encode(values, 4)
    with pytest.raises(TruncatedPayloadError):
        rice_decode(words[:0], 4)
    with pytest.raises(CorruptPayloadError, match="padding"):
        rice_decode(np.concatenate((words, np.full(1, 0xFFFFFFFF, dtype=np.uint32))), 4)
    # a zero bit at the very end leaves no room for its remainder
    with pytest.raises(TruncatedPayloadError):
        rice_decode(np.array([0x7FFFFFFF], dtype=np.uint32), 4)
    all_ones = np.full(3, 0xFFFFFFFF, dtype=np.uint32)
    with pytest.raises(CorruptPayloadError):
        rice_decode(all_ones, 4)
    # duplicate indices (a zero gap after the first) and indices past the end are rejected
    dup = rice_encode(np.array([2, 0], dtype=np.int64), 4)
    with pytest.raises(CorruptPayloadError, match="repeats"):
        decode_entries(memoryview(dup).cast("B"), 10, "golomb_rice", 4)
    with pytest.raises(CorruptPayloadError):
        decode_entries(memoryview(words).cast("B"), 10, "golomb_rice", 4)
    with pytest.raises(CorruptPayloadError, match="K="):
        decode_entries(memoryview(np.array([40, 0], dtype=np.uint32)).cast("B"), 10,
                       "golomb_rice", "auto")  # fmt: skip
    unsorted = np.array([10, 4], dtype=np.uint32)
    with pytest.raises(CorruptPayloadError, match="increasing"):
        decode_entries(memoryview(unsorted).cast("B"), 10, "uint32", 4)


def test_random_garbage_never_crashes_or_hangs() -> None:
    rng = np.random.default_rng(3)
    for size in (1, 2, 5, 17, 64):
        for _ in range(50):
            words = rng.integers(0, 2**32, size=size, dtype=np.uint64).astype(np.uint32)
            words[rng.random(size) < 0.5] |= np.uint32(0xFFFF0000)
            for k in (0, 4, 12):
                try:
                    values = rice_decode(words, k)
                except PayloadError:
                    continue
                assert np.array_equal(rice_encode(values, k), words)
