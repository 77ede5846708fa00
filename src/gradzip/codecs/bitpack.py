"""Fixed-width packing of b-bit symbols (1 <= b <= 32) into bytes.

Symbols are written as one little-endian, LSB-first bit stream (spec 0.5): symbol ``j`` occupies
bits ``j*b .. j*b + b - 1`` of the stream, and bit ``i`` of the stream is bit ``i % 8`` of byte
``i // 8``. ``n`` symbols take exactly ``ceil(n*b/8)`` bytes; the unused high bits of the last
byte are zero, and the unpacker rejects a stream whose padding bits are not.

Every path is vectorised over groups of symbols (8 symbols of b bits fill exactly b bytes), so
the cost is a handful of passes over the symbol array, never a per-symbol Python loop.
"""

from __future__ import annotations

import sys

import torch

from gradzip.errors import CorruptPayloadError, TruncatedPayloadError

if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
    raise ImportError("gradzip's bit packing assumes a little-endian host")


def packed_bytes(n: int, bits: int) -> int:
    """Bytes taken by ``n`` symbols of ``bits`` bits."""
    return (n * bits + 7) // 8


def _check_bits(bits: int) -> None:
    if not 1 <= bits <= 32:
        raise ValueError(f"bit width must lie in [1, 32], got {bits}")


def pack_bits(symbols: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack a 1-D integer tensor of values in ``[0, 2**bits)`` into a uint8 tensor.

    Values are not range-checked here (callers produce them by clamping); bits above ``bits`` are
    discarded.
    """
    _check_bits(bits)
    n = symbols.numel()
    nbytes = packed_bytes(n, bits)
    if n == 0:
        return torch.empty(0, dtype=torch.uint8, device=symbols.device)
    if bits == 8:
        return symbols.to(torch.uint8)
    if bits == 16:
        return symbols.to(torch.int32).to(torch.int16).view(torch.uint8)
    if 8 % bits == 0:  # 1, 2, 4 bits: several symbols per byte
        per = 8 // bits
        padded = _pad(symbols.to(torch.uint8), per)
        groups = padded.view(-1, per)
        out = groups[:, 0].clone()
        for j in range(1, per):
            out |= groups[:, j] << (j * bits)
        return out[:nbytes]
    # general width: 8 symbols fill exactly `bits` bytes; build them in 64-bit words
    groups = _pad(symbols.to(torch.int64), 8).view(-1, 8)
    mask = (1 << bits) - 1
    nwords = -(-8 * bits // 64)
    words = torch.zeros((groups.shape[0], nwords), dtype=torch.int64, device=symbols.device)
    for j in range(8):
        s = groups[:, j] & mask
        word, shift = divmod(j * bits, 64)
        words[:, word] |= s << shift  # bits beyond 64 fall off and go to the next word
        if shift + bits > 64:
            words[:, word + 1] |= s >> (64 - shift)
    return words.view(torch.uint8).view(-1, 8 * nwords)[:, :bits].reshape(-1)[:nbytes]


def unpack_bits(data: torch.Tensor, n: int, bits: int) -> torch.Tensor:
    """Inverse of :func:`pack_bits`: ``n`` symbols (uint8 up to 8 bits, int32 up to 16, else
    int64).

    Raises :class:`TruncatedPayloadError` if ``data`` is too short and
    :class:`CorruptPayloadError` if it is too long or its padding bits are set.
    """
    _check_bits(bits)
    expected = packed_bytes(n, bits)
    if data.numel() < expected:
        raise TruncatedPayloadError(
            f"packed symbol stream has {data.numel()} bytes; {n} symbols of {bits} bits need {expected}"
        )
    if data.numel() > expected:
        raise CorruptPayloadError(
            f"packed symbol stream has {data.numel()} bytes; {n} symbols of {bits} bits take {expected}"
        )
    tail_bits = (n * bits) % 8
    if tail_bits and int(data[-1]) >> tail_bits:
        raise CorruptPayloadError("packed symbol stream has non-zero padding bits")
    out_dtype = torch.uint8 if bits <= 8 else (torch.int32 if bits <= 16 else torch.int64)
    if n == 0:
        return torch.empty(0, dtype=out_dtype, device=data.device)
    if bits == 8:
        return data.clone()
    if bits == 16:
        return data.view(torch.int16).to(torch.int32) & 0xFFFF
    mask = (1 << bits) - 1
    if 8 % bits == 0:
        per = 8 // bits
        out = torch.empty((expected, per), dtype=torch.uint8, device=data.device)
        for j in range(per):
            torch.bitwise_and(data >> (j * bits), mask, out=out[:, j])
        return out.view(-1)[:n]
    groups = -(-n // 8)
    nwords = -(-8 * bits // 64)
    flat = torch.zeros(groups * bits, dtype=torch.uint8, device=data.device)
    flat[:expected] = data
    raw = torch.zeros((groups, 8 * nwords), dtype=torch.uint8, device=data.device)
    raw[:, :bits] = flat.view(groups, bits)
    words = raw.view(torch.int64)
    result = torch.empty((groups, 8), dtype=torch.int64, device=data.device)
    for j in range(8):
        word, shift = divmod(j * bits, 64)
        # `>>` on int64 is arithmetic; masking removes the sign extension
        torch.bitwise_and(words[:, word] >> shift, mask, out=result[:, j])
        if shift + bits > 64:
            high = (words[:, word + 1] << (64 - shift)) & mask
            result[:, j] &= (1 << (64 - shift)) - 1
            result[:, j] |= high
    return result.view(-1)[:n].to(out_dtype)


def _pad(values: torch.Tensor, multiple: int) -> torch.Tensor:
    extra = (-values.numel()) % multiple
    if not extra:
        return values
    return torch.cat((values, values.new_zeros(extra)))
