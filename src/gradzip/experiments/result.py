"""What a training run returns: :class:`TrainResult`, the typed summary of
:func:`gradzip.experiments.backends.train`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class TrainResult:
    """The summary of a run, from rank 0's view (``summary.json`` holds the same figures).

    A run that stopped early has ``complete`` false and ``interrupted_by`` the signal's name;
    one whose ranks had to be killed (a second signal) has ``killed`` true, only the steps it
    took and whether it has a checkpoint (``resumable``), and None for the figures it could not
    gather. The bits are per step, averaged over the steps: a worker's uplink payloads
    (``wire_bits``, ``paper_bits``, ``entropy_bits``), every byte each rank sent and received
    (mean and busiest rank), and fp32 ring all-reduce's at this P for comparison."""

    complete: bool
    steps: int
    run_dir: str | None = None
    dataset: str | None = None
    data_source: str | None = None
    total_steps: int | None = None
    seconds: float | None = None
    steps_per_second: float | None = None
    loss: float | None = None
    train_acc: float | None = None
    test_acc: float | None = None
    baseline_bits: int | None = None
    wire_bits: float | None = None
    paper_bits: float | None = None
    entropy_bits: float | None = None
    sent_bits: float | None = None
    sent_bits_max: float | None = None
    received_bits: float | None = None
    received_bits_max: float | None = None
    fp32_ring_allreduce_bits: float | None = None
    interrupted_by: str | None = None
    killed: bool = False
    resumable: bool | None = None
    rank: int = 0

    @classmethod
    def from_summary(cls, summary: Mapping[str, Any]) -> TrainResult:
        """The result of a summary dict (the trainer's, with ``run_dir`` and the stop's keys);
        ``KeyError`` for a key this class does not know, so no figure is dropped unseen."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(summary) - known)
        if unknown:
            raise KeyError(f"TrainResult has no field for {', '.join(unknown)}")
        return cls(**summary)

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready."""
        return asdict(self)
