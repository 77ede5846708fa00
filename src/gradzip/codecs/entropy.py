"""Entropy coding of quantizer symbols (``packing="entropy"``): an ANS coder whose model, the
stream's own symbol histogram, travels in front of the coded data.

Stream layout (a self-contained uint8 stream; the receiver only needs ``n`` and ``L``):

* ``n = 0``: no bytes at all.
* Model: LEB128 varints ``lo`` (smallest symbol used), ``span = hi - lo`` (``hi`` the largest),
  and, if ``span > 0``, ``mode`` (offset from ``lo`` of the most frequent symbol, the first one on
  ties) followed by the ``span`` counts of the other symbols ``lo .. hi`` in order. The mode's
  count is implied: ``n`` minus the others.
* Data (only if ``span > 0``): the words of a ``constriction`` ANS coder (``AnsCoder``, 32-bit
  words, little-endian bytes) with trailing zero bytes removed, so the stream never ends in a zero
  byte (the coder may leave it empty: its empty state decodes to super-symbol 0).

Coding [CHOICE]: the ``Ls = span + 1`` used symbols are grouped ``k`` at a time into one
super-symbol of the alphabet ``Ls**k`` (``k`` a power of two up to 8, the largest with
``Ls**k <= 2**13``, or ``<= 2**8`` for low-entropy streams; ``k = 1`` from ``Ls = 91`` on; see
:func:`group_size`), because the coder's cost is mostly per coded symbol. The last group is
padded with the mode symbol. The super-symbol model is the product of the transmitted counts,
built by the sender and the receiver from the same integers with the same element-wise float64
products, so both see bitwise-identical probabilities after ``constriction``'s quantization
(``Categorical(perfect=False)``, 24-bit precision). Low-entropy streams code the mode as digit 0
(see :func:`_shift`).

Size guarantee: an ideal coder with this model would need exactly ``n * H`` bits for the data
(``H`` the empirical entropy of the stream in bits per symbol, the ``entropy_bits`` of spec 0.5).
On top of that come the 24-bit quantization of the model (every super-symbol keeps at least
``2**-24`` of the probability mass), the padding of the last group, and the coder's final state
(about 2.5 bytes). Measured over ternary, 5-, 9-, 17- and 100-level streams from uniform to
``P(mode) = 0.9999`` with ``n = 10**5 .. 10**6``: ``bytes <= model + 1.001 * n*H/8 + 4``; the
model is ``2 + sum of the LEB128 sizes`` of ``mode`` and the counts (5 to 11 bytes for 3 to 5
levels). Hence the stream is within 2% of ``n*H/8`` plus the model as soon as ``n*H/8`` is a few
hundred bytes (every quantizer distribution with ``n >= 10**5`` down to ``P(mode) = 0.999``),
and within 0.1% of ``n*H/8`` for ordinary entropies (``H >= 0.5``) at ``n >= 10**5``. Below that
the 4 bytes of coder state dominate (``P(mode) = 0.9999``, ``n = 10**5``: 16 bytes of entropy, 23
in all). Tested in ``tests/codecs/test_entropy.py``.

Decoding validates everything: a short model raises :class:`TruncatedPayloadError`; a malformed
model (overlong varints, symbols outside ``[0, L)``, counts that do not add up to ``n`` or that
leave ``lo``/``hi`` unused), coder errors, leftover coded data, a zero final byte, a wrong padding
or a decoded histogram different from the transmitted one raise :class:`CorruptPayloadError`.
A truncated data part decodes to the wrong histogram and is caught there. Decoding takes a fixed
number of steps, so it never hangs.

References: J. Duda, "Asymmetric numeral systems" (2009/2013); R. Bamler, ``constriction``
(https://bamler-lab.github.io/constriction/); spec 0.5 (``entropy_bits``, docs/spec/).
"""

from __future__ import annotations

import math
import sys
from functools import lru_cache
from typing import Any

import constriction
import numpy as np
import torch

from gradzip.errors import CorruptPayloadError, TruncatedPayloadError

if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
    raise ImportError("gradzip's entropy coder assumes a little-endian host")

MAX_ALPHABET = 65536
_MAX_SUPER = 1 << 13  # largest super-symbol alphabet: bigger ones decode slower and leak mass
_MAX_SUPER_LOW_ENTROPY = 1 << 8
_MAX_VARINT_BYTES = 9  # 63 bits: every count (<= n) fits, and no shift overflows


# --- model (histogram) serialisation -------------------------------------------------------------

#: super-symbols decoded per call to the coder (bounds the memory it allocates itself)
_DECODE_PIECE = 1 << 22


def _varint_bytes(values: np.ndarray) -> np.ndarray:
    """LEB128 encoding of non-negative int64 ``values``, vectorised over the values."""
    values = values.astype(np.uint64)
    nbytes = np.ones(values.size, dtype=np.int64)
    rest = values >> np.uint64(7)
    while rest.any():  # at most 9 passes (values < 2**63)
        nbytes += rest > 0
        rest >>= np.uint64(7)
    ends = np.cumsum(nbytes)
    out = np.empty(int(ends[-1]) if values.size else 0, dtype=np.uint8)
    starts = ends - nbytes
    for j in range(int(nbytes.max()) if values.size else 0):
        live = nbytes > j
        chunk = (values[live] >> np.uint64(7 * j)) & np.uint64(0x7F)
        more = (nbytes[live] > j + 1).astype(np.uint64) << np.uint64(7)
        out[starts[live] + j] = (chunk | more).astype(np.uint8)
    return out


def _read_varints(buf: np.ndarray, pos: int, count: int) -> tuple[np.ndarray, int]:
    """Decode ``count`` LEB128 varints from ``buf[pos:]``; returns them (uint64) and the end."""
    if count == 0:
        return np.zeros(0, dtype=np.uint64), pos
    window = buf[pos : pos + count * _MAX_VARINT_BYTES]
    ends = np.flatnonzero(window < 0x80)[:count]
    if ends.size < count:
        raise TruncatedPayloadError(
            f"entropy stream model is cut short: {count} varints needed, {ends.size} found"
        )
    starts = np.concatenate(([0], ends[:-1] + 1))
    lengths = ends - starts + 1
    if lengths.max() > _MAX_VARINT_BYTES or (
        lengths.max() > 1 and (window[ends[lengths > 1]] == 0).any()
    ):
        raise CorruptPayloadError("entropy stream model holds an overlong varint")
    used = window[: int(ends[-1]) + 1].astype(np.uint64) & np.uint64(0x7F)
    shifts = (np.arange(used.size) - np.repeat(starts, lengths)).astype(np.uint64) * np.uint64(7)
    values = np.add.reduceat(used << shifts, starts)
    return values, pos + int(ends[-1]) + 1


def _encode_model(lo: int, counts: np.ndarray, mode: int) -> np.ndarray:
    span = counts.size - 1
    if span == 0:
        return _varint_bytes(np.array([lo, 0], dtype=np.int64))
    others = np.delete(counts, mode)
    return _varint_bytes(np.concatenate(([lo, span, mode], others)).astype(np.int64))


def _decode_model(buf: np.ndarray, n: int, L: int) -> tuple[int, np.ndarray, int, int]:
    """Parse the model: returns ``lo``, the counts of ``lo .. hi``, the mode offset, and the
    position where the coded data starts."""
    (lo, span), pos = _read_varints(buf, 0, 2)
    if lo >= L or span >= L - lo:
        raise CorruptPayloadError(
            f"entropy stream model names symbols {lo}..{lo + span} outside [0, {L})"
        )
    lo, span = int(lo), int(span)
    if span == 0:
        return lo, np.array([n], dtype=np.int64), 0, pos
    (mode,), pos = _read_varints(buf, pos, 1)
    if mode > span:
        raise CorruptPayloadError(f"entropy stream model has mode offset {mode} > span {span}")
    others, pos = _read_varints(buf, pos, span)
    if others.max() > n or int(others.sum()) >= n:
        raise CorruptPayloadError(f"entropy stream model counts exceed the {n} symbols")
    counts = np.insert(others.astype(np.int64), int(mode), n - int(others.sum()))
    if counts[0] == 0 or counts[-1] == 0 or int(counts.argmax()) != mode:
        raise CorruptPayloadError("entropy stream model is not canonical (unused end or mode)")
    return lo, counts, int(mode), pos


# --- super-symbols -------------------------------------------------------------------------------


def _low_entropy(counts: np.ndarray) -> bool:
    """Fewer than one symbol in 64 differs from the mode (entropy below ~0.12 bit/symbol)."""
    n = int(counts.sum())
    return 64 * (n - int(counts.max())) < n


def group_size(used: int, counts: np.ndarray | None = None) -> int:
    """Symbols per super-symbol for ``used = hi - lo + 1`` distinct symbol values.

    The largest power of two ``k <= 8`` with ``used**k <= 2**13``; for a low-entropy stream
    (``counts`` given, fewer than one symbol in 64 differing from the mode) ``used**k <= 2**8``
    instead [CHOICE]: there the ``2**-24`` probability floor of thousands of super-symbols would
    cost over 0.5% of the entropy. Integer arithmetic only, so sender and receiver always agree.
    """
    limit = _MAX_SUPER
    if counts is not None and _low_entropy(counts):
        limit = _MAX_SUPER_LOW_ENTROPY
    k = 1
    while k < 8 and used ** (2 * k) <= limit:
        k *= 2
    return k


def _shift(counts: np.ndarray) -> int:
    """Digit rotation: symbol ``s`` is coded as digit ``(s - lo - shift) mod used``.

    Low-entropy streams rotate the mode to digit 0 [CHOICE], so the all-mode super-symbol has
    cumulative frequency 0 and the ANS coder's empty start state codes it for free: this saves
    about 10 bits of coder overhead, which matters only when the whole stream is a few hundred
    bytes. Other streams skip the extra pass (shift 0).
    """
    return int(counts.argmax()) if _low_entropy(counts) else 0


@lru_cache(maxsize=32)
def _digit_table(used: int, k: int, lo: int, shift: int, dtype: str) -> np.ndarray:
    """Entry ``c`` holds the ``k`` symbols whose digits are the base-``used`` digits of ``c``
    (symbol ``lo + (digit + shift) mod used``), read-only.

    When the ``k`` symbols fill exactly 2, 4 or 8 bytes the table is returned as one unsigned
    integer per entry, so that decoding is a 1-D gather of whole words.
    """
    values = np.arange(used**k, dtype=np.int64)
    table = np.empty((used**k, k), dtype=dtype)
    for j in range(k):
        table[:, j] = (values + shift) % used + lo
        values //= used
    if table.itemsize * k in (2, 4, 8):
        table = table.view(f"<u{table.itemsize * k}").reshape(-1)
    table.flags.writeable = False
    return table


def _model(counts: np.ndarray, k: int) -> Any:
    """The coder's categorical model over super-symbols (same floats on both sides)."""
    freq = counts.astype(np.float64)
    probs = freq
    for _ in range(k - 1):  # element-wise products only: exactly reproducible anywhere
        probs = np.multiply.outer(freq, probs).reshape(-1)
    return constriction.stream.model.Categorical(probs, perfect=False)


def _compose(digits: np.ndarray, used: int, lo: int, out: np.ndarray) -> None:
    """``out = sum_j (digits[:, j] - lo) * used**j`` (Horner), for a (groups, k) array."""
    k = digits.shape[1]
    np.copyto(out, digits[:, k - 1], casting="unsafe")
    for j in range(k - 2, -1, -1):
        out *= used
        out += digits[:, j]
    if lo:
        out -= lo * ((used**k - 1) // (used - 1))


# --- public API ----------------------------------------------------------------------------------


def _check_alphabet(L: int) -> None:
    if not 1 <= L <= MAX_ALPHABET:
        raise ValueError(f"entropy coding needs an alphabet size in [1, {MAX_ALPHABET}], got {L}")


def entropy_encode(symbols: torch.Tensor, L: int) -> torch.Tensor:
    """Entropy-code a 1-D integer tensor of symbols in ``[0, L)`` into a self-contained uint8
    stream (model first, then the ANS data)."""
    _check_alphabet(L)
    if symbols.dtype.is_floating_point or symbols.dtype.is_complex:
        raise TypeError(f"symbols must be integers, got {symbols.dtype}")
    x = symbols.detach().reshape(-1).cpu().numpy()
    n = x.size
    if n == 0:
        return torch.empty(0, dtype=torch.uint8)
    lo, hi = int(x.min()), int(x.max())
    if lo < 0 or hi >= L:
        raise ValueError(f"symbols must lie in [0, {L}), got values in [{lo}, {hi}]")
    used = hi - lo + 1
    if used == 1:
        return torch.from_numpy(_encode_model(lo, np.array([n]), 0))
    k = group_size(used)
    supers, counts = _supers_and_counts(x, used, lo, k)
    mode, shift = int(counts.argmax()), _shift(counts)
    if shift or group_size(used, counts) != k:  # low entropy: smaller groups, rotated digits
        k = group_size(used, counts)
        lut = (np.arange(hi + 1) - lo - shift) % used
        digits = np.take(lut.astype(np.uint8 if used <= 256 else np.int32), x)
        supers = _supers(digits, used, 0, k)
    if supers.size * k > n:  # pad the last group with the mode
        tail = np.full((1, k), (mode - shift) % used, dtype=np.int64)
        tail[0, : n % k] = (x[n - n % k :] - lo - shift) % used
        _compose(tail, used, 0, supers[-1:])
    coder = constriction.stream.stack.AnsCoder()
    coder.encode_reverse(supers, _model(np.roll(counts, -shift), k))
    data = coder.get_compressed().view(np.uint8)
    data = data[: _trimmed_size(data)]
    return torch.from_numpy(np.concatenate((_encode_model(lo, counts, mode), data)))


def _supers(x: np.ndarray, used: int, lo: int, k: int) -> np.ndarray:
    """Super-symbols of the full groups of ``x``, plus one unset slot for a partial last group."""
    groups, r = divmod(x.size, k)
    supers = np.empty(groups + (r > 0), dtype=np.int32)
    _compose(x[: groups * k].reshape(groups, k), used, lo, supers[:groups])
    return supers


def _supers_and_counts(x: np.ndarray, used: int, lo: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_supers` and the per-symbol counts of the whole stream, taken from the
    super-symbol histogram (a pass over ``n/k`` values instead of ``n``)."""
    supers = _supers(x, used, lo, k)
    groups = x.size // k
    counts = _marginal_counts(np.bincount(supers[:groups], minlength=used**k), used, k)
    counts += np.bincount(x[groups * k :] - lo, minlength=used)
    return supers, counts


def _marginal_counts(hist: np.ndarray, used: int, k: int) -> np.ndarray:
    """Per-symbol counts from a histogram of super-symbols (sum of the k digit marginals)."""
    cube = hist.reshape((used,) * k)
    counts = np.zeros(used, dtype=np.int64)
    for axis in range(k):
        counts += cube.sum(axis=tuple(a for a in range(k) if a != axis))
    return counts


def _trimmed_size(data: np.ndarray) -> int:
    nonzero = np.flatnonzero(data[-4:]) if data.size else data
    return data.size - 4 + int(nonzero[-1]) + 1 if nonzero.size else 0


def entropy_decode(data: torch.Tensor, n: int, L: int) -> torch.Tensor:
    """Inverse of :func:`entropy_encode`: ``n`` symbols, uint8 for ``L <= 256``, else int32.

    Raises a :class:`gradzip.errors.PayloadError` subclass naming the problem on bad bytes.
    """
    _check_alphabet(L)
    if data.dtype != torch.uint8 or data.dim() != 1:
        raise TypeError(f"entropy stream must be a 1-D uint8 tensor, got {data.dtype}")
    dtype = np.uint8 if L <= 256 else np.int32
    buf = data.cpu().numpy()
    if n == 0:
        if buf.size:
            raise CorruptPayloadError(f"entropy stream of 0 symbols has {buf.size} bytes")
        return torch.empty(0, dtype=torch.from_numpy(np.empty(0, dtype)).dtype)
    if buf.size == 0:
        raise TruncatedPayloadError(f"entropy stream of {n} symbols is empty")
    lo, counts, mode, pos = _decode_model(buf, n, L)
    coded = buf[pos:]
    used = counts.size
    if used == 1:
        if coded.size:
            raise CorruptPayloadError(f"entropy stream has {coded.size} bytes after its model")
        return torch.from_numpy(np.full(n, lo, dtype=dtype))
    k, shift = group_size(used, counts), _shift(counts)
    _check_data_size(coded.size, counts, k, shift, -(-n // k))
    supers = _decode_supers(coded, np.roll(counts, -shift), k, -(-n // k))
    out = np.take(_digit_table(used, k, lo, shift, np.dtype(dtype).name), supers, axis=0)
    out = out.view(dtype).reshape(-1)
    if (out[n:] != lo + mode).any():
        raise CorruptPayloadError("entropy stream has a wrong padding symbol")
    _check_histogram(supers, used, k, shift, counts, out.size - n)
    return torch.from_numpy(out[:n] if out.size > n else out)


#: super-symbols an ANS state below the coder's 24-bit precision can yield without reading data
_FREE_DECODES = 1 << 24
_PRECISION = 2.0**-24


def _check_data_size(coded: int, counts: np.ndarray, k: int, shift: int, supers: int) -> None:
    """Refuse, before decoding, a model that needs more coded data than the stream has.

    Every decoded super-symbol costs the coder at least ``-log2 q_max`` bits, ``q_max`` the
    largest quantized super-symbol probability: at most the mode's product ``p_max**k`` plus the
    quantization's leak, and at most ``1 - (A - 1) 2**-24`` as each of the ``A`` super-symbols
    keeps ``2**-24`` of the mass. Two runs are free: super-symbol 0 (cumulative frequency 0)
    decodes from the empty state without data, at most ``ceil(count/k)`` times as its digit's
    count allows, and a state below ``2**24`` yields up to ``2**24`` more. A factor 2 and 96
    bits of coder state keep the bound safe; so a corrupt model claiming 2**28 mixed symbols
    behind a few bytes is refused at once instead of after seconds of decoding.
    """
    n = int(counts.sum())
    present = int(np.count_nonzero(counts)) ** k
    q_max = min(
        1.0 - (present - 1) * _PRECISION, (int(counts.max()) / n) ** k + (present + 1) * _PRECISION
    )
    paid = supers - (-(-int(counts[shift]) // k) + _FREE_DECODES + 1)
    if paid <= 0 or q_max >= 1.0:
        return
    need = paid * -math.log2(q_max) / 2 - 96
    if 8 * coded < need:
        raise CorruptPayloadError(
            f"entropy stream model claims {n} symbols that need at least {int(need) // 8} "
            f"bytes of coded data; the stream has {coded}"
        )


def _decode_supers(coded: np.ndarray, counts: np.ndarray, k: int, count: int) -> np.ndarray:
    if coded.size and coded[-1] == 0:
        raise CorruptPayloadError("entropy stream data ends in a zero byte")
    words = np.zeros(-(-coded.size // 4) * 4, dtype=np.uint8)
    words[: coded.size] = coded
    try:
        supers = np.empty(count, dtype=np.int32)
    except MemoryError as err:
        raise CorruptPayloadError(f"entropy stream claims {count} symbols: too many") from err
    try:
        coder = constriction.stream.stack.AnsCoder(words.view(np.uint32))
        model = _model(counts, k)
        # bounded pieces: the coder allocates its output itself, and a failed allocation
        # inside it aborts the process instead of raising
        for start in range(0, count, _DECODE_PIECE):
            stop = min(start + _DECODE_PIECE, count)
            supers[start:stop] = coder.decode(model, stop - start)
        empty = coder.is_empty()
    except Exception as err:  # constriction reports bad data as ValueError / its own types
        raise CorruptPayloadError(f"entropy stream data is invalid: {err}") from err
    if not empty:
        raise CorruptPayloadError("entropy stream data has coded bits left over after n symbols")
    return supers


def _check_histogram(
    supers: np.ndarray, used: int, k: int, shift: int, counts: np.ndarray, padding: int
) -> None:
    hist = np.bincount(supers, minlength=used**k)
    decoded = np.roll(_marginal_counts(hist, used, k), shift)
    decoded[int(counts.argmax())] -= padding
    if not np.array_equal(decoded, counts):
        raise CorruptPayloadError(
            "entropy stream decodes to a histogram different from its model (corrupt or truncated)"
        )


def model_size(data: torch.Tensor, n: int, L: int) -> int:
    """Bytes taken by the model (histogram) at the front of an entropy stream of ``n`` symbols."""
    _check_alphabet(L)
    if n == 0:
        return 0
    return _decode_model(data.cpu().numpy(), n, L)[3]
