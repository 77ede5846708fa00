"""Turning a stream of quantizer symbols into bytes, three ways.

Every quantizer produces symbols in ``[0, L)`` (its index plus an offset) and lets the user pick
how they travel, with its ``packing`` parameter:

* ``"fixed"`` (default, spec 0.5): ``ceil(log2 L)`` bits per symbol (:mod:`.bitpack`).
  Bits: ``n*ceil(log2 L)``.
* ``"dense"``: radix packing of odd alphabets, several symbols per word (e.g. 5 ternary symbols
  per byte), within 1% of ``n*log2 L`` (:mod:`.radix`).
* ``"entropy"``: an ANS coder with the empirical symbol model carried in the payload
  (:mod:`.entropy`); within 2% of the empirical entropy on long streams.

The symbols always come last in a body, so the entropy-coded form needs no length prefix.
"""

from __future__ import annotations

from typing import Literal

import torch

from gradzip.choices import check_choice, choices_of
from gradzip.codecs.bitpack import pack_bits, unpack_bits
from gradzip.kernels.packed import packed_bytes
from gradzip.kernels.packed import symbol_bits as symbol_bits

#: how a compressor's symbols are laid out: whole bytes per symbol width, the densest radix
#: packing, or the entropy coder
Packing = Literal["fixed", "dense", "entropy"]
PACKINGS: tuple[Packing, ...] = choices_of(Packing)


def check_packing(packing: Packing) -> Packing:
    """Validate a ``packing`` parameter value."""
    return check_choice("packing", packing, PACKINGS)


def packed_symbol_bits(n: int, alphabet_size: int, packing: str) -> int | None:
    """Size in bits of ``n`` packed symbols (whole bytes), or None for the entropy coder."""
    if packing == "fixed":
        return 8 * packed_bytes(n, symbol_bits(alphabet_size))
    if packing == "dense":
        from gradzip.codecs.radix import radix_packed_bytes

        size: int = radix_packed_bytes(n, alphabet_size)
        return 8 * size
    return None


def pack_symbols(symbols: torch.Tensor, alphabet_size: int, packing: str) -> torch.Tensor:
    """Pack symbols in ``[0, alphabet_size)`` into a uint8 tensor."""
    if packing == "fixed":
        return pack_bits(symbols, symbol_bits(alphabet_size))
    if packing == "dense":
        from gradzip.codecs.radix import pack_radix

        out: torch.Tensor = pack_radix(symbols, alphabet_size)
        return out
    if packing == "entropy":
        from gradzip.codecs.entropy import entropy_encode

        coded: torch.Tensor = entropy_encode(symbols, alphabet_size)
        return coded
    raise ValueError(f"unknown packing {packing!r}")


def unpack_symbols(data: torch.Tensor, n: int, alphabet_size: int, packing: str) -> torch.Tensor:
    """Inverse of :func:`pack_symbols`; raises a PayloadError subclass on bad bytes."""
    if packing == "fixed":
        return unpack_bits(data, n, symbol_bits(alphabet_size))
    if packing == "dense":
        from gradzip.codecs.radix import unpack_radix

        out: torch.Tensor = unpack_radix(data, n, alphabet_size)
        return out
    if packing == "entropy":
        from gradzip.codecs.entropy import entropy_decode

        decoded: torch.Tensor = entropy_decode(data, n, alphabet_size)
        return decoded
    raise ValueError(f"unknown packing {packing!r}")


def twos_complement_values(symbols: torch.Tensor, bits: int) -> torch.Tensor:
    """Signed integers from ``bits``-bit two's complement codes (as unpacked symbols).

    Codes of up to 8 bits arrive as ``uint8`` and come back as ``int8``; wider codes come back
    as ``int32``. The sign bit is extended by shifting the code to the top of the word and back
    (an arithmetic shift), which needs no branch per element.
    """
    if symbols.dtype == torch.uint8:
        signed, shift = symbols.view(torch.int8), 8 - bits
    else:
        signed, shift = symbols.to(torch.int32), 32 - bits
    return (signed << shift) >> shift if shift else signed
