"""The matrix products of PowerSGD as numba kernels with a fixed order of operations.

A rank-``r`` approximation of an ``n x m`` float32 matrix ``M`` needs ``P = M Q``, ``Q = M^T P``,
the orthogonalisation of ``P``'s columns and ``P Q^T``. BLAS computes such products in an order
that depends on the instruction set, the blocking and the thread count, so two machines (or one
machine with another thread count) get different bits, and ranks or a simulated run and a real
one would drift apart. Here every output element
is a sum in an order fixed by this code, the same order as the torch-operation twins of
:mod:`gradzip.kernels.lowrank_torch` (the device path), so a CPU rank and a GPU rank get the same
factor bits:

* the *pairwise tree* of a sequence ``x_0 .. x_{L-1}``: adjacent pairs ``x_0 + x_1, x_2 + x_3,
  ...`` summed level by level, an odd last element passing to the next level unchanged, until
  one value is left (no padding, no zero added). Computed here in one streaming pass with a
  stack of partial sums (a binary counter: the same tree), on the device with ``reshape`` and
  one addition of the two halves of each pair per level;
* dot products (``P = M Q``, the Gram-Schmidt projections and norms): the first ``8 (L // 8)``
  products in eight lanes (index ``j = l (mod 8)``), each lane summed by the pairwise tree,
  the lanes combined as ``((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7))`` (``+0.0`` each
  when ``L < 8``), then the last ``L % 8`` terms added in order;
* ``Q = M^T P``: for each output element, the pairwise tree over the rows ``i``;
* ``P Q^T``: the ``r`` terms in order.

[CHOICE] Trees rather than sequential sums: a sequential sum over ``n`` rows is ``n``
dependent steps on a GPU, a tree ``log2 n`` vectorised ones, while the streaming stack keeps
the CPU kernels at one pass over ``M`` as before (timings in the CHANGELOG of issue 28).

Every product and sum is its own IEEE float32 operation (numba without ``fastmath`` neither
reorders nor contracts into fused multiply-adds). Rows (or columns) run in parallel, which
changes no element's order, so the bits do not depend on the thread count or the CPU.

Factors are stored transposed, ``(r, n)`` and ``(r, m)``, so each column is contiguous.

PowerSGD (:mod:`gradzip.schemes.powersgd`) calls the tensor entry points at the end of this
module (:func:`project_into`, :func:`back_project_into`, :func:`orthonormalize_`,
:func:`reconstruct_into`) and, for its host path, the fused twins :func:`sum_and_project_into`
(``M + e`` and ``P`` in one pass) and :func:`reconstruct_subtracting` (``P Q^T`` and the
residual in one pass): contiguous float32 CPU tensors, run at torch's thread count.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

from gradzip.kernels._threads import call_parallel

#: columns per parallel task of ``Q = M^T P`` (a block of each row stays in L1)
COLUMN_BLOCK = 256


#: depth of the pairwise tree's stack: enough for 2**STACK terms
STACK = 48


@njit(inline="always", nogil=True, cache=True)
def dot(a, b, stack):  # type: ignore[no-untyped-def]
    """``sum(a * b)`` of two float32 vectors in the module's fixed order (float32); ``stack``
    is a ``(STACK, 8)`` float32 scratch array (the eight lanes' pairwise trees)."""
    n = a.size
    groups = n // 8
    top = 0
    # sixteen groups (128 products) at a time: their four lowest tree levels in registers
    for q in range(groups // 16):
        j = 128 * q
        for k in range(8):
            h0 = (a[j + k] * b[j + k] + a[j + 8 + k] * b[j + 8 + k]) + (
                a[j + 16 + k] * b[j + 16 + k] + a[j + 24 + k] * b[j + 24 + k]
            )
            h1 = (a[j + 32 + k] * b[j + 32 + k] + a[j + 40 + k] * b[j + 40 + k]) + (
                a[j + 48 + k] * b[j + 48 + k] + a[j + 56 + k] * b[j + 56 + k]
            )
            h2 = (a[j + 64 + k] * b[j + 64 + k] + a[j + 72 + k] * b[j + 72 + k]) + (
                a[j + 80 + k] * b[j + 80 + k] + a[j + 88 + k] * b[j + 88 + k]
            )
            h3 = (a[j + 96 + k] * b[j + 96 + k] + a[j + 104 + k] * b[j + 104 + k]) + (
                a[j + 112 + k] * b[j + 112 + k] + a[j + 120 + k] * b[j + 120 + k]
            )
            stack[top, k] = (h0 + h1) + (h2 + h3)
        c = q
        while c & 1:  # close the pairs these groups complete (a binary counter)
            for k in range(8):
                stack[top - 1, k] = stack[top - 1, k] + stack[top, k]
            top -= 1
            c >>= 1
        top += 1
    # the last groups (fewer than sixteen) one at a time, the counter going on
    for g in range(16 * (groups // 16), groups):
        j = 8 * g
        for k in range(8):
            stack[top, k] = a[j + k] * b[j + k]
        c = g
        while c & 1:
            for k in range(8):
                stack[top - 1, k] = stack[top - 1, k] + stack[top, k]
            top -= 1
            c >>= 1
        top += 1
    if top == 0:
        for k in range(8):
            stack[0, k] = np.float32(0.0)
        top = 1
    while top > 1:  # the unpaired partial sums, right to left
        for k in range(8):
            stack[top - 2, k] = stack[top - 2, k] + stack[top - 1, k]
        top -= 1
    s = stack[0]
    total = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]))
    for j in range(8 * (n // 8), n):
        total += a[j] * b[j]
    return total


@njit(nogil=True, cache=True, parallel=True)
def project(m, qt, pt):  # type: ignore[no-untyped-def]
    """``pt[c, i] = dot(m[i], qt[c])``: ``P = M Q`` with ``qt = Q^T`` and ``pt = P^T``."""
    n = m.shape[0]
    r = qt.shape[0]
    for i in prange(n):
        stack = np.empty((STACK, 8), dtype=np.float32)
        row = m[i]
        for c in range(r):
            pt[c, i] = dot(row, qt[c], stack)


@njit(nogil=True, cache=True, parallel=True)
def sum_and_project(g, e, has_residual, m, qt, pt):  # type: ignore[no-untyped-def]
    """``m = g + e`` (``m = g`` without a residual), then ``pt[c, i] = dot(m[i], qt[c])``, row
    by row: each row of ``M + e`` is projected while it is still in cache, so ``P = (M + e) Q``
    costs no second pass over the matrix. The same bits as the sum (one IEEE float32 addition
    an element, as ``torch.add``) followed by :func:`project`."""
    n = m.shape[0]
    cols = m.shape[1]
    r = qt.shape[0]
    for i in prange(n):
        stack = np.empty((STACK, 8), dtype=np.float32)
        row = m[i]
        gradient = g[i]
        if has_residual:
            residual = e[i]
            for j in range(cols):
                row[j] = gradient[j] + residual[j]
        else:
            for j in range(cols):
                row[j] = gradient[j]
        for c in range(r):
            pt[c, i] = dot(row, qt[c], stack)


@njit(nogil=True, cache=True, parallel=True)
def back_project(m, pt, qt, block):  # type: ignore[no-untyped-def]
    """``qt[c, j] = sum_i m[i, j] * pt[c, i]`` by the pairwise tree over ``i``: ``Q = M^T P``,
    transposed. Columns in parallel blocks of ``block``; one streaming pass over the rows
    with a stack of partial rows per factor column."""
    n, cols = m.shape
    r = pt.shape[0]
    for b in prange((cols + block - 1) // block):
        lo = b * block
        hi = min(cols, lo + block)
        w = hi - lo
        stack = np.empty((STACK, w), dtype=np.float32)
        for c in range(r):
            p = pt[c]
            top = 0
            # eight rows at a time: their three lowest tree levels in one pass
            for q in range(n // 8):
                i = 8 * q
                r0, r1, r2, r3 = m[i, lo:hi], m[i + 1, lo:hi], m[i + 2, lo:hi], m[i + 3, lo:hi]
                r4, r5, r6, r7 = m[i + 4, lo:hi], m[i + 5, lo:hi], m[i + 6, lo:hi], m[i + 7, lo:hi]
                x0, x1, x2, x3 = p[i], p[i + 1], p[i + 2], p[i + 3]
                x4, x5, x6, x7 = p[i + 4], p[i + 5], p[i + 6], p[i + 7]
                new = stack[top]
                for j in range(w):
                    new[j] = ((r0[j] * x0 + r1[j] * x1) + (r2[j] * x2 + r3[j] * x3)) + (
                        (r4[j] * x4 + r5[j] * x5) + (r6[j] * x6 + r7[j] * x7)
                    )
                k = q
                while k & 1:  # close the pairs these rows complete (a binary counter)
                    left = stack[top - 1]
                    for j in range(w):
                        left[j] = left[j] + new[j]
                    new = left
                    top -= 1
                    k >>= 1
                top += 1
            # the last rows (fewer than eight) one at a time, the counter going on
            for i in range(8 * (n // 8), n):
                row = m[i, lo:hi]
                x = p[i]
                new = stack[top]
                for j in range(w):
                    new[j] = row[j] * x
                k = i
                while k & 1:
                    left = stack[top - 1]
                    for j in range(w):
                        left[j] = left[j] + new[j]
                    new = left
                    top -= 1
                    k >>= 1
                top += 1
            while top > 1:
                left = stack[top - 2]
                right = stack[top - 1]
                for j in range(w):
                    left[j] = left[j] + right[j]
                top -= 1
            out = qt[c, lo:hi]
            if top == 0:
                for j in range(w):
                    out[j] = np.float32(0.0)
            else:
                first = stack[0]
                for j in range(w):
                    out[j] = first[j]


@njit(nogil=True, cache=True)
def orthonormalize(pt):  # type: ignore[no-untyped-def]
    """Gram-Schmidt on the rows of ``pt`` (the columns of ``P``), in place, in order: each row
    loses its projections on the earlier ones (``x - c * b``: a product, then a difference),
    then is divided by its norm; a row whose norm is 0 stays 0 (a zero gradient has no
    direction to keep)."""
    r = pt.shape[0]
    stack = np.empty((STACK, 8), dtype=np.float32)
    for c in range(r):
        col = pt[c]
        for prev in range(c):
            base = pt[prev]
            coef = dot(base, col, stack)
            for i in range(col.size):
                col[i] -= coef * base[i]
        norm = np.float32(np.sqrt(dot(col, col, stack)))
        if norm > np.float32(0.0):
            for i in range(col.size):
                col[i] = col[i] / norm


@njit(inline="always", nogil=True, cache=True)
def _reconstruct_row(pt, qt, i, row):  # type: ignore[no-untyped-def]
    """``row[j] = sum_c pt[c, i] * qt[c, j]`` over ``c`` in order (row ``i`` of ``P Q^T``)."""
    cols = row.size
    w0 = pt[0, i]
    q0 = qt[0]
    for j in range(cols):
        row[j] = w0 * q0[j]
    for c in range(1, pt.shape[0]):
        w = pt[c, i]
        q = qt[c]
        for j in range(cols):
            row[j] += w * q[j]


@njit(nogil=True, cache=True, parallel=True)
def reconstruct(pt, qt, out):  # type: ignore[no-untyped-def]
    """``out[i, j] = sum_c pt[c, i] * qt[c, j]`` over ``c`` in order: ``P Q^T``."""
    for i in prange(out.shape[0]):
        _reconstruct_row(pt, qt, i, out[i])


@njit(nogil=True, cache=True, parallel=True)
def reconstruct_and_subtract(pt, qt, out, m, subtract):  # type: ignore[no-untyped-def]
    """:func:`reconstruct` into ``out`` and, with ``subtract``, ``m -= out`` row by row while
    the row of ``out`` is in cache (the residual ``(M + e) - P Q^T`` without a second pass over
    the approximation). The same bits as :func:`reconstruct` then ``m.sub_(out)`` (one IEEE
    float32 subtraction an element)."""
    n, cols = out.shape
    for i in prange(n):
        row = out[i]
        _reconstruct_row(pt, qt, i, row)
        if subtract:
            residual = m[i]
            for j in range(cols):
                residual[j] = residual[j] - row[j]


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


def sum_and_project_into(
    gradient: torch.Tensor,
    residual: torch.Tensor | None,
    matrix: torch.Tensor,
    qt: torch.Tensor,
    pt: torch.Tensor,
) -> None:
    """``M + e`` (``gradient + residual``, or ``gradient``) written into ``matrix`` and ``P =
    (M + e) Q`` into ``pt`` in one pass (:func:`sum_and_project`); ``gradient`` and
    ``residual`` are left as they are."""
    g = gradient.numpy()
    e = g if residual is None else residual.numpy()
    call_parallel(
        sum_and_project, g, e, residual is not None, matrix.numpy(), qt.numpy(), pt.numpy()
    )


def reconstruct_subtracting(
    pt: torch.Tensor, qt: torch.Tensor, out: torch.Tensor, matrix: torch.Tensor | None
) -> None:
    """``P Q^T`` written into ``out`` and, when ``matrix`` is given, subtracted from it in the
    same pass (:func:`reconstruct_and_subtract`)."""
    m = out.numpy() if matrix is None else matrix.numpy()
    call_parallel(
        reconstruct_and_subtract, pt.numpy(), qt.numpy(), out.numpy(), m, matrix is not None
    )
