"""Rank figures as the timing reproductions' ranks return them, built from given timings."""

from __future__ import annotations

from typing import Any

from gradzip_lab.bench.cluster_exchange import FIGURES


def ranks(
    exchange: dict[str, list[list[float]]], compute: dict[str, float]
) -> list[dict[str, Any]]:
    """``exchange[label][rank]``: that rank's exchange seconds per step; ``compute[label]``: the
    case's compute per step (0 where absent)."""
    world = len(next(iter(exchange.values())))
    out: list[dict[str, Any]] = []
    for rank in range(world):
        cases = {}
        for label, per_rank in exchange.items():
            steps = len(per_rank[rank])
            figures: dict[str, list[float]] = {name: [0.0] * steps for name in FIGURES}
            figures["exchange_s"] = list(per_rank[rank])
            figures["compute_s"] = [compute.get(label, 0.0)] * steps
            cases[label] = figures
        out.append({"rank": rank, "cases": cases})
    return out
