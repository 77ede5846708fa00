"""Fixed-width bit packing on the symbols' device under the device path's rules: the layout of
:mod:`gradzip.codecs.bitpack` (LSB-first, symbol ``j`` in bits ``j*b .. j*b + b - 1``, zero
padding bits), as :mod:`gradzip.kernels.bitpack_torch` packs it, with no Python indexing or
slicing (``select``, ``narrow``, :func:`~gradzip.kernels.device_buckets.padded`) and no value
read back: unpacking returns a 0-d validity flag (padding bits zero) instead of raising.

Symbols are handled in groups of 8, which fill exactly ``b`` bytes.
"""

from __future__ import annotations

import torch

from gradzip.kernels.device_buckets import padded
from gradzip.kernels.packed import packed_bytes


def pack_bits_device(symbols: torch.Tensor, bits: int) -> torch.Tensor:
    """:func:`gradzip.codecs.bitpack.pack_bits`'s bytes (``uint8``, LSB-first) of ``symbols``
    (``bits <= 32``), in groups of 8 symbols that fill ``bits`` bytes."""
    n = symbols.numel()
    groups = -(-n // 8)
    s = padded(symbols.to(torch.int64) & ((1 << bits) - 1), groups * 8).view(groups, 8)
    columns: list[torch.Tensor | None] = [None] * bits
    for j in range(8):
        symbol = s.select(1, j)
        first = j * bits
        for byte in range(first // 8, (first + bits - 1) // 8 + 1):
            shift = first - 8 * byte  # position of the symbol's bit 0 within this byte
            part = (symbol << shift) if shift >= 0 else (symbol >> -shift)
            part = part & 0xFF
            column = columns[byte]
            columns[byte] = part if column is None else column | part
    out = torch.stack([c for c in columns if c is not None], dim=1).to(torch.uint8)
    return out.reshape(-1).narrow(0, 0, packed_bytes(n, bits))


def unpack_bits_device(data: torch.Tensor, n: int, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``n`` symbols (int64) of a packed stream of exactly :func:`packed_bytes` bytes, and a
    0-d flag: whether its padding bits are zero (as :func:`gradzip.kernels.packed.check_packed`
    requires)."""
    groups = -(-n // 8)
    raw = padded(data.to(torch.int64), groups * bits).view(groups, bits)
    symbols = []
    for j in range(8):
        first = j * bits
        value: torch.Tensor | None = None
        for byte in range(first // 8, (first + bits - 1) // 8 + 1):
            shift = first - 8 * byte
            column = raw.select(1, byte)
            part = (column >> shift) if shift >= 0 else (column << -shift)
            value = part if value is None else value | part
        assert value is not None
        symbols.append(value & ((1 << bits) - 1))
    out = torch.stack(symbols, dim=1).reshape(-1).narrow(0, 0, n)
    tail_bits = (n * bits) % 8
    if tail_bits:
        last = data.narrow(0, data.numel() - 1, 1).to(torch.int64)
        clean = ((last >> tail_bits) == 0).all()
    else:
        clean = torch.ones((), dtype=torch.bool, device=data.device)
    return out, clean
