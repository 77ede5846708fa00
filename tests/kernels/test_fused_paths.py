"""Specialised paths of the fused kernels: the decoders' unpack (2 bits, 3 bits, other widths
up to 8, the partial group at the end of a stream) and once-per-tile alphabet check, and the
encoder's multiply-shift reduction modulo k."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from gradzip.codecs.bitpack import pack_bits
from gradzip.errors import CorruptPayloadError
from gradzip.kernels.dithered import (
    _quantize_fast_mod,
    _reduce_mod,
    fused_decode_affine,
    fused_decode_nested,
    inverse_rounded_up,
)

#: alphabets one short of a power of two, so the all-ones symbol of each width is invalid
WIDTHS = {2: 3, 3: 7, 5: 31, 8: 255}


def _affine(data: torch.Tensor, n: int, alphabet: int) -> torch.Tensor:
    scales = torch.tensor([2.0])
    return fused_decode_affine(data, n, alphabet, scales, 0, 4.0, 0.5, False, 1, 0, False, "t")


@pytest.mark.parametrize("bits", sorted(WIDTHS))
@pytest.mark.parametrize("n", [5, 1003, 4099, 8195])
def test_undithered_decode_unpacks_every_position(bits: int, n: int) -> None:
    alphabet = WIDTHS[bits]
    gen = torch.Generator().manual_seed(bits * n)
    s = torch.randint(0, alphabet, (n,), generator=gen, dtype=torch.int64)
    out = _affine(pack_bits(s, bits), n, alphabet)
    step = np.float32(2.0 / 4.0)
    expected = (s.numpy().astype(np.float32) + np.float32(0.5)) * step
    assert np.array_equal(out.numpy(), expected)


@pytest.mark.parametrize("bits", sorted(WIDTHS))
@pytest.mark.parametrize(("n", "where"), [(1003, 0), (1003, 517), (1003, 1002), (8195, 4096)])
def test_a_symbol_outside_the_alphabet_is_rejected_wherever_it_lies(
    bits: int, n: int, where: int
) -> None:
    alphabet = WIDTHS[bits]
    s = torch.zeros(n, dtype=torch.int64)
    data = pack_bits(s, bits)
    _affine(data, n, alphabet)  # all valid: accepted
    s[where] = alphabet  # the all-ones symbol of the width
    with pytest.raises(CorruptPayloadError, match="alphabet"):
        _affine(pack_bits(s, bits), n, alphabet)
    y = torch.zeros(n)
    with pytest.raises(CorruptPayloadError, match="alphabet"):
        fused_decode_nested(
            pack_bits(s, bits),
            n,
            alphabet,
            torch.tensor([1.0]),
            0,
            1.0,
            0.1,
            1.0,
            1,
            0,
            y,
            "t",
        )


def test_multiply_shift_modulo_equals_the_remainder_for_every_byte() -> None:
    from numba import njit

    @njit
    def reduce(values, k, narrow):  # type: ignore[no-untyped-def]
        _reduce_mod(values, k, narrow)

    t = np.arange(256, dtype=np.uint8)
    for k in [*range(1, 300), 65535, 2**24 - 1]:
        fast = t.copy()
        reduce(fast, k, True)
        assert np.array_equal(fast, t.astype(np.int64) % k), k
    wide = np.arange(70000, dtype=np.int32)
    reduce(wide, 301, False)
    assert np.array_equal(wide, np.arange(70000) % 301)


def test_float32_modulo_of_the_fast_quantizer_equals_the_integer_remainder() -> None:
    """Every truncated value 0..255 (and values just below each integer) against every k."""
    from numba import njit

    @njit
    def quantize(v, k, inv_k, out):  # type: ignore[no-untyped-def]
        zeros = np.zeros(v.size, dtype=np.float32)
        _quantize_fast_mod(
            v, zeros, np.float32(1.0), np.float32(0.0), 255, np.float32(k), inv_k, out
        )

    q = np.arange(256, dtype=np.float32)
    below = np.nextafter(q[1:], np.float32(0.0))  # truncates to q - 1
    v = np.concatenate([q, below, np.float32([300.0, 255.9])])
    expected = np.minimum(np.floor(v), 255).astype(np.int64)
    for k in range(1, 300):
        out = np.empty(v.size, dtype=np.uint8)
        quantize(v, k, np.float32(inverse_rounded_up(k)), out)
        assert np.array_equal(out, expected % k), k


def test_nested_decoder_reports_a_non_finite_output_and_the_side_informations_maximum() -> None:
    """The kernel flags a tile decoding to Inf and reads ``max|y|`` (Inf for a NaN)."""
    n = 3 * 4096 + 8
    data = pack_bits(torch.full((n,), 2, dtype=torch.int64), 2)
    y = torch.zeros(n)
    y[4100] = -7.5
    big = torch.full((-(-n // 512),), 3.4e38)

    def nested(scales: torch.Tensor, step_factor: float, side: torch.Tensor) -> Any:
        consts = (3.0, step_factor, 0.5, 5, 0)
        return fused_decode_nested(data, n, 3, scales, 512, *consts, side, "t")

    overflow = nested(big, 10.0, y)
    assert overflow.nonfinite and not bool(torch.isfinite(overflow.values).all())
    ones = torch.ones_like(big)
    fine = nested(ones, 1 / 3, y)
    assert not fine.nonfinite and fine.ymax == 7.5
    y[9] = float("nan")
    assert nested(ones, 1 / 3, y).ymax == float("inf")
