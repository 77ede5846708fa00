"""PowerSGD's matrix products as torch operations in the order of :mod:`gradzip.kernels.lowrank`.

The device path's twins of the numba kernels (why a fixed order, and which: see that module):
same products, same pairwise trees, same float32 operations one by one, so a GPU rank's factors
equal a CPU rank's bit for bit. They follow the device rules of :mod:`gradzip.device`: no Python
indexing, no host read, divisions by device tensors, so they also run on fake CUDA tensors.

Factors are transposed as there: ``pt`` is ``(r, n)``, ``qt`` is ``(r, m)``. Each function
returns a fresh tensor on the input's device.

Cost on a device: ``P = M Q`` and ``Q = M^T P`` each take one product tensor of ``M``'s size per
factor column and about ``2 log2(n)`` (or ``log2(m)``) element-wise passes over halving
tensors; Gram-Schmidt and ``P Q^T`` take ``O(r^2)`` small operations.
"""

from __future__ import annotations

import torch

#: lanes of a dot product (``j = l (mod LANES)``), as in :func:`gradzip.kernels.lowrank.dot`
LANES = 8


def pairwise_sum(x: torch.Tensor, dim: int) -> torch.Tensor:
    """The pairwise tree sum of ``x`` along ``dim`` (which disappears): adjacent pairs added
    level by level, an odd last element passing to the next level unchanged. ``x`` must have
    at least one element along ``dim``."""
    length = x.shape[dim]
    while length > 1:
        half = length // 2
        head = x.narrow(dim, 0, 2 * half)
        pairs = head.reshape(*x.shape[:dim], half, 2, *x.shape[dim + 1 :])
        summed = pairs.select(dim + 1, 0) + pairs.select(dim + 1, 1)
        if length % 2:
            summed = torch.cat([summed, x.narrow(dim, length - 1, 1)], dim)
        x, length = summed, half + length % 2
    return x.select(dim, 0)


def dot_rows(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``sum(a * b, dim=1)`` of float32 ``(R, L)`` tensors (``b`` may be ``(1, L)``) in the
    order of :func:`gradzip.kernels.lowrank.dot`: eight lanes of pairwise trees, the lanes
    combined as ``((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7))``, then the last ``L % 8``
    products in order. Returns ``(R,)``."""
    products = a * b
    rows, length = products.shape
    groups = length // LANES
    if groups:
        lanes = products.narrow(1, 0, groups * LANES).reshape(rows, groups, LANES)
        s = pairwise_sum(lanes, 1)
    else:
        s = torch.zeros(rows, LANES, dtype=products.dtype, device=products.device)
    t = s.narrow(1, 0, 4) + s.narrow(1, 4, 4)
    u = t.narrow(1, 0, 2) + t.narrow(1, 2, 2)
    total = u.select(1, 0) + u.select(1, 1)
    for j in range(groups * LANES, length):
        total = total + products.select(1, j)
    return total


def project(matrix: torch.Tensor, qt: torch.Tensor) -> torch.Tensor:
    """``P^T`` of ``P = M Q`` (``matrix`` ``(n, m)``, ``qt = Q^T`` ``(r, m)``): ``(r, n)``."""
    columns = [dot_rows(matrix, qt.narrow(0, c, 1)) for c in range(qt.shape[0])]
    return torch.stack(columns)


def back_project(matrix: torch.Tensor, pt: torch.Tensor) -> torch.Tensor:
    """``Q^T`` of ``Q = M^T P`` (``pt = P^T`` ``(r, n)``): ``(r, m)``, each element the pairwise
    tree over the rows."""
    columns = [pairwise_sum(matrix * pt.select(0, c).unsqueeze(1), 0) for c in range(pt.shape[0])]
    return torch.stack(columns)


def _sqrt(x: torch.Tensor) -> torch.Tensor:
    """The correctly rounded float32 square root of float32 ``x``, on every device.

    [CHOICE] Through float64: torch's float32 ``sqrt`` on the CPU is not always correctly
    rounded (a vectorised approximation, one ulp off for about 0.6% of large inputs measured
    on torch 2.13), while float64's is on every backend, and rounding that to float32 gives
    the correctly rounded float32 root (53 >= 2 * 24 + 2 bits: the double rounding is
    innocuous), the value numba's ``np.sqrt`` computes."""
    return torch.sqrt(x.to(torch.float64)).to(torch.float32)


def orthonormalized(pt: torch.Tensor) -> torch.Tensor:
    """Gram-Schmidt on the rows of ``pt`` in order (:func:`gradzip.kernels.lowrank.orthonormalize`):
    each row loses its projections on the earlier ones (a product, then a difference), then
    is divided by its norm (a device tensor: no reciprocal); a row of norm 0 stays as it is."""
    done: list[torch.Tensor] = []
    for c in range(pt.shape[0]):
        col = pt.select(0, c)
        for base in done:
            coef = dot_rows(base.unsqueeze(0), col.unsqueeze(0))
            col = torch.sub(col, torch.mul(base, coef))
        norm = _sqrt(dot_rows(col.unsqueeze(0), col.unsqueeze(0)))
        col = torch.where(norm > 0, torch.div(col, norm), col)
        done.append(col)
    return torch.stack(done)


def reconstruct(
    pt: torch.Tensor, qt: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``P Q^T`` (``(n, m)``): the ``r`` outer products added in order; written into ``out``
    (an ``(n, m)`` tensor) where given, else into a fresh tensor."""
    first = pt.select(0, 0).unsqueeze(1), qt.select(0, 0).unsqueeze(0)
    result = torch.mul(*first) if out is None else torch.mul(*first, out=out)
    for c in range(1, pt.shape[0]):
        result.add_(pt.select(0, c).unsqueeze(1) * qt.select(0, c).unsqueeze(0))
    return result
