"""delta-approximate compressors (the seed's Definition 1, Theorems 1-2; spec 4.2) and the
residual bound of its Lemma 1 (spec 4.5)."""

from __future__ import annotations

from gradzip.compressors.base import Compressor
from gradzip.compressors.hou import Hou
from gradzip.compressors.identity import Identity
from gradzip.compressors.topk import TopK, kept_count


def delta_of(compressor: Compressor, d: int) -> float | None:
    """The ``delta`` in ``(0, 1]`` with ``E||C(x) - x||^2 <= (1 - delta) ||x||^2`` for every
    ``x`` of ``d`` elements, or ``None`` where ``compressor`` has no such guarantee.

    * ``identity``: ``delta = 1`` (no error).
    * ``topk``: ``delta = k/d``, deterministic (Stich et al.'s k-contraction; seed Thm 1).
    * ``hou`` with ``scaled=True``: ``delta = 1/(1 + omega)``, ``omega = min(d/(4 s^2),
      sqrt(d)/s)`` [RECON, derived; spec 4.2] (in expectation over the stochastic rounding).
    * ``hou`` unscaled: ``E||Q(x) - x||^2 <= omega ||x||^2``, so ``delta = 1 - omega`` when
      ``omega < 1`` (small tensors or many bits) and ``None`` otherwise [RECON, derived]: the
      seed's Theorem 2 constant for this case is lost.

    ``d`` is the size of one tensor: the compressors work per parameter tensor.
    """
    if d < 1:
        raise ValueError(f"d must be >= 1, got {d}")
    if isinstance(compressor, Identity):
        return 1.0
    if isinstance(compressor, TopK):
        return kept_count(compressor.k, compressor.ratio, d) / d
    if isinstance(compressor, Hou):
        omega = compressor.omega(d)
        if compressor.scaled:
            return 1.0 / (1.0 + omega)
        return 1.0 - omega if omega < 1 else None
    return None


def lemma1_bound(delta: float, lr: float, g_bound_sq: float) -> float:
    """Lemma 1 [SEED statement; constant RECON from Karimireddy et al., Lemma 3]:
    ``E||e_t||^2 <= 4 (1 - delta) / delta^2 * eta^2 * G^2`` when ``E||g||^2 <= G^2``
    (``g_bound_sq`` is ``G^2``); 0 for ``delta = 1``. Holds per tensor, and path by path for a
    deterministic compressor (top-k) with ``G^2 = max_t ||g_t||^2``."""
    if not 0 < delta <= 1:
        raise ValueError(f"delta must lie in (0, 1], got {delta}")
    return 4.0 * (1.0 - delta) / delta**2 * lr**2 * g_bound_sq
