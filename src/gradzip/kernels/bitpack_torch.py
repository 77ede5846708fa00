"""Fixed-width bit packing as torch operations, on the symbols' device: the layout of
:mod:`gradzip.codecs.bitpack` (LSB-first, symbol ``j`` in bits ``j*b .. j*b + b - 1``), the
device twin of :mod:`gradzip.kernels.bitpack`. Symbols are handled in groups of 8, which fill
exactly ``b`` bytes, so the work is ``8 * ceil(b/8 + 1)`` shifts over the groups whatever ``b``.
"""

from __future__ import annotations

import torch


def pack_bits_torch(symbols: torch.Tensor, bits: int) -> torch.Tensor:
    """:func:`gradzip.codecs.bitpack.pack_bits` (LSB-first, ``bits <= 32``) as torch operations
    on the symbols' device."""
    n, dev = symbols.numel(), symbols.device
    groups = -(-n // 8)
    s = torch.zeros(groups * 8, dtype=torch.int64, device=dev)
    s[:n] = symbols.to(torch.int64) & ((1 << bits) - 1)
    s = s.view(groups, 8)
    out = torch.zeros(groups, bits, dtype=torch.int64, device=dev)
    for j in range(8):
        first = j * bits
        for byte in range(first // 8, (first + bits - 1) // 8 + 1):
            shift = first - 8 * byte  # position of the symbol's bit 0 within this byte
            part = (s[:, j] << shift) if shift >= 0 else (s[:, j] >> -shift)
            out[:, byte] |= part & 0xFF
    return out.to(torch.uint8).reshape(-1)[: (n * bits + 7) // 8]


def unpack_bits_torch(data: torch.Tensor, n: int, bits: int) -> torch.Tensor:
    """Inverse of :func:`pack_bits_torch` (int64 symbols; no validation, done by the caller)."""
    dev = data.device
    groups = -(-n // 8)
    raw = torch.zeros(groups * bits, dtype=torch.int64, device=dev)
    raw[: data.numel()] = data.to(torch.int64)
    raw = raw.view(groups, bits)
    out = torch.zeros(groups, 8, dtype=torch.int64, device=dev)
    for j in range(8):
        first = j * bits
        for byte in range(first // 8, (first + bits - 1) // 8 + 1):
            shift = first - 8 * byte
            part = (raw[:, byte] >> shift) if shift >= 0 else (raw[:, byte] << -shift)
            out[:, j] |= part
    return (out & ((1 << bits) - 1)).reshape(-1)[:n]
