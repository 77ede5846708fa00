"""The sign-bit passes of one-bit quantization on a tensor's own device (see :mod:`gradzip.device`).

The device twins of :mod:`gradzip.kernels.onebit_signs`' fixed packing: :func:`pack_signs_device`
(the packed bits, the counts and the float64 sums of each column in the order that module
defines), :func:`column_means_device` and :func:`expand_signs_device`. Unlike that module's
torch twins (``pack_signs_torch``, ``expand_signs_torch``), nothing here slices a tensor in
Python or reads a value back to the host, so they also run on fake CUDA tensors.

Where :func:`~gradzip.kernels.triton_device.use_triton` says so (a CUDA tensor with Triton),
packing, expansion and the error-feedback residual are Triton launches instead
(:mod:`gradzip.kernels.triton_signs`), with the same bits and sums; these torch operations stay
the reference and the fallback.

[CHOICE] The float64 sums follow the kernels' order exactly: a column is padded with ``+0.0``
to a power-of-two count of 32-entry words, each lane is summed over the words by the tree of
adjacent pairs, then the 32 lane sums by the same tree; every level is one separate IEEE
addition (no fused or reordered reduction such as ``sum``), so the means are bit-identical.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812

from gradzip.kernels.triton_device import signs_expanded, signs_packed, signs_residual, use_triton

_LANES = 32


def _pairwise(values: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum float64 ``values`` over ``dim`` (a power-of-two length) by the tree of adjacent
    pairs, level by level (``dim`` removed)."""
    while values.shape[dim] > 1:
        half = values.shape[dim] // 2
        shape = (*values.shape[:dim], half, 2, *values.shape[dim + 1 :])
        pairs = values.reshape(shape)
        values = pairs.select(dim + 1, 0) + pairs.select(dim + 1, 1)
    return values.select(dim, 0)


def sign_sums_device(m: torch.Tensor) -> torch.Tensor:
    """The float64 sums of the positive and of the negative entries of each row of the
    ``(cols, rows)`` float32 ``m``: ``(cols, 2)``, bit-identical to ``pack_signs``' sums."""
    cols, rows = m.shape
    words = -(-rows // _LANES)
    slots = 1 << max(words - 1, 0).bit_length()  # the power-of-two count of words
    x = m.to(torch.float64)
    zero = torch.zeros((), dtype=torch.float64, device=m.device)
    sums = []
    for side in (x > 0, x < 0):
        leaves = F.pad(torch.where(side, x, zero), (0, slots * _LANES - rows))
        per_lane = _pairwise(leaves.reshape(cols, slots, _LANES), 1)  # (cols, 32)
        sums.append(_pairwise(per_lane, 1))
    return torch.stack(sums, dim=1)


def pack_signs_device(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(packed, counts, sums)`` of the ``(cols, rows)`` float32 ``m`` (any strides), as
    :func:`gradzip.kernels.onebit_signs.pack_signs`: ``(cols, 4*ceil(rows/32))`` uint8 words
    LSB-first, int64 counts of the entries ``>= 0`` and ``< 0``, float64 sums."""
    if use_triton(m):
        return signs_packed(m)
    cols, rows = m.shape
    words = -(-rows // _LANES)
    dev = m.device
    ge = (m >= 0).to(torch.int64)
    counts = torch.stack((ge.sum(dim=1), (m < 0).to(torch.int64).sum(dim=1)), dim=1)
    bits = F.pad(ge, (0, words * _LANES - rows)).reshape(cols, words, _LANES)
    shifts = torch.arange(_LANES, dtype=torch.int64, device=dev)
    word = (bits << shifts).sum(dim=2)  # disjoint bits: an exact integer sum
    octets = (word.unsqueeze(2) >> (8 * torch.arange(4, dtype=torch.int64, device=dev))) & 0xFF
    return octets.to(torch.uint8).reshape(cols, 4 * words), counts, sign_sums_device(m)


def column_means_device(counts: torch.Tensor, sums: torch.Tensor, rows: int) -> torch.Tensor:
    """:func:`gradzip.kernels.onebit_signs.column_means`' ``(cols, 2)`` float32 means: each a
    float64 division rounded once to float32, 0 for an empty side."""
    n_ge = counts.select(1, 0).to(torch.float64)
    n_neg = (rows - counts.select(1, 0)).to(torch.float64)
    zero = torch.zeros((), dtype=torch.float64, device=sums.device)
    mu_pos = torch.where(n_ge > 0, sums.select(1, 0) / n_ge.clamp(min=1.0), zero)
    mu_neg = torch.where(n_neg > 0, sums.select(1, 1) / n_neg.clamp(min=1.0), zero)
    return torch.stack((mu_pos, mu_neg), dim=1).to(torch.float32)


def expand_signs_device(
    packed: torch.Tensor, means: torch.Tensor, rows: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``V_hat`` (``(cols, rows)`` float32: ``mu+`` where the bit is set, else ``mu-``) from the
    ``(cols, 4*ceil(rows/32))`` uint8 ``packed`` and ``(cols, 2)`` float32 ``means``, and a 0-d
    bool: whether every padding bit is zero."""
    if use_triton(packed):
        return signs_expanded(packed, means, rows)
    cols, width = packed.shape
    shifts = torch.arange(8, dtype=torch.int64, device=packed.device)
    bits = ((packed.to(torch.int64).unsqueeze(2) >> shifts) & 1).reshape(cols, 8 * width)
    padding_clear = ~bits.narrow(1, rows, 8 * width - rows).bool().any()
    values = torch.where(
        bits.narrow(1, 0, rows).bool(), means.narrow(1, 0, 1), means.narrow(1, 1, 1)
    )
    return values, padding_clear


def residual_device(
    m: torch.Tensor, means: torch.Tensor, keep: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Error feedback's ``(m - V_hat, V_hat if keep)``, out of place, with ``V_hat`` selected
    by ``m``'s own signs (``mu+`` where ``m >= 0``, else ``mu-``: what the payload's bits
    decode to); ``(cols, rows)`` float32 ``m``, ``(cols, 2)`` float32 ``means``."""
    if use_triton(m):
        return signs_residual(m, means, keep)
    v_hat = torch.where(m >= 0, means.narrow(1, 0, 1), means.narrow(1, 1, 1))
    return m - v_hat, v_hat if keep else None


__all__ = [
    "column_means_device",
    "expand_signs_device",
    "pack_signs_device",
    "residual_device",
    "sign_sums_device",
]
