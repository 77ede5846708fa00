"""The exact byte size of the Rice-coded index streams, against the formula written out here.

A Rice stream decodes whatever ``K`` it was written with (the ``K`` travels in a leading word),
so a wrong ``K`` still round-trips and only costs bytes: these tests pin the parameter to the
Golomb-optimal rule and the size to ``4 + 4 ceil(sum_j ((v_j >> K) + 1 + K) / 32)`` bytes,
both recomputed independently of :mod:`gradzip.codecs.golomb_rice`."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
import torch

import gradzip
from gradzip.compressors._groups import encode_entries, entry_bits
from gradzip.compressors._sparse_coding import parse_rice_indices, rice_indices
from gradzip.errors import CorruptPayloadError
from gradzip.keys import StreamKey
from gradzip.payload import parse_payload

KEY = StreamKey(run_seed=11, rank=1, step=4, tensor_index=2)


def golomb_k(values: list[int]) -> int:
    """``max(0, round_half_up(log2(ln 2 * mean)))`` (capped at 31), from the definition."""
    mean = sum(values) / len(values)
    if mean * math.log(2) <= 0:
        return 0
    return min(31, max(0, math.floor(math.log2(math.log(2) * mean) + 0.5)))


def stream_bytes(values: list[int], k: int) -> int:
    """A leading ``K`` word plus the code words: ``q + 1 + K`` bits a value, in whole words."""
    bits = sum((v >> k) + 1 + k for v in values)
    return 4 + 4 * max(1, -(-bits // 32))


def test_a_hand_computed_stream() -> None:
    # indices 0, 4, 9, 40: gaps 0, 3, 4, 30, mean 9.25; ln 2 * 9.25 = 6.41, log2 = 2.68: K = 3;
    # bits (0 + 4) + (0 + 4) + (0 + 4) + (3 + 4) = 19: the K word and one code word
    coded = rice_indices(np.array([0, 4, 9, 40], dtype=np.int64))
    assert struct.unpack_from("<I", coded)[0] == 3
    assert len(coded) == 8 == stream_bytes([0, 3, 4, 30], 3)


def test_topk_rice_indices_take_exactly_the_formula_s_bytes() -> None:
    """A 1%-dense top-k set of 20000 values: 200 gaps, whose code words a ``K`` one too
    large would lengthen by about 3%."""
    d, k = 20_000, 200
    x = torch.randn(d, generator=torch.Generator().manual_seed(8))
    idx = torch.sort(torch.topk(x.abs(), k).indices).values.tolist()
    gaps = [b - a - 1 for a, b in zip([-1, *idx[:-1]], idx, strict=True)]
    rice_k = golomb_k(gaps)
    assert rice_k == 6  # log2(ln 2 * ~99) = 6.1
    coded = rice_indices(np.array(idx, dtype=np.int64))
    assert struct.unpack_from("<I", coded)[0] == rice_k
    assert len(coded) == stream_bytes(gaps, rice_k)
    # in the payload: the float32 values, then exactly that stream
    comp = gradzip.create("topk", k=k, index_coding="rice")
    _, body = parse_payload(comp.encode(x, KEY).payload)
    assert len(body) == 4 * k + stream_bytes(gaps, rice_k)
    assert bytes(body[4 * k :]) == coded


def test_sparse_entries_with_auto_k_take_exactly_the_formula_s_bytes() -> None:
    """The entry streams of the threshold and adaptive compressors: ``(gap << 1) | sign`` with
    the first gap from 0, the ``K`` word, then the code words; ``entry_bits`` says the same."""
    gen = torch.Generator().manual_seed(3)
    idx = torch.sort(torch.randperm(50_000, generator=gen)[:400]).values
    sign = torch.rand(400, generator=gen) < 0.5
    flat = idx.tolist()
    values = [
        ((b - a) << 1) | int(s)
        for a, b, s in zip([0, *flat[:-1]], flat, sign.tolist(), strict=True)
    ]
    rice_k = golomb_k(values)
    words = encode_entries(idx, sign, "golomb_rice", "auto")
    assert int(words[0]) == rice_k
    assert 4 * words.size == stream_bytes(values, rice_k)
    assert entry_bits(idx, sign, "golomb_rice", "auto") == 32 * words.size


def test_a_k_word_beyond_31_is_refused_as_corrupt() -> None:
    """K = 31 is the largest parameter; the stream says which it used, so 32 is corruption."""
    words = np.array([0, 4, 9], dtype=np.int64)
    coded = bytearray(rice_indices(words))
    assert parse_rice_indices(memoryview(bytes(coded)), 3, 10, "topk").tolist() == [0, 4, 9]
    for k in (32, 33):
        struct.pack_into("<I", coded, 0, k)
        with pytest.raises(CorruptPayloadError, match=f"Rice parameter {k} > 31"):
            parse_rice_indices(memoryview(bytes(coded)), 3, 10, "topk")
