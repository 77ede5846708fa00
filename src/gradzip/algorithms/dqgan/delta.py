"""delta-approximate compressors (the seed's Definition 1, Theorems 1-2; spec 4.2) and the
residual bound of its Lemma 1 (spec 4.5)."""

from __future__ import annotations

from gradzip.compressors.base import Compressor


def delta_of(compressor: Compressor, d: int) -> float | None:
    """The ``delta`` in ``(0, 1]`` with ``E||C(x) - x||^2 <= (1 - delta) ||x||^2`` for every
    ``x`` of ``d`` elements, or ``None`` where ``compressor`` has no such guarantee: its
    :meth:`~gradzip.compressors.base.Compressor.contraction_delta` (``identity`` 1, ``topk``
    ``k/d``, ``hou`` from its variance factor), after checking ``d``.

    ``d`` is the size of one tensor: the compressors work per parameter tensor.
    """
    if d < 1:
        raise ValueError(f"d must be >= 1, got {d}")
    return compressor.contraction_delta(d)


def lemma1_bound(delta: float, lr: float, g_bound_sq: float) -> float:
    """Lemma 1 [SEED statement; constant RECON from Karimireddy et al., Lemma 3]:
    ``E||e_t||^2 <= 4 (1 - delta) / delta^2 * eta^2 * G^2`` when ``E||g||^2 <= G^2``
    (``g_bound_sq`` is ``G^2``); 0 for ``delta = 1``. Holds per tensor, and path by path for a
    deterministic compressor (top-k) with ``G^2 = max_t ||g_t||^2``."""
    if not 0 < delta <= 1:
        raise ValueError(f"delta must lie in (0, 1], got {delta}")
    return 4.0 * (1.0 - delta) / delta**2 * lr**2 * g_bound_sq
