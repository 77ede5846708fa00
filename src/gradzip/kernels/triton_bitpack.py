"""Fixed-width bit packing inside Triton kernels: the layout of :mod:`gradzip.codecs.bitpack`
(one little-endian, LSB-first bit stream, symbol ``j`` in bits ``j*b .. j*b + b - 1``, zero
padding bits), the device twin of :mod:`gradzip.kernels.bitpack` and
:mod:`gradzip.kernels.bitpack_torch`, for ``1 <= b <= 32``.

A program handles a run of ``BLOCK`` symbols (a multiple of 8) starting at a multiple of 8, so it
owns whole bytes: ``BLOCK * b / 8`` of them, ``b`` per group of eight symbols. Integer operations
only.

Reductions are trees of ``tl.split`` and elementwise operations, not ``tl.sum``/``tl.max``
[CHOICE]: those (and ``tl.zeros``) are ``@triton.jit`` functions of Triton's own library, defined
in the mode in force when ``triton`` was first imported; compiled ones cannot be called from an
interpreted kernel, so with them the interpreter tests would depend on import order. Only
builtins are used in the kernel modules here, except :func:`max_of`'s compiled branch.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton import knobs

#: whether this module's kernels run in Triton's interpreter: decided, as by ``@triton.jit``
#: itself, when the module is imported (a constexpr, so the kernels branch on it when traced)
_INTERPRETED = tl.constexpr(bool(knobs.runtime.interpret))


@triton.jit
def pack_store(sym, packed_ptr, first, nbytes, BLOCK: tl.constexpr, BITS: tl.constexpr):  # type: ignore[no-untyped-def]
    """Store the ``BLOCK`` symbols ``sym`` (non-negative, below ``2**BITS``; zero past the end
    of the stream, so the padding bits are zero) of elements ``first ..`` (``first`` a multiple
    of 8) into the bytes ``first * BITS / 8 ..`` of ``packed_ptr``, skipping bytes ``>=
    nbytes``. Byte ``k`` of a group of eight symbols is the sum (the bits are disjoint: an or)
    of each overlapping symbol shifted to its position in that byte."""
    G: tl.constexpr = BLOCK // 8
    s = tl.reshape(sym.to(tl.uint32), (G, 8))
    j = tl.arange(0, 8)[None, :]
    byte0 = first // 8 * BITS + tl.arange(0, G).to(tl.int64) * BITS
    for k in tl.static_range(BITS):
        shift = j * BITS - 8 * k  # where symbol j's bit 0 lands relative to byte k's bit 0
        overlap = (shift < 8) & (shift > -BITS)
        # shift amounts clamped to the type's width: a shift by 32 or more is undefined on GPUs
        left = tl.minimum(tl.maximum(shift, 0), 31).to(tl.uint32)
        right = tl.minimum(tl.maximum(-shift, 0), 31).to(tl.uint32)
        part = tl.where(overlap, ((s << left) >> right) & 0xFF, 0)
        byte = _or_of_eight(part, G)
        where = byte0 + k
        tl.store(packed_ptr + where, byte.to(tl.uint8), mask=where < nbytes)


@triton.jit
def unpack_load(packed_ptr, idx, mask, nbytes, BITS: tl.constexpr):  # type: ignore[no-untyped-def]
    """The ``BITS``-bit symbols of elements ``idx`` (int64 tensor; ``mask`` the valid ones) as
    int64: the up to five bytes holding bits ``idx*BITS .. idx*BITS + BITS - 1`` gathered into
    a ``uint64``, shifted and masked. Masked-off elements read 0."""
    SPAN: tl.constexpr = (BITS + 14) // 8  # bytes a symbol can touch (starting at bit 0..7)
    bit = idx * BITS
    byte0 = bit >> 3
    word = tl.full(idx.shape, 0, tl.uint64)
    for t in tl.static_range(SPAN):
        where = byte0 + t
        b = tl.load(packed_ptr + where, mask=mask & (where < nbytes), other=0)
        word = word | (b.to(tl.uint64) << (8 * t))
    sym = (word >> (bit & 7).to(tl.uint64)) & ((1 << BITS) - 1)
    return sym.to(tl.int64)


@triton.jit
def _or_of_eight(x, G: tl.constexpr):  # type: ignore[no-untyped-def]
    """The or of each row of ``x`` (``G`` rows of 8): three halvings of the rows."""
    a, b = tl.split(tl.reshape(x, (G, 4, 2)))
    a, b = tl.split(tl.reshape(a | b, (G, 2, 2)))
    a, b = tl.split(tl.reshape(a | b, (G, 1, 2)))
    return tl.reshape(a | b, (G,))


@triton.jit
def max_of(x, N: tl.constexpr):  # type: ignore[no-untyped-def]
    """The largest of the ``N`` integers of ``x`` (a power of two up to ``2**16``), as a tensor
    of shape ``(1,)``. Compiled: ``tl.max`` (an integer maximum: the order does not matter; the
    halving tree below took 12 s to compile for 1024 elements). Interpreted: one halving per
    bit of ``N`` (``tl.static_range`` unrolls and the conditions are constexpr, so the shape
    may shrink)."""
    if _INTERPRETED:
        for k in tl.static_range(16):
            if (N >> (k + 1)) >= 1:
                a, b = tl.split(tl.reshape(x, (N >> (k + 1), 2)))
                x = tl.maximum(a, b)
        top = tl.reshape(x, (1,))
    else:
        top = tl.max(x, axis=0, keep_dims=True)
    return top
