"""Sizes and checks of the fixed-width packed symbol layout, shared by the codecs and kernels.

The layout itself (``n`` symbols of ``b`` bits as one little-endian, LSB-first bit stream of
``ceil(n*b/8)`` bytes, zero padding bits) is described in :mod:`gradzip.codecs.bitpack`. These
few functions live here, below the codecs, so that the fused kernels can size and validate a
stream without importing the codec layer (which itself uses kernels).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gradzip.errors import CorruptPayloadError, TruncatedPayloadError


def packed_bytes(n: int, bits: int) -> int:
    """Bytes taken by ``n`` symbols of ``bits`` bits."""
    return (n * bits + 7) // 8


def check_bits(bits: int) -> None:
    """Reject a bit width outside ``[1, 32]``."""
    if not 1 <= bits <= 32:
        raise ValueError(f"bit width must lie in [1, 32], got {bits}")


def symbol_bits(alphabet_size: int) -> int:
    """``ceil(log2 L)``: bits per symbol in the fixed-width packing (at least 1)."""
    if alphabet_size < 1:
        raise ValueError(f"alphabet size must be >= 1, got {alphabet_size}")
    return max(1, (alphabet_size - 1).bit_length())


def check_packed(data: torch.Tensor, n: int, bits: int) -> None:
    """Reject a packed stream of ``n`` symbols of ``bits`` bits whose length is wrong
    (:class:`TruncatedPayloadError`, :class:`CorruptPayloadError`) or whose padding bits are set
    (:class:`CorruptPayloadError`)."""
    check_bits(bits)
    check_packed_size(data.numel(), lambda: int(data[-1]), n, bits)


def check_packed_size(size: int, last_byte: Callable[[], int], n: int, bits: int) -> None:
    """:func:`check_packed` of a stream of ``size`` bytes whose last byte ``last_byte()`` reads
    (called only when the length is right and the last byte has padding bits), for callers
    that hold the bytes as something other than a tensor; the same errors and messages."""
    expected = packed_bytes(n, bits)
    if size < expected:
        raise TruncatedPayloadError(
            f"packed symbol stream has {size} bytes; {n} symbols of {bits} bits need {expected}"
        )
    if size > expected:
        raise CorruptPayloadError(
            f"packed symbol stream has {size} bytes; {n} symbols of {bits} bits take {expected}"
        )
    tail_bits = (n * bits) % 8
    if tail_bits and last_byte() >> tail_bits:
        raise CorruptPayloadError("packed symbol stream has non-zero padding bits")
