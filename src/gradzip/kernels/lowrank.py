"""The matrix products of PowerSGD as numba kernels with a fixed order of operations.

A rank-``r`` approximation of an ``n x m`` float32 matrix ``M`` needs ``P = M Q``, ``Q = M^T P``,
the orthogonalisation of ``P``'s columns and ``P Q^T``. BLAS computes such products in an order
that depends on the instruction set, the blocking and the thread count, so two machines (or one
machine with another thread count) get different bits, and ranks or a simulated run and a real
one would drift apart; so does the device (torch.matmul's order on CUDA is another). Here every output element is a sum in an order fixed by this code:

* dot products (``P = M Q``, the Gram-Schmidt projections and norms): the products folded
  (second half added onto the first, an odd last element carried, until one is left);
* ``Q = M^T P``: for each output element, a pairwise tree over the rows (adjacent pairs,
  level by level, an odd last one carried);
* ``P Q^T``: the ``r`` terms in order.

Every product and sum is its own IEEE float32 operation (numba without ``fastmath`` neither
reorders nor contracts into fused multiply-adds). Rows (or columns) run in parallel, which
changes no element's order, so the bits do not depend on the thread count or the CPU. The orders are trees of
logarithmic depth so that :mod:`gradzip.kernels.lowrank_torch` computes the same bits with
torch operations on any device (issue 28: the factors of a CUDA rank equal a CPU rank's).

Factors are stored transposed, ``(r, n)`` and ``(r, m)``, so each column is contiguous.

PowerSGD (:mod:`gradzip.schemes.powersgd`) calls the tensor entry points at the end of this
module (:func:`project_into`, :func:`back_project_into`, :func:`orthonormalize_`,
:func:`reconstruct_into`): contiguous float32 CPU tensors, run at torch's thread count.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

from gradzip.kernels._threads import call_parallel

#: columns per parallel task of ``Q = M^T P`` (a block of each row stays in L1)
COLUMN_BLOCK = 256


@njit(inline="always", nogil=True, cache=True)
def dot(a, b):  # type: ignore[no-untyped-def]
    """``sum(a * b)`` of two float32 vectors in the module's fixed order (float32): the products,
    then *folded* (each level adds its second half onto its first, an odd last element carried)
    until one value is left (:func:`gradzip.kernels.lowrank_torch.fold` is the same order)."""
    n = a.size
    if n == 0:
        return np.float32(0.0)
    h = n // 2
    buf = np.empty(h + 1, dtype=np.float32)
    for i in range(h):
        buf[i] = a[i] * b[i] + a[i + h] * b[i + h]
    length = h
    if n & 1:
        buf[h] = a[2 * h] * b[2 * h]
        length = h + 1
    if n == 1:
        return buf[0]
    while length > 1:
        h = length // 2
        for i in range(h):
            buf[i] = buf[i] + buf[i + h]
        if length & 1:
            buf[h] = buf[2 * h]
            length = h + 1
        else:
            length = h
    return buf[0]


@njit(nogil=True, cache=True, parallel=True)
def project(m, qt, pt):  # type: ignore[no-untyped-def]
    """``pt[c, i] = dot(m[i], qt[c])``: ``P = M Q`` with ``qt = Q^T`` and ``pt = P^T``."""
    n = m.shape[0]
    r = qt.shape[0]
    for i in prange(n):
        row = m[i]
        for c in range(r):
            pt[c, i] = dot(row, qt[c])


@njit(nogil=True, cache=True, parallel=True)
def back_project(m, pt, qt, block):  # type: ignore[no-untyped-def]
    """``qt[c, j] = sum_i m[i, j] * pt[c, i]``: ``Q = M^T P``, transposed, each element's sum
    a *pairwise* tree over the rows (adjacent pairs level by level, an odd last one carried:
    :func:`gradzip.kernels.lowrank_torch.pairwise`), computed streaming with a stack of
    partial sums (a binary counter: the same tree). Columns in parallel blocks of ``block``."""
    n, cols = m.shape
    r = pt.shape[0]
    for b in prange((cols + block - 1) // block):
        lo = b * block
        hi = min(cols, lo + block)
        width = hi - lo
        stack = np.empty((65, width), dtype=np.float32)
        for c in range(r):
            p = pt[c]
            top = 0
            # adjacent rows summed at once (the tree's first level), then a binary counter
            for pair in range(n // 2):
                i = 2 * pair
                row0 = m[i, lo:hi]
                row1 = m[i + 1, lo:hi]
                w0 = p[i]
                w1 = p[i + 1]
                cur = stack[top]
                for j in range(width):
                    cur[j] = row0[j] * w0 + row1[j] * w1
                top += 1
                k = pair + 1
                while k & 1 == 0:
                    left = stack[top - 2]
                    right = stack[top - 1]
                    for j in range(width):
                        left[j] = left[j] + right[j]
                    top -= 1
                    k >>= 1
            if n & 1:
                row0 = m[n - 1, lo:hi]
                w0 = p[n - 1]
                cur = stack[top]
                for j in range(width):
                    cur[j] = row0[j] * w0
                top += 1
            out = qt[c, lo:hi]
            pending = stack[top - 1]
            for j in range(width):
                out[j] = pending[j]
            for t in range(top - 2, -1, -1):
                left = stack[t]
                for j in range(width):
                    out[j] = left[j] + out[j]


@njit(nogil=True, cache=True)
def orthonormalize(pt):  # type: ignore[no-untyped-def]
    """Gram-Schmidt on the rows of ``pt`` (the columns of ``P``), in place, in order: each row
    loses its projections on the earlier ones, then is divided by its norm; a row whose norm is
    0 stays 0 (a zero gradient has no direction to keep)."""
    r = pt.shape[0]
    for c in range(r):
        col = pt[c]
        for prev in range(c):
            base = pt[prev]
            coef = dot(base, col)
            for i in range(col.size):
                col[i] -= coef * base[i]
        norm = np.float32(np.sqrt(dot(col, col)))
        if norm > np.float32(0.0):
            for i in range(col.size):
                col[i] = col[i] / norm


@njit(nogil=True, cache=True, parallel=True)
def reconstruct(pt, qt, out):  # type: ignore[no-untyped-def]
    """``out[i, j] = sum_c pt[c, i] * qt[c, j]`` over ``c`` in order: ``P Q^T``."""
    n, cols = out.shape
    r = pt.shape[0]
    for i in prange(n):
        row = out[i]
        w0 = pt[0, i]
        q0 = qt[0]
        for j in range(cols):
            row[j] = w0 * q0[j]
        for c in range(1, r):
            w = pt[c, i]
            q = qt[c]
            for j in range(cols):
                row[j] += w * q[j]


# -- tensor entry points (contiguous float32 CPU tensors, transposed factors) -----------------
def project_into(matrix: torch.Tensor, qt: torch.Tensor, pt: torch.Tensor) -> None:
    """``P = M Q`` written into ``pt`` (:func:`project`)."""
    call_parallel(project, matrix.numpy(), qt.numpy(), pt.numpy())


def back_project_into(matrix: torch.Tensor, pt: torch.Tensor, qt: torch.Tensor) -> None:
    """``Q = M^T P`` written into ``qt`` (:func:`back_project`, :data:`COLUMN_BLOCK` columns a
    task)."""
    call_parallel(back_project, matrix.numpy(), pt.numpy(), qt.numpy(), COLUMN_BLOCK)


def orthonormalize_(pt: torch.Tensor) -> None:
    """Orthonormalize ``P``'s columns in place (:func:`orthonormalize`)."""
    orthonormalize(pt.numpy())


def reconstruct_into(pt: torch.Tensor, qt: torch.Tensor, out: torch.Tensor) -> None:
    """``P Q^T`` written into ``out`` (:func:`reconstruct`)."""
    call_parallel(reconstruct, pt.numpy(), qt.numpy(), out.numpy())
