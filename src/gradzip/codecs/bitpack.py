"""Fixed-width packing of b-bit symbols (1 <= b <= 32) into bytes.

Symbols are written as one little-endian, LSB-first bit stream (spec 0.5): symbol ``j`` occupies
bits ``j*b .. j*b + b - 1`` of the stream, and bit ``i`` of the stream is bit ``i % 8`` of byte
``i // 8``. ``n`` symbols take exactly ``ceil(n*b/8)`` bytes; the unused high bits of the last
byte are zero, and the unpacker rejects a stream whose padding bits are not.

Every path is vectorised over groups of symbols (8 symbols of b bits fill exactly b bytes), with
NumPy's in-place ufuncs into preallocated buffers: fresh large temporaries cost more in page
faults than the arithmetic itself. Payloads are built on the CPU, so the work happens there.
"""

from __future__ import annotations

import sys

import numpy as np
import torch

# the layout's sizes and checks live below the codecs (the fused kernels use them too)
from gradzip.kernels.packed import check_bits
from gradzip.kernels.packed import check_packed as check_packed
from gradzip.kernels.packed import packed_bytes as packed_bytes

if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
    raise ImportError("gradzip's bit packing assumes a little-endian host")

_WHOLE = {8: np.uint8, 16: np.uint16, 32: np.uint32}
# 1, 2 and 4 bits: several symbols per byte, gathered with SWAR shifts inside machine words
# (symbols per word view, the word type, the mask keeping each byte's low bits)
_PER_BYTE = {
    1: (8, np.uint64, 0x0101010101010101),
    2: (4, np.uint32, 0x03030303),
    4: (2, np.uint16, 0x0F0F),
}


def _as_numpy(symbols: torch.Tensor) -> np.ndarray:
    return symbols.detach().reshape(-1).cpu().numpy()


def pack_bits(symbols: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack a 1-D integer tensor of values in ``[0, 2**bits)`` into a uint8 tensor.

    Values are not range-checked here (callers produce them by clamping): a value of
    ``2**bits`` or more is not packed as its low bits at every width (at 3, 5 or 13 bits, for
    one, its high bits land in the next symbols').
    """
    check_bits(bits)
    s = _as_numpy(symbols)
    n = s.size
    if n == 0:
        return torch.empty(0, dtype=torch.uint8)
    if bits in _WHOLE:
        return torch.from_numpy(s.astype(_WHOLE[bits], copy=False).view(np.uint8).copy())
    if bits in _PER_BYTE:
        return torch.from_numpy(_pack_small(s, bits)[: packed_bytes(n, bits)])
    full = n // 8
    pieces = [_pack_groups(s[: 8 * full].reshape(full, 8), bits)] if full else []
    if n % 8:
        tail = np.zeros((1, 8), dtype=s.dtype)
        tail[0, : n % 8] = s[8 * full :]
        pieces.append(_pack_groups(tail, bits))
    packed = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
    return torch.from_numpy(packed[: packed_bytes(n, bits)])


def _pack_small(s: np.ndarray, bits: int) -> np.ndarray:
    """Pack 1-, 2- or 4-bit symbols: each byte-sized symbol in a word slides down next to its
    neighbours (a few shifts per word instead of one per symbol)."""
    per, word_type, mask = _PER_BYTE[bits]
    count = -(-s.size // per)
    if s.dtype == np.uint8 and s.size % per == 0 and s.flags.c_contiguous:
        source = s  # already whole words of byte symbols: no padded copy needed
    else:
        source = np.zeros(count * per, dtype=np.uint8)
        np.copyto(source[: s.size], s, casting="unsafe")
    # the masked copy discards bits above `bits` (and leaves the caller's symbols untouched)
    words = np.bitwise_and(source.view(word_type), word_type(mask))
    tmp = np.empty_like(words)
    # step k (span (8-bits)*2^k) joins pairs of packed runs: after it, each lane of 2^(k+1)
    # bytes holds its 2^(k+1) symbols contiguously in its low bits
    for step in range(per.bit_length() - 1):
        np.right_shift(words, word_type((8 - bits) << step), out=tmp)
        np.bitwise_or(words, tmp, out=words)
    packed: np.ndarray = words.astype(np.uint8)  # the low byte holds the packed symbols
    return packed


def _unpack_small(raw: np.ndarray, bits: int) -> np.ndarray:
    """Inverse of :func:`_pack_small`: spread each byte's symbols back into their own bytes."""
    per, word_type, mask = _PER_BYTE[bits]
    words = raw.astype(word_type)
    tmp = np.empty_like(words)
    for step in reversed(range(per.bit_length() - 1)):
        # the upper half of each lane's packed run moves up to the lane's upper half
        np.left_shift(words, word_type((8 - bits) << step), out=tmp)
        np.bitwise_or(words, tmp, out=words)
    np.bitwise_and(words, word_type(mask), out=words)
    return words.view(np.uint8)


def _pack_groups(groups: np.ndarray, bits: int) -> np.ndarray:
    """Pack ``(G, 8)`` symbols into ``G * bits`` bytes."""
    count = groups.shape[0]
    nwords = -(-8 * bits // 64)
    words = np.zeros((count, nwords), dtype=np.uint64)
    tmp = np.empty(count, dtype=np.uint64)
    for j in range(8):
        word, shift = divmod(j * bits, 64)
        np.copyto(tmp, groups[:, j], casting="unsafe")
        np.left_shift(tmp, np.uint64(shift), out=tmp)  # bits past 64 fall off here...
        np.bitwise_or(words[:, word], tmp, out=words[:, word])
        if shift + bits > 64:  # ...and are written into the next word
            np.copyto(tmp, groups[:, j], casting="unsafe")
            np.right_shift(tmp, np.uint64(64 - shift), out=tmp)
            np.bitwise_or(words[:, word + 1], tmp, out=words[:, word + 1])
    as_bytes = words.view(np.uint8).reshape(count, 8 * nwords)[:, :bits]
    return np.ascontiguousarray(as_bytes).reshape(-1)


def unpack_bits(data: torch.Tensor, n: int, bits: int) -> torch.Tensor:
    """Inverse of :func:`pack_bits`: ``n`` symbols (uint8 up to 8 bits, int32 up to 16, else
    int64).

    Raises :class:`TruncatedPayloadError` if ``data`` is too short and
    :class:`CorruptPayloadError` if it is too long or its padding bits are set.
    """
    check_packed(data, n, bits)
    out_dtype = np.uint8 if bits <= 8 else (np.int32 if bits <= 16 else np.int64)
    raw = _as_numpy(data)
    if n == 0:
        return torch.from_numpy(np.empty(0, dtype=out_dtype))
    if bits in _WHOLE:
        return torch.from_numpy(raw.view(_WHOLE[bits]).astype(out_dtype))
    if bits in _PER_BYTE:
        return torch.from_numpy(_unpack_small(raw, bits)[:n])
    full = n // 8
    pieces = (
        [_unpack_groups(raw[: full * bits].reshape(full, bits), bits, out_dtype)] if full else []
    )
    if n % 8:
        tail = np.zeros((1, bits), dtype=np.uint8)
        rest = raw[full * bits :]
        tail[0, : rest.size] = rest
        pieces.append(_unpack_groups(tail, bits, out_dtype)[: n % 8])
    values = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
    return torch.from_numpy(values)


def _unpack_groups(packed: np.ndarray, bits: int, out_dtype: type) -> np.ndarray:
    """Unpack ``(G, bits)`` bytes into ``8 * G`` symbols."""
    count = packed.shape[0]
    nwords = -(-8 * bits // 64)
    raw = np.zeros((count, 8 * nwords), dtype=np.uint8)
    raw[:, :bits] = packed
    words = raw.view(np.uint64)
    out: np.ndarray = np.empty((count, 8), dtype=out_dtype)
    tmp = np.empty(count, dtype=np.uint64)
    high = np.empty(count, dtype=np.uint64)
    mask = np.uint64((1 << bits) - 1)
    for j in range(8):
        word, shift = divmod(j * bits, 64)
        np.right_shift(words[:, word], np.uint64(shift), out=tmp)
        if shift + bits > 64:
            np.left_shift(words[:, word + 1], np.uint64(64 - shift), out=high)
            np.bitwise_or(tmp, high, out=tmp)
        np.bitwise_and(tmp, mask, out=tmp)
        np.copyto(out[:, j], tmp, casting="unsafe")
    return out.reshape(-1)
