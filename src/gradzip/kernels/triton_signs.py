"""Triton kernels of one-bit quantization's sign passes (spec 5.1): packing the signs with their
counts and float64 sums, expanding them back (or adding into), and error feedback's residual.

Which function replaces which torch-ops path (the device codecs launch these kernels through
:mod:`gradzip.kernels.triton_device`, which reads nothing back):

* :func:`triton_pack_signs` ``(m)`` returns ``(packed, counts, sums)`` on ``m``'s device, equal
  to :func:`gradzip.kernels.onebit_signs.pack_signs_torch` ``(m)`` and to the arrays of
  :func:`gradzip.kernels.onebit_signs.pack_signs` for a CPU ``m``.
* :func:`triton_expand_signs` ``(packed, means, rows)`` returns ``(values, padding ok)``, equal to
  :func:`gradzip.kernels.onebit_signs.expand_signs_torch`; with ``out`` (``(cols, rows)``
  float32, contiguous) the values are added into it (``add=True``: ``out + V_hat``, one float32
  addition, as :func:`~gradzip.kernels.onebit_signs.expand_add_signs`) or written into it,
  and ``out`` is untouched when a padding bit is set.
* :func:`triton_subtract_reconstruction` ``(m, means, keep)``: ``m -= V_hat`` in place and,
  with ``keep``, ``V_hat`` returned, as :func:`gradzip.kernels.onebit_signs.subtract_reconstruction`.

The float64 column sums keep :mod:`gradzip.kernels.onebit_signs`' defined order exactly
[CHOICE]: a program takes ``WORDS`` 32-entry words of one column (``WORDS`` a power of two, the
program's words starting at a multiple of it), so its per-lane pairwise tree over its words is
one complete subtree of the column's tree (words past the end are ``+0.0``, which changes no
bit: no partial sum is ``-0.0``). The programs' 32 lane sums are then combined with torch on the
device by the same tree of adjacent pairs (padded with ``+0.0`` to a power of two), then the 32
lanes by that tree: every addition is the one the definition makes, a separate IEEE operation
(launched with ``enable_fp_fusion=False``; there is no product to fuse in any case).
Reductions are trees of ``tl.split``, as in :mod:`gradzip.kernels.triton_bitpack`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gradzip.kernels.triton_dispatch import require_triton

#: words (of 32 entries) per program [CHOICE]: 32, i.e. 1024 entries, a power of two (a complete
#: subtree of the pairwise order)
WORDS = 32


@triton.jit
def _lane_tree(x, W: tl.constexpr):  # type: ignore[no-untyped-def]
    """``(W, 32)`` float64 to ``(32,)``: each lane summed over the ``W`` words (a power of two
    up to ``2**16``) by the tree of adjacent pairs, level by level."""
    for k in tl.static_range(16):
        if (W >> (k + 1)) >= 1:
            pairs = tl.permute(tl.reshape(x, (W >> (k + 1), 2, 32)), (0, 2, 1))
            a, b = tl.split(pairs)
            x = a + b
    return tl.reshape(x, (32,))


@triton.jit
def _or_lanes(bits):  # type: ignore[no-untyped-def]
    """``(W, 32)`` disjoint bits (``uint32``) to ``(W,)`` words: five halvings of the lanes."""
    W: tl.constexpr = bits.shape[0]
    for k in tl.static_range(5):
        a, b = tl.split(tl.reshape(bits, (W, 16 >> k, 2)))
        bits = a | b
    return tl.reshape(bits, (W,))


@triton.jit
def _total(x, N: tl.constexpr):  # type: ignore[no-untyped-def]
    """The sum of the ``N`` integers of ``x`` (a power of two up to ``2**16``), shape ``(1,)``."""
    for k in tl.static_range(16):
        if (N >> (k + 1)) >= 1:
            a, b = tl.split(tl.reshape(x, (N >> (k + 1), 2)))
            x = a + b
    return tl.reshape(x, (1,))


@triton.jit
def _pack_kernel(  # type: ignore[no-untyped-def]
    m_ptr, packed_ptr, counts_ptr, sums_ptr, rows, words, nprog, WORDS: tl.constexpr
):
    """Program ``(p, c)``: words ``p*WORDS ..`` of column ``c``: the packed bytes, the counts
    of entries ``>= 0`` and ``< 0`` into ``counts_ptr[c, p, :]``, and the per-lane subtree sums
    of the positive and the negative entries into ``sums_ptr[c, p, 0 | 1, :]``."""
    p = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1).to(tl.int64)
    w = p * WORDS + tl.arange(0, WORDS).to(tl.int64)
    lane = tl.arange(0, 32)
    r = w[:, None] * 32 + lane[None, :]
    inside = r < rows
    x = tl.load(m_ptr + c * rows + r, mask=inside, other=0.0)
    ge = inside & (x >= 0)
    neg = inside & (x < 0)
    word = _or_lanes(ge.to(tl.uint32) << lane[None, :].to(tl.uint32))
    for k in tl.static_range(4):  # little-endian bytes of each word
        byte = ((word >> (8 * k)) & 0xFF).to(tl.uint8)
        tl.store(packed_ptr + c * (4 * words) + 4 * w + k, byte, mask=w < words)
    n_ge = _total(tl.reshape(ge.to(tl.int64), (WORDS * 32,)), WORDS * 32)
    n_neg = _total(tl.reshape(neg.to(tl.int64), (WORDS * 32,)), WORDS * 32)
    slot = (c * nprog + p) * 2 + tl.arange(0, 1)
    tl.store(counts_ptr + slot, n_ge)
    tl.store(counts_ptr + slot + 1, n_neg)
    x64 = x.to(tl.float64)
    # an entry adds to the positive sum if > 0, to the negative if < 0, else +0.0 (a select)
    pos = _lane_tree(tl.where(x64 > 0, x64, 0.0), WORDS)
    below = _lane_tree(tl.where(x64 < 0, x64, 0.0), WORDS)
    base = (c * nprog + p) * 64 + tl.arange(0, 32)
    tl.store(sums_ptr + base, pos)
    tl.store(sums_ptr + base + 32, below)


def _pairs(values: torch.Tensor) -> torch.Tensor:
    """Sum ``(..., n, L)`` float64 over ``n`` by the tree of adjacent pairs, ``n`` padded with
    ``+0.0`` to a power of two: ``(..., L)``."""
    n = values.shape[-2]
    slots = 1 << max(n - 1, 0).bit_length()
    if slots > n:
        pad = torch.zeros((*values.shape[:-2], slots - n, values.shape[-1]), dtype=values.dtype,
                          device=values.device)  # fmt: skip
        values = torch.cat((values, pad), dim=-2)
    while values.shape[-2] > 1:
        values = values[..., 0::2, :] + values[..., 1::2, :]
    return values[..., 0, :]


def triton_pack_signs(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(packed, counts, sums)`` of the ``(cols, rows)`` float32 matrix ``m`` on its device:
    :func:`gradzip.kernels.onebit_signs.pack_signs_torch` (the module docstring)."""
    require_triton(m)
    cols, rows = m.shape
    dev = m.device
    words = -(-rows // 32)
    packed = torch.empty((cols, 4 * words), dtype=torch.uint8, device=dev)
    nprog = max(-(-words // WORDS), 1)
    counts = torch.zeros((cols, nprog, 2), dtype=torch.int64, device=dev)
    partial = torch.zeros((cols, nprog, 2, 32), dtype=torch.float64, device=dev)
    if cols and rows:
        _pack_kernel[(nprog, cols)](
            m.to(torch.float32).contiguous(), packed, counts, partial, rows, words, nprog,
            WORDS=WORDS, enable_fp_fusion=False,
        )  # fmt: skip
    # the programs' subtrees by the tree of words, then the 32 lanes by the same tree
    lanes = _pairs(partial.transpose(1, 2).reshape(cols * 2, nprog, 32))  # (cols*2, 32)
    sums = _pairs(lanes.unsqueeze(-1)).reshape(cols, 2)
    return packed, counts.sum(dim=1), sums


@triton.jit
def _expand_kernel(  # type: ignore[no-untyped-def]
    packed_ptr, means_ptr, out_ptr, rows, words, ADD: tl.constexpr, BLOCK: tl.constexpr
):
    """Entries ``pid0*BLOCK ..`` of column ``pid1``: ``mu+`` where the bit is set, else ``mu-``
    (float32), written or added (``out + v``, one float32 addition)."""
    p = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1).to(tl.int64)
    r = p * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    inside = r < rows
    byte = tl.load(packed_ptr + c * (4 * words) + (r >> 3), mask=inside, other=0)
    bit = (byte.to(tl.uint32) >> (r & 7).to(tl.uint32)) & 1
    hi = tl.load(means_ptr + 2 * c)
    lo = tl.load(means_ptr + 2 * c + 1)
    v = tl.where(bit != 0, hi, lo)
    if ADD:
        v = tl.load(out_ptr + c * rows + r, mask=inside, other=0.0) + v
    tl.store(out_ptr + c * rows + r, v, mask=inside)


def _padding_clear(packed: torch.Tensor, rows: int) -> bool:
    """Whether every column's bits past ``rows`` are zero (the last word's high bits)."""
    tail = rows % 32
    if tail == 0 or packed.numel() == 0:
        return True
    last = packed[:, 4 * (rows // 32) :].to(torch.int64)
    word = last[:, 0] | (last[:, 1] << 8) | (last[:, 2] << 16) | (last[:, 3] << 24)
    return not bool((word >> tail).any())


def triton_expand_signs(
    packed: torch.Tensor,
    means: torch.Tensor,
    rows: int,
    out: torch.Tensor | None = None,
    add: bool = True,
) -> tuple[torch.Tensor, bool]:
    """``(values, padding ok)``: ``(cols, rows)`` float32 ``mu+``/``mu-`` by the bits of
    ``packed`` (``(cols, 4*ceil(rows/32))`` uint8; ``means`` ``(cols, 2)`` float32), or ``out``
    with them added (``add``) or written; nothing is written when a padding bit is set."""
    require_triton(packed)
    cols, dev = packed.shape[0], packed.device
    if out is not None and (
        out.shape != (cols, rows) or out.dtype != torch.float32 or not out.is_contiguous()
    ):
        raise ValueError(f"expands only into a contiguous ({cols}, {rows}) float32 tensor")
    target = torch.empty((cols, rows), dtype=torch.float32, device=dev) if out is None else out
    if not _padding_clear(packed, rows):
        return target, False
    if cols and rows:
        block = 1024
        _expand_kernel[(triton.cdiv(rows, block), cols)](
            packed.contiguous(), means.to(device=dev, dtype=torch.float32).contiguous(), target,
            rows, packed.shape[1] // 4, ADD=out is not None and add, BLOCK=block,
            enable_fp_fusion=False,
        )  # fmt: skip
    return target, True


@triton.jit
def _residual_kernel(  # type: ignore[no-untyped-def]
    m_ptr, means_ptr, vhat_ptr, rows, KEEP: tl.constexpr, BLOCK: tl.constexpr
):
    """``m -= (mu+ if m >= 0 else mu-)`` in place (float32), the selected value into
    ``vhat_ptr`` when ``KEEP``."""
    p = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1).to(tl.int64)
    r = p * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    inside = r < rows
    x = tl.load(m_ptr + c * rows + r, mask=inside, other=0.0)
    sel = tl.where(x >= 0, tl.load(means_ptr + 2 * c), tl.load(means_ptr + 2 * c + 1))
    if KEEP:
        tl.store(vhat_ptr + c * rows + r, sel, mask=inside)
    tl.store(m_ptr + c * rows + r, x - sel, mask=inside)


def triton_subtract_reconstruction(
    m: torch.Tensor, means: torch.Tensor, keep: bool = False
) -> torch.Tensor | None:
    """``m -= V_hat`` in place (``m`` a contiguous ``(cols, rows)`` float32 tensor), returning
    ``V_hat`` when ``keep``: :func:`gradzip.kernels.onebit_signs.subtract_reconstruction`."""
    require_triton(m)
    if not m.is_contiguous() or m.dtype != torch.float32:
        raise ValueError("subtracts only from a contiguous float32 tensor")
    cols, rows = m.shape
    v_hat = torch.empty_like(m) if keep else torch.empty(0, dtype=m.dtype, device=m.device)
    if cols and rows:
        block = 1024
        _residual_kernel[(triton.cdiv(rows, block), cols)](
            m, means.to(device=m.device, dtype=torch.float32).contiguous(), v_hat, rows,
            KEEP=keep, BLOCK=block, enable_fp_fusion=False,
        )  # fmt: skip
    return v_hat if keep else None
