"""The paper's synthetic linear-regression data sets Syn-512, Syn-1024 and Syn-20k (spec 3.8).

The seed says only that they are "generated using the same method as in [ECQ-SGD] with i.i.d.
random noise" and gives their sizes (10k x 512, 10k x 1024, 50k x 20000). The generator here is
the spec's reconstruction [RECON]: ``a_i ~ N(0, I_d)``, ``x* ~ N(0, I_d)``,
``y_i = a_i^T x* + N(0, noise^2)`` with ``noise = 1``, drawn from a seeded CPU
``torch.Generator`` (the same data on every rank and every run; ``x*`` first, then ``A`` row
by row, then the noise).

Full-size Syn-20k is 50,000 x 20,000 float32 = 4 GB; callers on small machines pass a smaller
``n`` (the experiments document theirs).
"""

from __future__ import annotations

import torch

from gradzip.algorithms.svrg.problems import LeastSquares

#: name -> (samples, dimension) of the paper's data sets
SYNTHETIC: dict[str, tuple[int, int]] = {
    "syn-512": (10_000, 512),
    "syn-1024": (10_000, 1024),
    "syn-20k": (50_000, 20_000),
}


def synthetic_regression(
    n: int,
    d: int,
    seed: int = 0,
    noise: float = 1.0,
    dtype: torch.dtype = torch.float64,
) -> tuple[LeastSquares, torch.Tensor]:
    """A least-squares problem on ``n`` samples of dimension ``d``, and its ``x*``."""
    if n < 1 or d < 1:
        raise ValueError(f"need n >= 1 and d >= 1, got n={n}, d={d}")
    if not noise >= 0:
        raise ValueError(f"noise must be >= 0, got {noise}")
    gen = torch.Generator().manual_seed(seed)
    x_star = torch.randn(d, generator=gen, dtype=dtype)
    a = torch.randn(n, d, generator=gen, dtype=dtype)
    y = a @ x_star + noise * torch.randn(n, generator=gen, dtype=dtype)
    return LeastSquares(a, y), x_star


def make_synthetic(
    name: str,
    n: int | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
) -> tuple[LeastSquares, torch.Tensor]:
    """The data set ``name`` (``syn-512``, ``syn-1024``, ``syn-20k``), optionally with fewer
    samples ``n`` than the paper's."""
    if name not in SYNTHETIC:
        raise ValueError(f"unknown synthetic data set {name!r}; choose one of {sorted(SYNTHETIC)}")
    full_n, d = SYNTHETIC[name]
    return synthetic_regression(n or full_n, d, seed=seed, dtype=dtype)
