"""PowerSGD's products with torch operations, in :mod:`gradzip.kernels.lowrank`'s order.

The device path of :class:`~gradzip.schemes.powersgd.PowerSGD` (issue 28): the same float32
operations in the same order as the numba kernels, so a CUDA rank's factors equal a CPU rank's
bit for bit. ``torch.matmul`` is not used: its summation order differs between CPU and CUDA
(and between GPU models). Every sum is a tree of elementwise additions of float32 tensors;
every product its own multiplication (no fused or ``alpha=`` operation). The code follows the
fake-CUDA rules of :mod:`gradzip.device` (no indexing, no host reads).
"""

from __future__ import annotations

import torch


def fold(x: torch.Tensor) -> torch.Tensor:
    """The sums of ``x`` over its last dimension, folded: each level adds the second half onto
    the first (an odd last element carried) until one is left (:func:`lowrank.dot`'s order)."""
    length = x.shape[-1]
    if length == 0:
        return torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
    while length > 1:
        h = length // 2
        s = x.narrow(-1, 0, h) + x.narrow(-1, h, h)
        x = torch.cat([s, x.narrow(-1, 2 * h, 1)], dim=-1) if length & 1 else s
        length = x.shape[-1]
    return x.select(-1, 0)


def pairwise(x: torch.Tensor) -> torch.Tensor:
    """The sums of ``x`` over its first dimension, a pairwise tree: adjacent pairs, level by
    level, an odd last one carried (:func:`lowrank.back_project`'s order)."""
    length = x.shape[0]
    while length > 1:
        h = length // 2
        pairs = x.narrow(0, 0, 2 * h).reshape(h, 2, *x.shape[1:])
        s = pairs.select(1, 0) + pairs.select(1, 1)
        x = torch.cat([s, x.narrow(0, 2 * h, 1)]) if length & 1 else s
        length = x.shape[0]
    return x.select(0, 0)


def project(matrix: torch.Tensor, qt: torch.Tensor) -> torch.Tensor:
    """``P^T`` of ``P = M Q`` (``(r, n)``): each element a folded dot of a row and a column."""
    return torch.stack([fold(matrix * q.reshape(1, -1)) for q in qt.unbind(0)])


def back_project(matrix: torch.Tensor, pt: torch.Tensor) -> torch.Tensor:
    """``Q^T`` of ``Q = M^T P`` (``(r, m)``): each element a pairwise sum over the rows."""
    return torch.stack([pairwise(matrix * p.reshape(-1, 1)) for p in pt.unbind(0)])


def orthonormalize(pt: torch.Tensor) -> torch.Tensor:
    """Gram-Schmidt on the rows of ``pt`` in order (a new tensor), as
    :func:`lowrank.orthonormalize`: a row of norm 0 stays 0; nothing is read on the host."""
    rows: list[torch.Tensor] = []
    for col in pt.unbind(0):
        for base in rows:
            coef = fold(base * col)
            col = col - coef * base
        norm = torch.sqrt(fold(col * col))
        col = torch.where(norm > 0, col / torch.where(norm > 0, norm, 1.0), col)
        rows.append(col)
    return torch.stack(rows)


def reconstruct(pt: torch.Tensor, qt: torch.Tensor) -> torch.Tensor:
    """``P Q^T`` (``(n, m)``): the ``r`` outer products added in order."""
    out: torch.Tensor | None = None
    for p, q in zip(pt.unbind(0), qt.unbind(0), strict=True):
        term = p.reshape(-1, 1) * q.reshape(1, -1)
        out = term if out is None else out + term
    assert out is not None
    return out
