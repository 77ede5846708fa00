"""Shared pieces of the DQGAN reproductions: one GAN training run on simulated ranks (real
payloads, real parameter-server synchronisation) with the measured bits, and the plots."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradzip.algorithms.dqgan.baselines import make_method
from gradzip.algorithms.dqgan.wgan import WGANGame
from gradzip.comm.local import run_local
from gradzip.comm.transport import Transport
from gradzip_lab.reproduce.outcome import Row
from gradzip_lab.reproduce.plots import line_plot

#: the labels of the seed's three methods, by :data:`~gradzip.algorithms.dqgan.METHODS` name
LABELS = {"dqgan": "DQGAN 8-bit", "cpoadam": "CPOAdam", "cpoadam-gq": "CPOAdam-GQ 8-bit"}


@dataclass
class GanRun:
    """One method's run: its score curve (rank 0's evaluations) and what was measured."""

    method: str
    curve: list[tuple[int, dict[str, float]]]
    #: mean over steps and non-server workers of the uplink payload bits (wire / paper)
    uplink_wire_bits: float
    uplink_paper_bits: float
    #: mean over steps of the bytes a non-server worker's transport sent / received
    worker_sent_bytes: float
    worker_received_bytes: float
    seconds: float

    @property
    def label(self) -> str:
        return LABELS.get(self.method, self.method)

    def final(self, key: str) -> float:
        return self.curve[-1][1][key]

    def late_mean(self, key: str) -> float:
        """The mean of ``key`` over the evaluations in the second half of the run: a GAN's
        scores swing from one evaluation to the next, so one point is a noisy comparison."""
        last = self.curve[-1][0]
        values = [scores[key] for step, scores in self.curve if 2 * step > last]
        return sum(values) / len(values)


def train_gan(
    method: str,
    build: Callable[[int], WGANGame],
    *,
    workers: int,
    steps: int,
    lr: float,
    eval_at: list[int],
    evaluate: Callable[[WGANGame], dict[str, float]],
    run_seed: int = 0,
) -> GanRun:
    """Train ``build(world_size)`` (the same game on every rank) with ``method`` for ``steps``
    iterations on ``workers`` simulated ranks; rank 0 calls ``evaluate(game)`` after each step
    listed in ``eval_at`` (0 = before training)."""

    def rank(transport: Transport) -> dict[str, Any]:
        game = build(transport.world_size)
        algorithm = make_method(method, game, transport, lr=lr, run_seed=run_seed)
        curve = [(0, evaluate(game))] if transport.rank == 0 and 0 in eval_at else []
        wire = paper = sent = received = 0.0
        for t in range(1, steps + 1):
            stats = algorithm.step()
            assert stats is not None  # on_nonfinite="raise": a NaN raises instead
            wire += stats.wire_bits
            paper += stats.paper_bits
            sent += stats.sent_bytes
            received += stats.received_bytes
            if transport.rank == 0 and t in eval_at:
                curve.append((t, evaluate(game)))
        return {
            "curve": curve,
            "wire": wire / steps,
            "paper": paper / steps,
            "sent": sent / steps,
            "received": received / steps,
        }

    started = time.perf_counter()
    results = run_local(workers, rank)
    seconds = time.perf_counter() - started
    others = results[1:] or results  # the server's own traffic is not a worker's

    def mean(key: str) -> float:
        return float(sum(r[key] for r in others) / len(others))

    return GanRun(
        method,
        results[0]["curve"],
        uplink_wire_bits=mean("wire"),
        uplink_paper_bits=mean("paper"),
        worker_sent_bytes=mean("sent"),
        worker_received_bytes=mean("received"),
        seconds=seconds,
    )


def bits_rows(runs: list[GanRun]) -> list[Row]:
    """Every run's measured uplink bits and transport bytes per worker per iteration, and
    DQGAN's wire bits against CPOAdam's beside the seed's "about 1/4"."""
    rows = []
    for r in runs:
        rows += [
            Row(f"{r.label}: uplink wire bits per worker per iteration", None, r.uplink_wire_bits / 1000, "Kbit"),
            Row(f"{r.label}: uplink paper bits per worker per iteration", None, r.uplink_paper_bits / 1000, "Kbit"),
            Row(f"{r.label}: bytes a worker sent per iteration (transport)", None, r.worker_sent_bytes, "B"),
        ]  # fmt: skip
    by = {r.method: r for r in runs}
    ratio = by["dqgan"].uplink_wire_bits / by["cpoadam"].uplink_wire_bits
    rows.append(Row("DQGAN uplink wire bits / CPOAdam's (paper: about 1/4)", 0.25, ratio, "ratio"))
    return rows


def plot_scores(runs: list[GanRun], key: str, ylabel: str, path: Path, title: str) -> None:
    """``key`` of every run's curve against the iteration, as one PNG."""
    series = [(r.label, [c[0] for c in r.curve], [c[1][key] for c in r.curve]) for r in runs]
    line_plot(path, series, title=title, ylabel=ylabel)


def eval_points(steps: int, count: int) -> list[int]:
    """``0`` and ``count`` evenly spaced iterations up to ``steps``."""
    return sorted({0, *(round(steps * (i + 1) / count) for i in range(count))})
