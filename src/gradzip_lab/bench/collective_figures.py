"""What every case of ``gradzip bench collectives`` measures on a rank, and the barrier before
each timed step: shared by the gradzip cases (:mod:`gradzip_lab.bench.collective_ranks`) and the
PyTorch baselines (:mod:`gradzip_lab.bench.collective_baselines`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gradzip.comm.transport import Transport


@dataclass
class RankFigures:
    """One rank's figures for one case, per timed step (the warm-up step is left out)."""

    sent: list[int] = field(default_factory=list)
    received: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    extra_seconds: dict[str, list[float]] = field(default_factory=dict)


def barrier(transport: Transport) -> None:
    """Line the ranks up before a timed step: an all-gather of empty payloads. Its bytes never
    reach a case's figures because a case reads its totals after the barrier and again after
    its step (the difference), not through a step scope."""
    transport.all_gather_bytes(b"")
