"""The matrix products of PowerSGD as numba kernels with a fixed order of operations.

A rank-``r`` approximation of an ``n x m`` float32 matrix ``M`` needs ``P = M Q``, ``Q = M^T P``,
the orthogonalisation of ``P``'s columns and ``P Q^T``. BLAS computes such products in an order
that depends on the instruction set, the blocking and the thread count, so two machines (or one
machine with another thread count) get different bits, and ranks or a simulated run and a real
one would drift apart. Here every output element is a sum in an order fixed by this code:

* dot products (``P = M Q``, the Gram-Schmidt projections and norms): eight partial sums over
  the indices ``j = l (mod 8)``, combined as ``((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 +
  s7))``, then the last ``len % 8`` terms in order;
* ``Q = M^T P``: for each output element, the rows ``i = 0, 1, ...`` in order;
* ``P Q^T``: the ``r`` terms in order.

Every product and sum is its own IEEE float32 operation (numba without ``fastmath`` neither
reorders nor contracts into fused multiply-adds). Rows (or columns) run in parallel, which
changes no element's order, so the bits do not depend on the thread count or the CPU.

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
    """``sum(a * b)`` of two float32 vectors in the module's fixed order (float32)."""
    n = a.size
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = np.float32(0.0)
    j = 0
    while j + 8 <= n:
        s0 += a[j] * b[j]
        s1 += a[j + 1] * b[j + 1]
        s2 += a[j + 2] * b[j + 2]
        s3 += a[j + 3] * b[j + 3]
        s4 += a[j + 4] * b[j + 4]
        s5 += a[j + 5] * b[j + 5]
        s6 += a[j + 6] * b[j + 6]
        s7 += a[j + 7] * b[j + 7]
        j += 8
    total = ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7))
    while j < n:
        total += a[j] * b[j]
        j += 1
    return total


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
    """``qt[c, j] = sum_i m[i, j] * pt[c, i]`` over ``i`` in order: ``Q = M^T P``, transposed.
    Columns in parallel blocks of ``block``; each element's sum runs over the rows in order."""
    n, cols = m.shape
    r = pt.shape[0]
    for b in prange((cols + block - 1) // block):
        lo = b * block
        hi = min(cols, lo + block)
        for c in range(r):
            out = qt[c, lo:hi]
            for j in range(hi - lo):
                out[j] = np.float32(0.0)
            p = pt[c]
            for i in range(n):
                row = m[i, lo:hi]
                w = p[i]
                for j in range(hi - lo):
                    out[j] += row[j] * w


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
