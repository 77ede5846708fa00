"""Fused numba kernels for one hop of the pipelined ring: float32 partial sums to packed bytes,
and packed bytes added into float32 partial sums, each in a single pass over the values; and
the integer all-reduce's int32 sums packed (:func:`pack_int_sums`) and added into
(:func:`add_packed_ints`).

The unfused formulation (kept in the tests as the reference) took four full-length passes and
an int32 temporary per hop:

* encode: ``q = requantize(sums)`` (or ``q = int32(sums)`` for an exact sum), then
  ``pack_bits(q)`` and, at the start of the allgather, ``acc = float32(q) * unit``;
* decode: ``q = unpack_bits(body)``, ``q.to(int32)``, then ``acc += float32(q) * unit``.

Here each tile of :data:`TILE` values goes from floats to bytes (or back) while it sits in the
first-level cache: the integers live only in a tile-sized scratch that the vectorized
pack/unpack loops of :mod:`gradzip.kernels.bitpack` read or write [CHOICE: a 4096-value scratch
(16 KiB) rather than symbol-by-symbol arithmetic, so the widths with their own vectorized
layouts (1, 2, 3, 4, 8 bits) keep them].

Bits: every value goes through the float32 operations of the unfused code, in the same order
(``floor(s * factor + (u - 1))``, clamp, int32; ``float32(q) * unit`` then one addition), with
no ``fastmath``, and the packed layout is :func:`gradzip.codecs.bitpack.pack_bits`' (zero
padding bits), so the bytes and sums are bit-identical to it. The local uniforms are drawn
for index ``i`` at index ``i`` (tiles start at multiples of 8, Philox's block), as
:func:`gradzip.kernels.grid_sums.requantize` draws them. Serial kernels [CHOICE] (a chunk is
about a million values and the ring's other ranks share the cores), ``nogil`` (the ring's
worker thread moves bytes meanwhile) and ``cache=True``.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from gradzip.kernels.bitpack import pack_tile, unpack_tile
from gradzip.kernels.packed import check_bits, packed_bytes
from gradzip.kernels.philox import LOCAL_UNIFORM, fill_uniform

#: values per tile [CHOICE]: a multiple of 8 (every tile starts on a byte of the packed stream
#: and on a Philox block) whose int32 scratch and uniforms (32 KiB together) stay in L1/L2
TILE = 1 << 12
_ONE = np.float32(1.0)
_ZERO = np.float32(0.0)


@njit(nogil=True, cache=True)
def _encode_kernel(sums, exact, factor, k0, k1, levels, bits, unit, keep, out):  # type: ignore[no-untyped-def]
    n = sums.size
    q = np.empty(min(n, TILE), dtype=np.uint32)
    scratch = np.empty(min(n, TILE), dtype=np.uint32)
    u = scratch.view(np.float32)
    top = np.float32(levels)
    for lo in range(0, n, TILE):
        hi = min(n, lo + TILE)
        count = hi - lo
        # the tile's own slice indexed from 0: numba wraps an index it cannot prove
        # non-negative (``lo + i``), and that kept these loops from vectorizing
        part = sums[lo:hi]
        if exact:  # the sum as it is: float32 -> int32 truncation, as torch's .to(int32)
            for i in range(count):
                q[i] = np.uint32(np.int32(part[i]))
        else:
            fill_uniform(k0, k1, LOCAL_UNIFORM, lo, scratch[:count])
            for i in range(count):
                v = np.floor(part[i] * factor + (u[i] - _ONE))
                q[i] = np.uint32(np.int32(min(max(v, _ZERO), top)))
        pack_tile(q, 0, count, bits, out[lo * bits // 8 :])
        if keep:  # what every receiver decodes, written over the sums just read
            for i in range(count):
                part[i] = np.float32(np.int32(q[i])) * unit


@njit(nogil=True, cache=True)
def _add_kernel(body, n, bits, unit, replace, acc):  # type: ignore[no-untyped-def]
    q = np.empty(min(n, TILE), dtype=np.uint32)
    for lo in range(0, n, TILE):
        count = min(n, lo + TILE) - lo
        unpack_tile(body, lo, count, bits, q)
        part = acc[lo : lo + count]  # indexed from 0 (see _encode_kernel)
        if replace:
            for i in range(count):
                part[i] = np.float32(np.int32(q[i])) * unit
        else:
            for i in range(count):
                part[i] = part[i] + np.float32(np.int32(q[i])) * unit


@njit(nogil=True, cache=True)
def _add_ints_kernel(body, n, bits, replace, acc):  # type: ignore[no-untyped-def]
    q = np.empty(min(n, TILE), dtype=np.uint32)
    for lo in range(0, n, TILE):
        count = min(n, lo + TILE) - lo
        unpack_tile(body, lo, count, bits, q)
        # the tile's own slice indexed from 0: numba wraps an index it cannot prove
        # non-negative (``lo + i``), and that kept these loops from vectorizing
        part = acc[lo : lo + count]
        if replace:
            for i in range(count):
                part[i] = np.int32(q[i])
        else:
            for i in range(count):
                part[i] = part[i] + np.int32(q[i])


@njit(nogil=True, cache=True)
def _pack_ints_kernel(values, bits, out):  # type: ignore[no-untyped-def]
    n = values.size
    mask = np.uint32((1 << bits) - 1)
    # bits above the width discarded so that no value spills into its neighbours' bits, in a
    # tile's scratch (in L1); a byte tile where the width fits one, so that 2-bit codes take
    # pack_tile's vectorized four-bytes-a-word path
    q8 = np.empty(min(n, TILE) if bits <= 8 else 0, dtype=np.uint8)
    q32 = np.empty(0 if bits <= 8 else min(n, TILE), dtype=np.uint32)
    for lo in range(0, n, TILE):
        count = min(n, lo + TILE) - lo
        part = values[lo : lo + count]  # indexed from 0 (see _add_ints_kernel)
        if bits <= 8:
            for i in range(count):
                q8[i] = np.uint8(np.uint32(part[i]) & mask)
            pack_tile(q8, 0, count, bits, out[lo * bits // 8 :])
        else:
            for i in range(count):
                q32[i] = np.uint32(part[i]) & mask
            pack_tile(q32, 0, count, bits, out[lo * bits // 8 :])


def encode_packed(
    sums: torch.Tensor,
    bits: int,
    out: np.ndarray,
    *,
    exact: bool,
    factor: float = 1.0,
    seed: int = 0,
    unit: float = 1.0,
    keep: bool = False,
) -> None:
    """Pack ``q`` of the float32 ``sums`` at ``bits`` bits into ``out`` (uint8, exactly
    ``ceil(n bits / 8)`` bytes, any prior contents): ``q = int32(sums)`` when ``exact``, else
    ``clamp(floor(sums * factor + u), 0, 2**bits - 1)`` with ``factor`` rounded to float32 and
    ``u = (1 + u') - 1`` the local uniforms of stream ``seed`` (those of
    :func:`~gradzip.kernels.grid_sums.requantize`). With ``keep``, ``sums`` is then replaced by
    ``float32(q) * unit`` (``unit`` rounded to float32): what a receiver of the message decodes.

    ``bits`` at most 24 (float32's exact integers). Variance: that of the stochastic rounding,
    at most ``(1 / factor)**2 / 4`` per value; none when ``exact``.
    """
    values = _checked_hop(sums, out, bits, "encode_packed", "output")
    if values.size == 0:
        return
    _encode_kernel(
        values,
        exact,
        np.float32(factor),
        seed & 0xFFFFFFFF,
        seed >> 32,
        (1 << bits) - 1,
        bits,
        np.float32(unit),
        keep,
        out,
    )


def add_packed(acc: torch.Tensor, body: np.ndarray, bits: int, unit: float, replace: bool) -> None:
    """``acc += float32(q) * unit`` (``acc = ...`` when ``replace``), ``q`` the ``acc.numel()``
    symbols of ``bits`` bits packed in ``body`` (uint8, already checked by
    :func:`~gradzip.kernels.packed.check_packed_size`), ``unit`` rounded to float32; ``acc`` a
    contiguous float32 vector. The bits of ``add_scaled(acc, unpack_bits(body), unit)``."""
    values = _checked_hop(acc, body, bits, "add_packed", "body")
    if values.size:
        _add_kernel(body, values.size, bits, np.float32(unit), replace, values)


def add_packed_ints(acc: torch.Tensor, body: np.ndarray, bits: int, replace: bool) -> None:
    """``acc += q`` (``acc = q`` when ``replace``) for the integer all-reduce's exact code
    sums: ``acc`` a contiguous 1-D int32 vector, ``q`` its ``acc.numel()`` symbols of ``bits``
    bits (at most 31) packed in ``body`` (uint8, already checked by
    :func:`~gradzip.kernels.packed.check_packed_size`). The values of ``acc += unpack_bits(body)``
    in one pass, with no integer temporary of the slice's length (int32 wraps alike in both)."""
    values = _checked_hop(acc, body, bits, "add_packed_ints", "body", torch.int32)
    if values.size:
        _add_ints_kernel(body, values.size, bits, replace, values)


def pack_int_sums(values: torch.Tensor, bits: int, out: np.ndarray) -> None:
    """Pack the integer all-reduce's int32 partial sums ``values`` (a contiguous 1-D vector,
    each in ``[0, 2**bits)``, ``bits`` at most 31) into ``out`` (uint8, exactly ``ceil(n bits /
    8)`` bytes, any prior contents): :func:`~gradzip.codecs.bitpack.pack_bits`' bytes, zero
    padding bits included, without its temporaries. A value beyond the width is packed as its
    low ``bits`` bits (never spilling into its neighbours' bits, which ``pack_bits`` does at
    some widths)."""
    view = _checked_hop(values, out, bits, "pack_int_sums", "output", torch.int32)
    if view.size:
        _pack_ints_kernel(view, bits, out)


#: the widest code each kind of sums holds exactly: float32's integers, int32's non-negative ones
_MAX_BITS = {torch.float32: 24, torch.int32: 31}


def _checked_hop(
    sums: torch.Tensor,
    packed: np.ndarray,
    bits: int,
    name: str,
    role: str,
    dtype: torch.dtype = torch.float32,
) -> np.ndarray:
    """The numpy view of ``sums`` after checking that it is a contiguous 1-D vector of
    ``dtype`` (float32 or int32), that ``bits`` is a width that dtype holds exactly (at most 24
    or 31) and that ``packed`` is a uint8 buffer of exactly the packed size."""
    check_bits(bits)
    kind = str(dtype).removeprefix("torch.")
    if bits > _MAX_BITS[dtype]:
        raise ValueError(f"{name} takes {kind} sums of up to {_MAX_BITS[dtype]} bits, got {bits}")
    if sums.dtype != dtype or sums.dim() != 1 or not sums.is_contiguous():
        raise ValueError(f"{name} takes a contiguous 1-D {kind} tensor, got {sums.dtype}")
    values = sums.numpy()
    if packed.dtype != np.uint8 or packed.size != packed_bytes(values.size, bits):
        raise ValueError(
            f"{name} needs {packed_bytes(values.size, bits)} {role} bytes, got {packed.size}"
        )
    return values
