"""The bilinear game ``min_x max_y x^T A y``: the test bed on which OMD converges and
simultaneous gradient descent-ascent diverges (spec 4.3, 4.5; seed Section 2.2)."""

from __future__ import annotations

import math

import torch

from gradzip.algorithms.dqgan.game import Game, sample_generator


def well_conditioned_matrix(
    d: int, generator: torch.Generator, low: float = 0.5, high: float = 1.0
) -> torch.Tensor:
    """A random ``d x d`` matrix ``U diag(s) V^T`` with Haar-like orthogonal ``U, V`` (QR of
    Gaussian matrices) and singular values ``s`` uniform in ``[low, high]`` (float64).

    [CHOICE] The spec asks for a random full-rank ``A``; a plain Gaussian matrix is full rank
    but its smallest singular value is about ``1/d`` of its largest, so OMD would need
    ``(d/eta)^2`` iterations to show convergence. Bounding the spectrum keeps the demo short.
    """
    if d < 1:
        raise ValueError(f"the dimension d must be >= 1, got {d}")
    if not 0 < low <= high:
        raise ValueError(f"need 0 < low <= high for the singular values, got {low}, {high}")
    u, _ = torch.linalg.qr(torch.randn(d, d, generator=generator, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(d, d, generator=generator, dtype=torch.float64))
    s = low + (high - low) * torch.rand(d, generator=generator, dtype=torch.float64)
    matrix: torch.Tensor = u @ torch.diag(s) @ v.T
    return matrix


class BilinearGame(Game):
    """``L(x, y) = x^T A y`` with ``x, y`` in ``R^d``; the unique equilibrium is ``(0, 0)``.

    Operator: ``F(x, y) = (A y, -A^T x)``, monotone and ``||A||``-Lipschitz; GDA's iteration
    matrix has spectral radius ``sqrt(1 + eta^2 s^2) > 1`` for every singular value ``s`` of
    ``A``, so GDA spirals outwards, while OMD contracts for ``eta`` below about ``1/(2||A||)``.

    Workers: worker ``m`` of ``workers`` sees ``A_m = A + H_m`` [CHOICE], with Gaussian
    ``H_m`` of entry standard deviation ``heterogeneity/sqrt(d)`` centred so that
    ``mean_m A_m = A`` (deterministic data heterogeneity: the game stays noise-free, but the
    workers' messages differ). ``noise`` adds ``N(0, noise^2)`` to every operator entry, drawn
    from ``(seed, rank, step)`` (a stochastic operator, unbiased, variance ``2 d noise^2``).

    ``A``, then ``x_0, y_0`` (standard normal), then the ``H_m`` are drawn from ``seed``, so the
    game of one worker has the same ``A`` and start as that of many; ``dtype`` is the
    parameters' dtype.
    """

    def __init__(
        self,
        d: int = 50,
        *,
        workers: int = 1,
        heterogeneity: float = 0.0,
        noise: float = 0.0,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
        matrix: torch.Tensor | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if heterogeneity < 0 or noise < 0:
            raise ValueError("heterogeneity and noise must be >= 0")
        gen = torch.Generator().manual_seed(seed)
        a = well_conditioned_matrix(d, gen) if matrix is None else matrix.to(torch.float64)
        if a.shape != (d, d):
            raise ValueError(f"the matrix must be {d} x {d}, got {tuple(a.shape)}")
        # the start point before the spread, so that it does not depend on the worker count
        self.x = torch.randn(d, generator=gen, dtype=torch.float64).to(dtype)
        self.y = torch.randn(d, generator=gen, dtype=torch.float64).to(dtype)
        spread = torch.randn(workers, d, d, generator=gen, dtype=torch.float64)
        spread = (spread - spread.mean(0)) * (heterogeneity / math.sqrt(d))
        self.matrix = a.to(dtype)
        self.matrices = [(a + spread[m]).to(dtype) for m in range(workers)]
        self.noise = float(noise)
        self.seed = seed

    def parameters(self) -> list[torch.Tensor]:
        return [self.x, self.y]

    def operator(self, step: int, rank: int) -> list[torch.Tensor]:
        if not 0 <= rank < len(self.matrices):
            raise ValueError(f"rank {rank} has no data: the game has {len(self.matrices)} workers")
        a = self.matrices[rank]
        fx, fy = a @ self.y, -(a.T @ self.x)
        if self.noise:
            gen = sample_generator("bilinear-noise", self.seed, rank, step)
            fx = fx + self.noise * torch.randn(fx.shape, generator=gen, dtype=fx.dtype)
            fy = fy + self.noise * torch.randn(fy.shape, generator=gen, dtype=fy.dtype)
        return [fx, fy]

    def distance(self) -> float:
        """``||(x, y)||``: the distance of the live iterate to the equilibrium ``(0, 0)``."""
        return math.sqrt(float(self.x.double().square().sum() + self.y.double().square().sum()))
