"""Elias gamma and delta codes of positive integers, vectorised, as one LSB-first bit stream.

Formats (bit ``i`` of the stream is bit ``i % 8`` of byte ``i // 8``, as in :mod:`.bitpack`):

* **gamma** of ``v >= 1`` with ``N = floor(log2 v)``: ``N`` zero bits, a one bit, then the ``N``
  low bits of ``v`` (its leading 1 dropped), least significant first. ``2N + 1`` bits. This is
  Elias's gamma code with the payload written LSB-first so that it can be read as one little-
  endian field [CHOICE]; the lengths are Elias's.
* **delta** of ``v >= 1`` with ``L = floor(log2 v) + 1``: gamma of ``L``, then the ``L - 1`` low
  bits of ``v``, least significant first. ``L - 1 + 2*floor(log2 L) + 1`` bits.
* **bit**: one raw bit (0 or 1), e.g. a sign.

Values up to ``2**63 - 1`` are supported (int64). A stream ends with zero bits up to the next
byte boundary; decoders take the number of values (or records), and raise
:class:`~gradzip.errors.TruncatedPayloadError` if the stream ends inside a code and
:class:`~gradzip.errors.CorruptPayloadError` on codes of impossible length, extra bytes or non-zero
padding. They never loop per value, so they cannot hang.

*Records* interleave several columns: record ``i`` is the code of ``columns[0][i]``, then of
``columns[1][i]``, ... (QSGD's sparse format: gap, sign, level). Encoding computes every code
length, prefix-sums the bit offsets and scatters the bits with one vectorised pass per bit
position. Decoding finds every code boundary at once: it computes, for *every* bit position, where
a record starting there would end, and follows that pointer from position 0 (pointer doubling to
jump ``K`` records at once, a loop over the ``count/K`` block heads, then ``K`` vectorised steps),
then reads all fields in parallel.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from gradzip.errors import CorruptPayloadError, TruncatedPayloadError

KINDS = ("gamma", "delta", "bit")
MAX_VALUE = 2**63 - 1


def _as_int64(values: torch.Tensor | np.ndarray) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    return np.ascontiguousarray(values, dtype=np.int64).reshape(-1)


def _bit_length(v: np.ndarray) -> np.ndarray:
    """``floor(log2 v) + 1`` for int64 ``v >= 1``, exactly.

    ``frexp`` of the float64 value is exact below ``2**53``; above, rounding may carry ``v`` up to
    the next power of two, which the shift test corrects.
    """
    e = np.frexp(v.astype(np.float64))[1].astype(np.int64)
    e -= (v >> (e - 1)) == 0
    return e


def gamma_bits(values: torch.Tensor | np.ndarray) -> torch.Tensor:
    """Length in bits of the gamma code of each value: ``2*floor(log2 v) + 1``."""
    v = _check_positive(_as_int64(values))
    return torch.from_numpy(2 * _bit_length(v) - 1)


def delta_bits(values: torch.Tensor | np.ndarray) -> torch.Tensor:
    """Length in bits of the delta code of each value: ``L - 1 + 2*floor(log2 L) + 1``."""
    v = _check_positive(_as_int64(values))
    L = _bit_length(v)
    return torch.from_numpy(L - 1 + 2 * _bit_length(L) - 1)


def record_bits(columns: Sequence[tuple[str, torch.Tensor | np.ndarray]]) -> int:
    """Total bits of the records (before padding to a whole byte)."""
    total = 0
    for kind, values in columns:
        if kind == "bit":
            total += _as_int64(values).size
        elif kind == "gamma":
            total += int(gamma_bits(values).sum())
        elif kind == "delta":
            total += int(delta_bits(values).sum())
        else:
            raise ValueError(f"unknown Elias code kind {kind!r}; use one of {KINDS}")
    return total


def _check_positive(v: np.ndarray) -> np.ndarray:
    if v.size and int(v.min()) < 1:
        raise ValueError("Elias codes encode positive integers only (>= 1)")
    return v


def _scatter(bits: np.ndarray, pos: np.ndarray, v: np.ndarray, width: np.ndarray) -> None:
    """Write the ``width`` low bits of each ``v`` LSB-first at ``pos`` (one pass per bit)."""
    idx = np.nonzero(width > 0)[0]
    j = 0
    while idx.size:
        bits[pos[idx] + j] = (v[idx] >> j) & 1
        j += 1
        idx = idx[width[idx] > j]


def _gather(bits: np.ndarray, pos: np.ndarray, width: np.ndarray) -> np.ndarray:
    """Read ``width`` bits LSB-first at each ``pos`` (inverse of :func:`_scatter`)."""
    out = np.zeros(pos.shape, dtype=np.int64)
    idx = np.nonzero(width > 0)[0]
    j = 0
    while idx.size:
        out[idx] |= bits[pos[idx] + j].astype(np.int64) << j
        j += 1
        idx = idx[width[idx] > j]
    return out


def encode_records(columns: Sequence[tuple[str, torch.Tensor | np.ndarray]]) -> torch.Tensor:
    """Encode interleaved records (see the module docstring) into a uint8 tensor."""
    cols = [(kind, _as_int64(values)) for kind, values in columns]
    if not cols:
        raise ValueError("encode_records needs at least one column")
    m = cols[0][1].size
    lengths = np.zeros(m, dtype=np.int64)
    prepared: list[tuple[str, np.ndarray, np.ndarray | None, np.ndarray | None]] = []
    for kind, v in cols:
        if v.size != m:
            raise ValueError("every Elias record column must have the same length")
        if kind == "bit":
            if v.size and (int(v.min()) < 0 or int(v.max()) > 1):
                raise ValueError("a 'bit' column holds only 0 and 1")
            prepared.append((kind, v, None, None))
            lengths += 1
            continue
        _check_positive(v)
        if kind == "gamma":
            z = _bit_length(v) - 1
            prepared.append((kind, v, z, None))
            lengths += 2 * z + 1
        elif kind == "delta":
            L = _bit_length(v)
            zl = _bit_length(L) - 1
            prepared.append((kind, v, zl, L))
            lengths += 2 * zl + L
        else:
            raise ValueError(f"unknown Elias code kind {kind!r}; use one of {KINDS}")
    total = int(lengths.sum())
    bits = np.zeros(-(-total // 8) * 8, dtype=np.uint8)
    pos = np.cumsum(lengths) - lengths
    for kind, vals, zs, Ls in prepared:
        if kind == "bit":
            bits[pos] = vals
            pos += 1
        elif kind == "gamma":
            assert zs is not None
            bits[pos + zs] = 1
            _scatter(bits, pos + zs + 1, vals, zs)
            pos += 2 * zs + 1
        else:
            assert zs is not None and Ls is not None
            bits[pos + zs] = 1
            _scatter(bits, pos + zs + 1, Ls, zs)
            _scatter(bits, pos + 2 * zs + 1, vals, Ls - 1)
            pos += 2 * zs + Ls
    return torch.from_numpy(np.packbits(bits, bitorder="little"))


def decode_records(data: torch.Tensor, count: int, kinds: Sequence[str]) -> list[torch.Tensor]:
    """Decode ``count`` records of the given column ``kinds``; one int64 tensor per column."""
    for kind in kinds:
        if kind not in KINDS:
            raise ValueError(f"unknown Elias code kind {kind!r}; use one of {KINDS}")
    raw = data.detach().cpu().numpy().astype(np.uint8, copy=False).reshape(-1)
    T = 8 * raw.size
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    if count == 0:
        if raw.size:
            raise CorruptPayloadError(f"Elias stream of 0 values has {raw.size} extra bytes")
        return [torch.empty(0, dtype=torch.int64) for _ in kinds]
    if T == 0:
        raise TruncatedPayloadError(f"Elias stream is empty; {count} records were expected")
    # pad so that every read below stays in bounds (a code never extends beyond 127+63 bits)
    bits = np.zeros(T + 256, dtype=np.uint8)
    bits[:T] = np.unpackbits(raw, bitorder="little")
    nxt1 = _next_one(bits, T)
    ends = _record_ends(bits, nxt1, T, kinds)
    starts = _orbit(ends, count)
    last = int(starts[count])
    if last > T:  # the sentinels are absorbing: the first record that hit one is the culprit
        bad = int(np.argmax(starts > T)) - 1
        if last == T + 2:
            raise CorruptPayloadError(f"Elias stream holds an impossible code in record {bad}")
        raise TruncatedPayloadError(f"Elias stream ends inside record {bad} of {count}")
    if T - last >= 8:
        raise CorruptPayloadError(
            f"Elias stream has {(T - last) // 8} extra bytes after its {count} records"
        )
    if bits[last:T].any():
        raise CorruptPayloadError("Elias stream has non-zero padding bits")
    return _read_fields(bits, nxt1, starts[:count], kinds)


def _index_dtype(T: int) -> type[np.signedinteger[Any]]:
    """int32 positions (half the memory traffic) unless the stream is too long for them."""
    return np.int32 if T + 512 < 2**31 else np.int64


def _next_one(bits: np.ndarray, T: int) -> np.ndarray:
    """Position of the first one bit at or after each position (``T + 256`` if none)."""
    it = _index_dtype(T)
    where = np.where(bits[:T] == 1, np.arange(T, dtype=it), it(T + 256))
    out = np.full(bits.size, T + 256, dtype=it)
    out[:T] = np.minimum.accumulate(where[::-1])[::-1]
    return out


def _record_ends(bits: np.ndarray, nxt1: np.ndarray, T: int, kinds: Sequence[str]) -> np.ndarray:
    """For every start position 0..T+2, the end of a record starting there.

    ``T + 1`` means "runs past the end" and ``T + 2`` "impossible code"; both are absorbing.
    """
    it = _index_dtype(T)
    P = np.arange(T + 3, dtype=it)
    z = nxt1[: T + 3] - P  # zeros before the next one bit (>= 256 - 3 if there is none)
    ran_out = z >= T - P  # no terminating one bit inside the stream
    window = None
    if "delta" in kinds:  # the 8 bits following each position, LSB first
        window = bits[: T + 16].copy()
        for i in range(1, 8):
            window[: T + 16 - i] |= np.left_shift(bits[i : T + 16], np.uint8(i))
    steps = {
        kind: _field_ends(z, ran_out, window, P, T, kind) for kind in set(kinds) if kind != "bit"
    }
    pos = P
    for kind in kinds:
        if kind == "bit":  # one bit further, no table needed; the sentinels stay put
            past = pos >= T
            sentinel = np.where(pos == T + 2, T + 2, T + 1).astype(pos.dtype)
            pos = pos + 1
            pos[past] = sentinel[past]
        else:
            pos = steps[kind][pos]
    return pos


def _field_ends(
    z: np.ndarray,
    ran_out: np.ndarray,
    window: np.ndarray | None,
    P: np.ndarray,
    T: int,
    kind: str,
) -> np.ndarray:
    if kind == "bit":
        end = P + 1
        impossible = None
    elif kind == "gamma":
        end = P + 2 * np.minimum(z, 63) + 1
        impossible = z > 62  # a value >= 2**63
    else:
        assert window is not None
        zc = np.minimum(z, 6)
        low = window[P + zc + 1].astype(P.dtype) & ((1 << zc) - 1)
        end = P + 2 * zc + ((1 << zc) | low)  # gamma(L) then L - 1 bits
        impossible = z > 5  # L >= 64: a value >= 2**63
    np.minimum(end, T + 1, out=end)
    if impossible is not None:
        end[impossible] = T + 2
        end[ran_out] = T + 1
    end[T:] = [T + 1, T + 1, T + 2]
    return end


def _orbit(ends: np.ndarray, count: int) -> np.ndarray:
    """``[s_0 = 0, s_1 = ends[s_0], ..., s_count]``.

    ``R`` rounds of pointer doubling give ``J^K`` (``K = 2**R``, chosen so that about
    ``count/K <= 32768`` block heads remain); a loop over the block heads (not over values) walks
    ``s_0, s_K, s_2K, ...``; then ``K`` vectorised steps of ``J`` fill in every block at once.
    """
    R = (count // 32768).bit_length()
    jump = ends  # int32 where possible: each gather is then ~4x faster than with int64
    for _ in range(R):
        jump = jump[jump]
    K = 1 << R
    m = -(-(count + 1) // K)
    heads = np.empty(m, dtype=ends.dtype)
    p = 0
    for i in range(m):
        heads[i] = p
        p = int(jump[p])
    table = np.empty((K, m), dtype=ends.dtype)
    cur = heads
    for j in range(K):
        table[j] = cur
        cur = ends[cur]
    starts: np.ndarray = table.T.reshape(-1)[: count + 1].astype(np.int64)
    return starts


def _read_fields(
    bits: np.ndarray, nxt1: np.ndarray, starts: np.ndarray, kinds: Sequence[str]
) -> list[torch.Tensor]:
    out = []
    pos = starts.copy()
    for kind in kinds:
        if kind == "bit":
            out.append(bits[pos].astype(np.int64))
            pos += 1
            continue
        z = nxt1[pos] - pos
        head = (np.int64(1) << z) | _gather(bits, pos + z + 1, z)
        if kind == "gamma":
            out.append(head)
            pos += 2 * z + 1
        else:
            L = head
            out.append((np.int64(1) << (L - 1)) | _gather(bits, pos + 2 * z + 1, L - 1))
            pos += 2 * z + L
    return [torch.from_numpy(v) for v in out]


def encode_gamma(values: torch.Tensor | np.ndarray) -> torch.Tensor:
    """Gamma-code positive integers into one byte-padded LSB-first stream (uint8)."""
    return encode_records([("gamma", values)])


def decode_gamma(data: torch.Tensor, count: int) -> torch.Tensor:
    """Decode ``count`` gamma codes (int64)."""
    return decode_records(data, count, ("gamma",))[0]


def encode_delta(values: torch.Tensor | np.ndarray) -> torch.Tensor:
    """Delta-code positive integers into one byte-padded LSB-first stream (uint8)."""
    return encode_records([("delta", values)])


def decode_delta(data: torch.Tensor, count: int) -> torch.Tensor:
    """Decode ``count`` delta codes (int64)."""
    return decode_records(data, count, ("delta",))[0]
