"""Specialised paths of the fused kernels: the decoders' unpack (2 bits, 3 bits, other widths
up to 8, the partial group at the end of a stream) and once-per-tile alphabet check, and the
encoder's multiply-shift reduction modulo k."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradzip.codecs.bitpack import pack_bits
from gradzip.errors import CorruptPayloadError
from gradzip.kernels.dithered import _reduce_mod, fused_decode_affine, fused_decode_nested

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
            0.0,
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


def test_nested_decoder_checks_its_output_finite_per_tile_when_asked() -> None:
    """``check_finite``: a tile decoding to Inf raises; the values are otherwise unchanged."""
    n = 3 * 4096 + 8
    data = pack_bits(torch.full((n,), 2, dtype=torch.int64), 2)
    y = torch.zeros(n)
    big = torch.full((-(-n // 512),), 3.4e38)

    def nested(scales: torch.Tensor, step_factor: float, check: bool) -> torch.Tensor:
        consts = (3.0, step_factor, 0.5, 0.0, 5, 0)
        return fused_decode_nested(data, n, 3, scales, 512, *consts, y, "t", check_finite=check)

    assert not bool(torch.isfinite(nested(big, 10.0, False)).all())
    with pytest.raises(CorruptPayloadError, match="non-finite"):
        nested(big, 10.0, True)
    ones = torch.ones_like(big)
    assert torch.equal(nested(ones, 1 / 3, True), nested(ones, 1 / 3, False))
