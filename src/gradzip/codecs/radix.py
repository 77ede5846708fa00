"""Dense ("radix") packing of symbols of an alphabet of any size ``L`` (``packing="dense"``).

Fixed-width packing spends ``ceil(log2 L)`` bits per symbol, which wastes up to half a bit on an
odd alphabet (2 bits for a ternary symbol worth 1.585). Radix packing groups ``k`` symbols
``d_0 .. d_{k-1}`` of one group into the integer ``N = sum_j d_j * L**j`` (``d_0`` least
significant), which is below ``L**k`` and therefore fits in ``w = bit_length(L**k - 1)`` bits.
For example 5 ternary symbols fit in one byte (``3**5 = 243 <= 256``) and 3 five-level symbols in
7 bits (``5**3 = 125 <= 128``).

Choice of ``k`` and ``w`` [CHOICE]: ``k`` is the smallest group size with
``w <= 1.01 * k * log2 L``, decided exactly in integers (``2**(100 w) <= L**(101 k)``), so the
choice never depends on floating-point rounding. Powers of two get ``k = 1``, ``w = log2 L``
(exactly the fixed-width packing); the hardest alphabets, just above a power of two (``L = 257``:
``k = 12``, ``w = 97``), need words of up to 113 bits.

Wire layout: ``n = G*k + r`` symbols form ``G`` full groups and, if ``r > 0``, one tail group of
``r`` symbols with its own width ``w_r = bit_length(L**r - 1)``. A group word is cut into 32-bit
limbs (least significant first; the last limb holds the remaining ``w mod 32`` bits), and limb
``i`` of every full group is packed as its own little-endian, LSB-first bit plane in the layout
of :func:`gradzip.codecs.bitpack.pack_bits`; then the planes of the tail word. Exact size::

    radix_packed_bytes(n, L) = planes(G, w) + planes(1 if r else 0, w_r)
    planes(G, w) = sum over the limb widths b of w of ceil(G * b / 8)

so for large ``n`` the size is within 1% of ``n * log2 L`` bits (at most ``w / (k log2 L)``
times it, plus at most ``ceil(w/32) + ceil(w_r/32)`` bytes of padding and the tail).

Decoding checks the exact byte count (:class:`TruncatedPayloadError` when short,
:class:`CorruptPayloadError` when long), the zero padding of every plane, and that no group word
is ``>= L**k`` (:class:`CorruptPayloadError`), so every decoded digit lies in ``[0, L)``.

Everything is vectorised over the groups: the Python loops run over the ``k`` digits and the
limbs of one group, never over the symbols.

References: radix (mixed-base) packing as in e.g. 5-trits-per-byte ternary encodings; spec 0.5
(docs/spec/) for the fixed-width baseline it replaces.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from gradzip.codecs.bitpack import pack_bits, packed_bytes, unpack_bits
from gradzip.errors import CorruptPayloadError, TruncatedPayloadError

MAX_ALPHABET = 65536
_LIMB = 32
_LIMB_MASK = (1 << _LIMB) - 1
_WORD_BITS = 63  # a group word this wide or narrower is held in one int64
_TABLE_BITS = 16  # words this narrow are decoded by a table look-up instead of divisions


def _check_alphabet(L: int) -> None:
    if not 1 <= L <= MAX_ALPHABET:
        raise ValueError(f"radix packing needs an alphabet size in [1, {MAX_ALPHABET}], got {L}")


@lru_cache(maxsize=4096)
def radix_group(L: int) -> tuple[int, int]:
    """``(k, w)``: symbols per group and bits per group word for alphabet size ``L``.

    ``k`` is the smallest group size whose word costs at most 1% more than ``k * log2 L`` bits.
    """
    _check_alphabet(L)
    if L == 1:
        return 1, 0  # a one-letter alphabet carries no information
    k = 1
    while True:
        w = (L**k - 1).bit_length()
        if 2 ** (100 * w) <= L ** (101 * k):  # w <= 1.01 k log2 L, exactly
            return k, w
        k += 1


def _limb_widths(w: int) -> list[int]:
    """Widths of the 32-bit limbs of a ``w``-bit word, least significant first."""
    widths = [_LIMB] * (w // _LIMB)
    if w % _LIMB:
        widths.append(w % _LIMB)
    return widths


def _planes_bytes(groups: int, w: int) -> int:
    return sum(packed_bytes(groups, b) for b in _limb_widths(w))


def radix_packed_bytes(n: int, L: int) -> int:
    """Exact size in bytes of ``n`` symbols of alphabet ``L`` in the dense packing."""
    if n < 0:
        raise ValueError(f"symbol count must be >= 0, got {n}")
    k, w = radix_group(L)
    groups, r = divmod(n, k)
    tail = _planes_bytes(1, (L**r - 1).bit_length()) if r else 0
    return _planes_bytes(groups, w) + tail


def _to_limbs(digits: torch.Tensor, L: int, w: int) -> list[torch.Tensor]:
    """Group words ``sum_j digits[:, j] * L**j`` as 32-bit limbs (int64 tensors)."""
    k = digits.shape[1]
    if w <= _WORD_BITS:
        # numpy runs these strided column loops several times faster than torch on one thread
        cols = digits.numpy()
        word = np.empty(digits.shape[0], dtype=np.uint32 if w <= _LIMB else np.int64)
        np.copyto(word, cols[:, k - 1], casting="unsafe")
        for j in range(k - 2, -1, -1):  # Horner, most significant digit first
            word *= L
            np.add(word, cols[:, j], out=word, casting="unsafe")  # the digits may be int64
        if w <= _LIMB:
            return [torch.from_numpy(word)]
        return [torch.from_numpy(word & _LIMB_MASK), torch.from_numpy(word >> _LIMB)]
    limbs = [torch.zeros(digits.shape[0], dtype=torch.int64) for _ in _limb_widths(w)]
    for j in range(k - 1, -1, -1):
        carry = digits[:, j].to(torch.int64)
        for limb in limbs:  # limb * L + carry < 2**48: no int64 overflow
            limb.mul_(L).add_(carry)
            carry = limb >> _LIMB
            limb.bitwise_and_(_LIMB_MASK)
    return limbs


def _from_limbs(limbs: list[torch.Tensor], L: int, w: int, out: torch.Tensor) -> None:
    """Write the base-``L`` digits of each group word into the columns of ``out``.

    Raises :class:`CorruptPayloadError` if a word is ``>= L**k`` (``k = out.shape[1]``), i.e.
    if anything is left after extracting ``k`` digits.
    """
    k = out.shape[1]
    if w <= _WORD_BITS:
        word = limbs[0] if len(limbs) == 1 else limbs[0] | (limbs[1] << _LIMB)
        quotient = torch.empty_like(word)
        for j in range(k):
            torch.div(word, L, rounding_mode="floor", out=quotient)
            torch.sub(word, quotient * L, out=out[:, j])
            word, quotient = quotient, word
        leftover = word
    else:
        for j in range(k):
            rem = torch.zeros_like(limbs[0])
            for limb in reversed(limbs):  # long division, most significant limb first
                cur = (rem << _LIMB) | limb  # < L * 2**32: fits in int64
                torch.div(cur, L, rounding_mode="floor", out=limb)
                rem = cur - limb * L
            out[:, j] = rem
        leftover = torch.stack(limbs).amax(dim=0)
    if bool(leftover.any()):
        raise CorruptPayloadError(f"dense symbol stream holds a group word >= {L}**{k}")


def _pack_groups(digits: torch.Tensor, L: int, w: int) -> list[torch.Tensor]:
    limbs = _to_limbs(digits, L, w)
    return [pack_bits(limb, b) for limb, b in zip(limbs, _limb_widths(w), strict=True)]


def pack_radix(symbols: torch.Tensor, L: int) -> torch.Tensor:
    """Pack a 1-D integer tensor of symbols in ``[0, L)`` densely into a uint8 tensor.

    Values are not range-checked (callers produce them by clamping); the size is exactly
    :func:`radix_packed_bytes` ``(symbols.numel(), L)``.
    """
    k, w = radix_group(L)
    flat = symbols.reshape(-1).cpu().contiguous()
    n = flat.numel()
    if n == 0 or w == 0:
        return torch.empty(0, dtype=torch.uint8)
    groups, r = divmod(n, k)
    parts = _pack_groups(flat[: groups * k].view(groups, k), L, w) if groups else []
    if r:
        parts += _pack_groups(flat[groups * k :].view(1, r), L, (L**r - 1).bit_length())
    return torch.cat(parts)


@lru_cache(maxsize=64)
def _digit_table(L: int, k: int, dtype: str) -> np.ndarray:
    """Row ``v`` holds the ``k`` base-``L`` digits of ``v``, for every ``v < L**k``."""
    values = np.arange(L**k, dtype=np.int64)
    table = np.empty((L**k, k), dtype=dtype)
    for j in range(k):
        table[:, j] = values % L
        values //= L
    table.flags.writeable = False
    return table


def _unpack_groups(
    data: torch.Tensor, groups: int, L: int, w: int, out: torch.Tensor
) -> torch.Tensor:
    """Decode the limb planes of ``groups`` words from the front of ``data`` into ``out``;
    returns the rest of ``data``."""
    limbs = []
    for b in _limb_widths(w):
        size = packed_bytes(groups, b)
        limbs.append(unpack_bits(data[:size], groups, b))
        data = data[size:]
    k = out.shape[1]
    if w <= _TABLE_BITS:  # one plane; a gather is far cheaper than k integer divisions
        words = limbs[0]
        if int(words.max()) >= L**k:
            raise CorruptPayloadError(f"dense symbol stream holds a group word >= {L}**{k}")
        table = _digit_table(L, k, "uint8" if out.dtype == torch.uint8 else "int32")
        np.take(table, words.numpy(), axis=0, out=out.numpy())
    else:
        _from_limbs([limb.to(torch.int64) for limb in limbs], L, w, out)
    return data


def unpack_radix(data: torch.Tensor, n: int, L: int) -> torch.Tensor:
    """Inverse of :func:`pack_radix`: ``n`` symbols, uint8 for ``L <= 256``, else int32.

    Raises :class:`TruncatedPayloadError` if ``data`` is shorter than
    :func:`radix_packed_bytes` and :class:`CorruptPayloadError` if it is longer, has non-zero
    padding bits, or holds a group word ``>= L**k``.
    """
    if data.dtype != torch.uint8 or data.dim() != 1:
        raise TypeError(f"dense symbol stream must be a 1-D uint8 tensor, got {data.dtype}")
    k, w = radix_group(L)
    expected = radix_packed_bytes(n, L)
    if data.numel() < expected:
        raise TruncatedPayloadError(
            f"dense symbol stream has {data.numel()} bytes; {n} symbols of alphabet {L} "
            f"need {expected}"
        )
    if data.numel() > expected:
        raise CorruptPayloadError(
            f"dense symbol stream has {data.numel()} bytes; {n} symbols of alphabet {L} "
            f"take {expected}"
        )
    out = torch.zeros(n, dtype=torch.uint8 if L <= 256 else torch.int32)
    if n == 0 or w == 0:
        return out
    data = data.cpu()
    groups, r = divmod(n, k)
    if groups:
        data = _unpack_groups(data, groups, L, w, out[: groups * k].view(groups, k))
    if r:
        _unpack_groups(data, 1, L, (L**r - 1).bit_length(), out[groups * k :].view(1, r))
    return out
