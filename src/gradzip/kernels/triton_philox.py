"""Philox4x32-10 float streams inside Triton kernels: the device twin of
:func:`gradzip.kernels.philox.fill_uniform` (same words, same floats, bit for bit).

The stream layout is :mod:`gradzip.kernels.philox`'s contract: key ``(seed & 0xFFFFFFFF,
seed >> 32)``, counter ``(block & 0xFFFFFFFF, block >> 32, domain, 0)``, float element ``i`` the
16-bit half ``i % 2`` (low half first) of word ``(i // 2) % 4`` of block ``i // 8``, stored as the
float32 with bit pattern ``0x3F800040 | (h << 7)`` (``1 + (h + 1/2) * 2**-16``, exactly).

The rounds are written with explicit 32-bit unsigned operations (``tl.umulhi`` for the high
half of each 32x32-bit product, a wrapping ``uint32`` multiply for the low half, wrapping adds
for the key schedule) [CHOICE]: ``tl.rand`` uses Philox too, but with its own counter and key
layout and float conversion, so it is not used. Only integer operations: nothing here depends
on floating-point contraction.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gradzip.kernels.triton_dispatch import require_triton
from gradzip.kernels.triton_launch import BLOCK, philox_key, programs

# multipliers and Weyl constants; constexpr, as compiled kernels may read no other globals
_M0 = tl.constexpr(0xD2511F53)
_M1 = tl.constexpr(0xCD9E8D57)
_W0 = tl.constexpr(0x9E3779B9)
_W1 = tl.constexpr(0xBB67AE85)
#: float elements of one Philox block (four words, two 16-bit halves each)
FLOATS_PER_BLOCK = 8


@triton.jit
def philox_rounds(c0, c1, c2, c3, k0, k1):  # type: ignore[no-untyped-def]
    """The four output words (``uint32``) of counter ``(c0..c3)`` under key ``(k0, k1)``, all
    ``uint32``: ten rounds, the key bumped by the Weyl constants between rounds."""
    for _ in tl.static_range(10):
        # the constants are constexpr ints below 2**32: typed uint32 against the uint32 words
        hi0 = tl.umulhi(c0, _M0)
        lo0 = tl.mul(c0, _M0, sanitize_overflow=False)  # wraps: the low 32 bits
        hi1 = tl.umulhi(c2, _M1)
        lo1 = tl.mul(c2, _M1, sanitize_overflow=False)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = tl.add(k0, _W0, sanitize_overflow=False)
        k1 = tl.add(k1, _W1, sanitize_overflow=False)
    return c0, c1, c2, c3


@triton.jit
def _block_words(block, k0, k1, stream):  # type: ignore[no-untyped-def]
    """The four words of Philox block ``block`` (int64 tensor) of domain ``stream``."""
    c0 = (block & 0xFFFFFFFF).to(tl.uint32)
    c1 = (block >> 32).to(tl.uint32)
    c2 = (c0 & 0) | tl.cast(stream, tl.uint32)
    c3 = c0 & 0
    return philox_rounds(c0, c1, c2, c3, tl.cast(k0, tl.uint32), tl.cast(k1, tl.uint32))


@triton.jit
def _one_plus_uniform(h):  # type: ignore[no-untyped-def]
    """float32 ``1 + (h + 1/2) * 2**-16`` of 16-bit halves ``h`` (``uint32``), by bit pattern."""
    return ((h << 7) | 0x3F800040).to(tl.float32, bitcast=True)


@triton.jit
def uniform_run(start, k0, k1, stream, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    """Float elements ``start .. start + BLOCK - 1`` (``start`` a multiple of 8, ``BLOCK`` of 8)
    of stream ``(k0, k1, stream)`` as float32 ``1 + u``: one Philox block per eight elements,
    its words interleaved into stream order by joins and a row-major reshape."""
    NB: tl.constexpr = BLOCK // 8
    block = start // 8 + tl.arange(0, NB).to(tl.int64)
    w0, w1, w2, w3 = _block_words(block, k0, k1, stream)
    # join(join(w0, w2), join(w1, w3))[b, p, q] is word 2p + q: row-major, words 0, 1, 2, 3
    words = tl.reshape(tl.join(tl.join(w0, w2), tl.join(w1, w3)), (4 * NB,))
    # [word, half], low half first: element 2*word + half
    halves = tl.reshape(tl.join(words & 0xFFFF, words >> 16), (BLOCK,))
    return _one_plus_uniform(halves)


@triton.jit
def uniform_at(idx, k0, k1, stream):  # type: ignore[no-untyped-def]
    """Float elements ``idx`` (int64 tensor, any offsets) of stream ``(k0, k1, stream)``, each
    from its own Philox block (eight times the work of :func:`uniform_run`: for draws that do
    not start on a block boundary)."""
    w0, w1, w2, w3 = _block_words(idx >> 3, k0, k1, stream)
    word = (idx >> 1) & 3
    w = tl.where(word == 0, w0, tl.where(word == 1, w1, tl.where(word == 2, w2, w3)))
    h = tl.where((idx & 1) == 0, w & 0xFFFF, w >> 16)
    return _one_plus_uniform(h)


@triton.jit
def _uniform_kernel(out_ptr, offset, n, k0, k1, stream, RUN: tl.constexpr, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    """Float elements ``offset + pid*BLOCK ..`` of a stream into ``out_ptr`` (float32), by
    :func:`uniform_run` (``RUN``: ``offset`` a multiple of 8) or :func:`uniform_at`."""
    pid = tl.program_id(0).to(tl.int64)
    j = pid * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    if RUN:
        o = uniform_run(tl.cast(offset, tl.int64) + pid * BLOCK, k0, k1, stream, BLOCK)
    else:
        o = uniform_at(tl.cast(offset, tl.int64) + j, k0, k1, stream)
    tl.store(out_ptr + j, o, mask=j < n)


def triton_one_plus_uniform(
    seed: int,
    stream: int,
    offset: int,
    n: int,
    device: torch.device | str,
    per_element: bool = False,
) -> torch.Tensor:
    """``n`` float32 ``1 + u`` of the float stream ``(seed, stream)`` from element ``offset``
    on ``device``: :func:`gradzip.kernels.philox_torch.philox_one_plus_uniform_torch` (same
    arguments) in one launch. Block runs where ``offset`` is a multiple of 8, unless
    ``per_element`` (one Philox block per element, as the unaligned draws use)."""
    out = torch.empty(n, dtype=torch.float32, device=device)
    require_triton(out)
    if n == 0:
        return out
    run = offset % FLOATS_PER_BLOCK == 0 and not per_element
    _uniform_kernel[(programs(n),)](
        out, offset, n, *philox_key(seed), stream, RUN=run, BLOCK=BLOCK,
        enable_fp_fusion=False,
    )  # fmt: skip
    return out
