"""The nested scalar quantizer of spec 1.5 as pure functions, plus NDQSG's failure rate (1.6).

Fine and coarse quantizers ``Q1``, ``Q2`` with steps ``delta1`` and ``delta2 = k*delta1`` (``k``
odd >= 3 [CHOICE], so the transmitted index is symmetric, ``{-(k-1)/2 .. (k-1)/2}``).

* Encoder: ``t = alpha*x + u``; ``s = Q1(t) - Q2(t)``, in integer form ``s_idx = ((q1 + h) mod k)
  - h`` with ``q1 = round_half_up(t/delta1)`` and ``h = (k-1)/2``.
* Decoder with side information ``y``: ``r = s - u - alpha*y``; ``x_hat = y + alpha*(r -
  Q2(r))``.

Decoding is right when ``|alpha*(x - y) - e| < delta2/2`` (``e`` the fine rounding error); it
then returns ``x - alpha*e - (1 - alpha^2)*(x - y)``. Otherwise the error jumps by a multiple of
``alpha*delta2``, which the receiver cannot detect.

References: Abdi & Fekri, "Nested Dithered Quantization for Communication Reduction in
Distributed Training" (ICLR 2019 submission), eqs. (6)-(7), Fig. 3, Appendix E; Zamir, Shamai &
Erez, "Nested linear/lattice codes for structured multiterminal binning" (2002).
"""

from __future__ import annotations

import math

import torch

from gradzip.compressors.buckets import bucket_absmax, check_bucket_size, per_element


def check_odd_k(k: int) -> int:
    """Validate the nesting ratio ``k = delta2/delta1``: an odd int >= 3."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 3 or k % 2 == 0 or k > 2**20:
        raise ValueError(f"k must be an odd int in [3, 2**20], got {k!r}")
    return k


def nested_encode(x: float, u: float, delta1: float, k: int, alpha: float = 1.0) -> int:
    """Index ``s_idx`` in ``{-h..h}`` sent for ``x`` with dither ``u`` (``s = s_idx*delta1``)."""
    h = (check_odd_k(k) - 1) // 2
    q1 = math.floor((alpha * x + u) / delta1 + 0.5)
    return (q1 + h) % k - h  # Python's % is the floor-mod of the spec


def nested_decode(
    s_idx: int, u: float, y: float, delta1: float, k: int, alpha: float = 1.0
) -> float:
    """Reconstruction of ``x`` from its index, the same dither and the side information ``y``."""
    delta2 = check_odd_k(k) * delta1
    r = s_idx * delta1 - u - alpha * y
    return y + alpha * (r - delta2 * math.floor(r / delta2 + 0.5))


def nested_success_bound(delta1: float, k: int, alpha: float = 1.0) -> float:
    """Sufficient condition for decoding without failure: ``alpha*|x - y| <`` this value,
    ``(delta2 - delta1)/2`` with ``delta2 = k*delta1``."""
    return (check_odd_k(k) - 1) * delta1 / 2 / alpha


def chebyshev_failure_bound(delta1: float, k: int, alpha: float, sigma_z2: float) -> float:
    """Thm 6's bound on ``P(|alpha*z + u| > delta2/2)`` for ``E[z^2] = sigma_z2``:
    ``delta1^2/(3*delta2^2) + 4*alpha^2*sigma_z2/delta2^2`` (normalised units)."""
    delta2 = check_odd_k(k) * delta1
    return delta1**2 / (3 * delta2**2) + 4 * alpha**2 * sigma_z2 / delta2**2


def failure_rate(
    g: torch.Tensor,
    g_hat: torch.Tensor,
    y: torch.Tensor,
    *,
    L1: int = 3,
    alpha: float = 1.0,
    bucket_size: int | None = None,
    tol: float = 1e-3,
) -> float:
    """Fraction of coordinates NDQSG decoded wrongly (spec 1.6), for simulations that know ``g``.

    A coordinate fails when ``|g_hat - g| > alpha*c/2 + (1 - alpha^2)*|g - y| + tol*c``, with
    ``c = max|g_B|/L1`` the fine step of its bucket; ``tol`` (in fine steps) absorbs float32
    rounding, far below the ``alpha*k*c`` jump of a failure.
    """
    gf = g.detach().reshape(-1).to(torch.float64)
    if gf.numel() == 0:
        return 0.0
    bs = check_bucket_size(bucket_size)
    absmax = float(gf.abs().max())
    c = per_element(bucket_absmax(gf.to(torch.float32), bs, absmax).double(), gf.numel(), bs) / L1
    err = (g_hat.detach().reshape(-1).to(torch.float64) - gf).abs()
    gap = (gf - y.detach().reshape(-1).to(torch.float64)).abs()
    bound = (alpha / 2 + tol) * c + (1 - alpha**2) * gap
    return float((err > bound).double().mean())
