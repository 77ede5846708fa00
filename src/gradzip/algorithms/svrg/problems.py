"""Finite-sum problems ``f(x) = (1/n) sum_i f_i(x)`` over a data set (spec 3.1 [SEED]).

LPC-SVRG and ALPC-SVRG need only mini-batch gradients, gradients over contiguous shards (for
the per-epoch full gradient) and the loss; :class:`FiniteSum` is that interface, on a flat
parameter vector ``x``. Two problems are built in, the linear models of the paper's experiments:

* :class:`LeastSquares`: ``f_i(x) = (a_i^T x - y_i)^2 / 2`` (spec 3.8 [CHOICE]);
  ``L_i = ||a_i||^2``.
* :class:`Logistic`: ``f_i(x) = log(1 + exp(-y_i a_i^T x))`` with labels ``y_i in {-1, +1}``;
  ``L_i = ||a_i||^2 / 4``.

Any ``torch.nn.Module`` with a loss is :class:`~gradzip.algorithms.svrg.module_problem.ModuleProblem`.
The nonsmooth part ``h`` is not part of the problem: it is a proximal operator
(:mod:`gradzip.algorithms.svrg.prox`).

Every rank of a data-parallel run holds the whole data set (the paper's Section 3.1: "each
worker can get access to the whole datasets"); ranks differ only in the indices they sample.
Computations are deterministic (the same indices and ``x`` give the same bits on every rank).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from gradzip.algorithms.svrg.spectrum import CGResult, least_squares_cg

_FLOATS = (torch.float32, torch.float64)


def check_data(a: torch.Tensor, y: torch.Tensor, what: str) -> None:
    """Raise ``ValueError`` naming the problem unless ``a`` is a finite ``n x d`` float matrix
    and ``y`` a finite vector of ``n`` values of the same dtype."""
    if not isinstance(a, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise TypeError(f"{what}: features and targets must be torch tensors")
    if a.dim() != 2 or a.shape[0] == 0 or a.shape[1] == 0:
        raise ValueError(f"{what}: features must be a non-empty n x d matrix, got {tuple(a.shape)}")
    if y.dim() != 1 or y.shape[0] != a.shape[0]:
        raise ValueError(
            f"{what}: targets must be a vector of {a.shape[0]} values, got {tuple(y.shape)}"
        )
    if a.dtype not in _FLOATS or y.dtype != a.dtype:
        raise ValueError(
            f"{what}: features and targets must both be float32 or float64, got {a.dtype} and "
            f"{y.dtype}"
        )
    if not bool(torch.isfinite(a).all()) or not bool(torch.isfinite(y).all()):
        raise ValueError(f"{what}: the data hold NaN or Inf")


class FiniteSum(ABC):
    """``f(x) = (1/n) sum_{i<n} f_i(x)`` on a flat vector ``x`` of ``dim`` entries of ``dtype``.

    Subclasses implement :meth:`grad_sum` and :meth:`loss_sum`; the rest has defaults.
    """

    n: int
    dim: int
    dtype: torch.dtype

    @abstractmethod
    def grad_sum(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """``sum_{i in idx} grad f_i(x)`` (``idx``: int64 indices, repeats counted)."""

    @abstractmethod
    def loss_sum(self, x: torch.Tensor, start: int, stop: int) -> float:
        """``sum_{start <= i < stop} f_i(x)``."""

    def grad_range(self, x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """``sum_{start <= i < stop} grad f_i(x)``: one rank's shard of the full gradient."""
        return self.grad_sum(x, torch.arange(start, stop))

    def grad_diff_mean(
        self, x: torch.Tensor, x_ref: torch.Tensor, idx: torch.Tensor
    ) -> torch.Tensor:
        """``(1/|idx|) sum_{i in idx} (grad f_i(x) - grad f_i(x_ref))``: the SVRG correction."""
        return (self.grad_sum(x, idx) - self.grad_sum(x_ref, idx)) / idx.numel()

    def loss(self, x: torch.Tensor) -> float:
        """``f(x)``, the mean over the whole data set."""
        return self.loss_sum(x, 0, self.n) / self.n

    def full_grad(self, x: torch.Tensor) -> torch.Tensor:
        """``grad f(x)`` computed on one rank (tests and references)."""
        return self.grad_range(x, 0, self.n) / self.n

    def smoothness(self) -> float:
        """``L = max_i L_i``, the smoothness of every ``f_i`` (spec 3.1's assumption)."""
        raise NotImplementedError(
            f"{type(self).__name__} does not know its smoothness constant; pass the step sizes "
            "explicitly"
        )

    def strong_convexity(self) -> float:
        """A strong-convexity constant of ``f`` (0 when unknown or not strongly convex)."""
        return 0.0

    def zeros(self) -> torch.Tensor:
        """The starting point ``x0 = 0``."""
        return torch.zeros(self.dim, dtype=self.dtype)

    def check_point(self, x: torch.Tensor, what: str = "x") -> torch.Tensor:
        """``x`` as a contiguous vector of this problem's dtype; ``ValueError`` otherwise."""
        if not isinstance(x, torch.Tensor) or x.dim() != 1 or x.numel() != self.dim:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"{what} must be a vector of {self.dim} entries, got {got}")
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"{what} holds NaN or Inf")
        return x.detach().to(self.dtype).contiguous().clone()


class _Linear(FiniteSum):
    """Models of ``a_i^T x``: data ``A`` (n x d) and targets ``y``."""

    what = "linear model"

    def __init__(self, features: torch.Tensor, targets: torch.Tensor) -> None:
        check_data(features, targets, self.what)
        self.A = features.contiguous()
        self.y = targets.contiguous()
        self.n, self.dim = self.A.shape
        self.dtype = self.A.dtype

    @abstractmethod
    def _residual_grad(self, margins: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``d f_i / d(a_i^T x)`` for the rows' margins ``a_i^T x``."""

    @abstractmethod
    def _losses(self, margins: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``f_i`` from the margins."""

    def grad_sum(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        rows = self.A[idx]
        return rows.T @ self._residual_grad(rows @ x, self.y[idx])

    def grad_range(self, x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        rows = self.A[start:stop]  # a view: no copy of the shard
        return rows.T @ self._residual_grad(rows @ x, self.y[start:stop])

    def loss_sum(self, x: torch.Tensor, start: int, stop: int) -> float:
        rows = self.A[start:stop]
        return float(self._losses(rows @ x, self.y[start:stop]).sum())

    def row_norms_squared(self) -> torch.Tensor:
        """``||a_i||^2`` per row (float64; block by block, so a large ``A`` is not copied)."""
        return torch.cat(
            [self.A[lo : lo + 4096].double().pow(2).sum(1) for lo in range(0, self.n, 4096)]
        )


class LeastSquares(_Linear):
    """Linear regression, ``f_i(x) = (a_i^T x - y_i)^2 / 2`` (spec 3.8 [CHOICE]).

    ``L_i = ||a_i||^2``; ``f`` is ``lambda_min(A^T A / n)``-strongly convex (0 when ``n < d``).
    The SVRG correction is computed as ``A_I^T A_I (x - x_ref) / |I|`` (one product instead
    of two gradients; equal up to rounding).

    The optimum and the Hessian's extreme eigenvalues are exact (dense, float64) up to
    ``d = DENSE_LIMIT``; above it they come from conjugate gradients on the normal equations
    and their Lanczos coefficients (:mod:`~gradzip.algorithms.svrg.spectrum`), computed once.
    """

    what = "least squares"
    #: largest ``d`` whose ``A^T A`` is formed and diagonalised densely
    DENSE_LIMIT = 4096

    def __init__(self, features: torch.Tensor, targets: torch.Tensor) -> None:
        super().__init__(features, targets)
        self._cg: CGResult | None = None

    def _solved(self) -> CGResult:
        if self._cg is None:
            self._cg = least_squares_cg(self.A, self.y)
        return self._cg

    def _residual_grad(self, margins: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return margins - y

    def _losses(self, margins: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (margins - y).pow(2).mul(0.5)

    def grad_diff_mean(
        self, x: torch.Tensor, x_ref: torch.Tensor, idx: torch.Tensor
    ) -> torch.Tensor:
        rows = self.A[idx]
        return rows.T @ (rows @ (x - x_ref)) / idx.numel()

    def smoothness(self) -> float:
        return float(self.row_norms_squared().max())

    def hessian_extremes(self) -> tuple[float, float]:
        """``(lambda_min, lambda_max)`` of ``A^T A / n``: exact in float64 (an O(d^3) eigenvalue
        computation) up to :attr:`DENSE_LIMIT`, Lanczos (Ritz) estimates above it, which
        approach the extremes from inside the spectrum."""
        if self.dim > self.DENSE_LIMIT:
            solved = self._solved()
            return (0.0 if self.n < self.dim else solved.lambda_min), solved.lambda_max
        a = self.A.double()
        eig = torch.linalg.eigvalsh(a.T @ a / self.n)
        return max(0.0, float(eig[0])), float(eig[-1])

    def strong_convexity(self) -> float:
        return 0.0 if self.n < self.dim else self.hessian_extremes()[0]

    def min_loss(self) -> float:
        """``min_x f(x)``: the normal equations when ``n >= d`` (dense float64 up to
        :attr:`DENSE_LIMIT`; above it conjugate gradients, the loss then evaluated like any
        iterate's, in the data's dtype); ``0`` when ``n < d`` (Gaussian-like data of full row
        rank are interpolated exactly)."""
        if self.n < self.dim:
            return 0.0
        if self.dim > self.DENSE_LIMIT:
            return self.loss(self._solved().x.to(self.dtype))
        a, y = self.A.double(), self.y.double()
        x = torch.linalg.solve(a.T @ a, a.T @ y)
        return float((a @ x - y).pow(2).sum() / (2 * self.n))


class Logistic(_Linear):
    """Logistic regression, ``f_i(x) = log(1 + exp(-y_i a_i^T x))``, labels ``y_i in {-1, +1}``.

    ``L_i = ||a_i||^2 / 4``; strongly convex only through a regularizer (the ``l2`` prox).
    """

    what = "logistic regression"

    def __init__(self, features: torch.Tensor, labels: torch.Tensor) -> None:
        super().__init__(features, labels)
        if not bool(((labels == 1) | (labels == -1)).all()):
            raise ValueError("logistic regression: labels must be -1 or +1")

    def _residual_grad(self, margins: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return -y * torch.sigmoid(-y * margins)

    def _losses(self, margins: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.softplus(-y * margins)

    def smoothness(self) -> float:
        return float(self.row_norms_squared().max()) / 4.0
