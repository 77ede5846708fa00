"""Shared machinery of the LPC-SVRG paper's experiments (``lpc-*`` ids, spec 3.8).

A :class:`Method` is one curve of a figure (SGD, SVRG, QSGD-s, ECQ-SGD-s, LPC-SVRG-s[-theta],
ALPC-SVRG-s[-theta]) with its step-size knob (the learning rate, or ALPC-SVRG's ``L``);
:func:`run_curve` runs it on simulated ranks (real payloads through the real schemes) and
returns the objective gap ``F - F*`` and the inner-loop bits all ranks sent, read from their
transports' meters; :func:`tune` picks the knob on a grid ("all lrs tuned", the paper);
:func:`bits_per_round_rows` measures one round of each communication scheme beside the
formulas of spec 3.3.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from gradzip.algorithms.svrg import (
    ALPCSVRG,
    LPCSVRG,
    ALPCSVRGConfig,
    DistributedAlgorithm,
    FiniteSum,
    LPCSVRGConfig,
    QuantizedSGD,
    RunResult,
    SGDConfig,
    body_bits_per_round,
    paper_bits_per_round,
)
from gradzip.algorithms.svrg.config import SgdMethod
from gradzip.comm.local import run_local
from gradzip.comm.transport import Transport
from gradzip.errors import GradzipError
from gradzip_lab.reproduce.outcome import Row

#: simulated data-parallel workers [CHOICE: the paper does not give its count]
WORKERS = 4
#: the gap below which a curve counts as converged, for the bits-to-target rows
FLOOR = 1e-15


@dataclass(frozen=True)
class Method:
    """One compared algorithm: ``kind`` is ``sgd`` (fp32 SGD, QSGD, ECQ-SGD through
    ``sgd_method``), ``svrg`` (LPC-SVRG; ``b=None`` is fp32 SVRG) or ``alpc``; ``knob`` is the
    learning rate (``sgd``, ``svrg``) or ALPC-SVRG's ``L``."""

    label: str
    kind: str
    knob: float
    b: int | None = None
    theta: float = 1.0
    sgd_method: SgdMethod = "sgd"
    levels: int = 7


@dataclass(frozen=True)
class Setting:
    """What every curve of a figure shares: ``rounds`` communication rounds, the per-worker
    ``batch``, SVRG's epoch length ``inner``, ALPC-SVRG's ``sigma`` (0: Algorithm 3), SGD's
    ``lr_decay``, the low-precision ``packing``, how often the objective is recorded."""

    rounds: int
    batch: int
    inner: int
    sigma: float
    lr_decay: float = 0.01
    packing: str = "entropy"
    record_every: int = 10
    run_seed: int = 0


def build(
    method: Method, s: Setting, transport: Transport, problem: FiniteSum
) -> DistributedAlgorithm:
    """The algorithm of ``method`` on this rank."""
    epochs = max(1, math.ceil(s.rounds / s.inner))
    packing = s.packing if method.b is not None or method.sgd_method != "sgd" else "fixed"
    common: dict[str, Any] = dict(
        batch=s.batch, packing=packing, run_seed=s.run_seed, record_every=s.record_every
    )
    if method.kind == "sgd":
        config = SGDConfig(
            steps=s.rounds,
            lr=method.knob,
            lr_decay=s.lr_decay,
            method=method.sgd_method,
            levels=method.levels,
            **common,
        )
        return QuantizedSGD(transport, problem, config)
    quant = dict(b=method.b, theta=method.theta, **common)
    if method.kind == "svrg":
        lpc = LPCSVRGConfig(epochs=epochs, lr=method.knob, inner=s.inner, **quant)
        return LPCSVRG(transport, problem, lpc)
    alpc = ALPCSVRGConfig(
        epochs=epochs,
        L=method.knob,
        sigma=s.sigma,
        strongly_convex=s.sigma > 0,
        inner=s.inner,
        **quant,
    )
    return ALPCSVRG(transport, problem, alpc)


@dataclass
class Curve:
    """One run: the rounds at which the objective was recorded, ``F - F*`` there, and the
    inner-loop / full-gradient bits all ranks had sent by then (measured)."""

    label: str
    knob: float
    steps: list[int]
    gaps: list[float]
    bits: list[int]
    full_bits: list[int]
    seconds: float

    def reach(self, target: float) -> tuple[int, int] | None:
        """``(rounds, bits)`` at the first record with ``F - F* <= target``."""
        for step, gap, bits in zip(self.steps, self.gaps, self.bits, strict=True):
            if gap <= target:
                return step, bits
        return None

    @property
    def final(self) -> float:
        return self.gaps[-1]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_curve(
    problem: FiniteSum, fstar: float, method: Method, s: Setting, workers: int = WORKERS
) -> Curve:
    """Run ``method`` on ``workers`` simulated ranks; a run that diverges (a non-finite
    message) gives an infinite final gap instead of an error."""
    try:
        results = run_local(workers, lambda t: build(method, s, t, problem).run())
    except GradzipError:
        return Curve(method.label, method.knob, [0], [math.inf], [0], [0], 0.0)
    trace = results[0].trace
    gaps = [math.inf if v is None else v - fstar for v in trace.losses]
    bits = [sum(r.trace.bits[k] for r in results) for k in range(len(trace.steps))]
    full = [sum(r.trace.full_bits[k] for r in results) for k in range(len(trace.steps))]
    return Curve(method.label, method.knob, trace.steps, gaps, bits, full, trace.seconds[-1])


def tune(
    problem: FiniteSum,
    fstar: float,
    method: Method,
    s: Setting,
    factors: tuple[float, ...] = (0.5, 1.0, 2.0),
) -> tuple[Method, dict[str, float]]:
    """The knob among ``method.knob * factors`` with the lowest final gap after ``s.rounds``
    rounds (the tuning runs' own setting), and every tried knob's final gap."""
    tried: dict[str, float] = {}
    best = method
    best_gap = math.inf
    for factor in factors:
        candidate = replace(method, knob=method.knob * factor)
        gap = run_curve(problem, fstar, candidate, s).final
        tried[f"{candidate.knob:g}"] = gap
        if gap < best_gap:
            best, best_gap = candidate, gap
    return best, tried


def plot_curves(curves: list[Curve], path: Path, title: str) -> None:
    """``F - F*`` against rounds (left) and against measured inner-loop bits (right), log."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for c in curves:
        gaps = [max(g, FLOOR) for g in c.gaps]
        style = "--" if c.label.startswith(("SGD", "SVRG")) else "-"
        left.plot(c.steps, gaps, style, label=c.label)
        right.plot([b / 1e6 for b in c.bits], gaps, style, label=c.label)
    left.set_xlabel("iteration (communication round)")
    right.set_xlabel("Mbit sent by all workers, inner loop (measured)")
    for ax in (left, right):
        ax.set_yscale("log")
        ax.set_ylabel("training loss - optimum")
        ax.grid(alpha=0.3, which="both")
    left.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def bits_per_round_rows(
    problem: FiniteSum, b: int, workers: int = WORKERS
) -> tuple[list[Row], list[str]]:
    """One round of LPC-SVRG per scheme (fixed-width codes) on ``workers`` simulated ranks:
    the bits all ranks sent (meter) beside the paper's formula, and a note splitting them
    into the exact payload bodies and the framing (headers, CRCs, length prefixes)."""
    rows, notes = [], []
    d = problem.dim
    for scheme in ("a", "b", "c"):
        config = LPCSVRGConfig(epochs=1, inner=1, lr=1e-9, batch=1, b=b, scheme=scheme)

        def one_round(t: Transport, c: LPCSVRGConfig = config) -> RunResult:
            return LPCSVRG(t, problem, c).run()

        measured = sum(r.bits for r in run_local(workers, one_round))
        paper = paper_bits_per_round(scheme, workers, d, b)
        body = body_bits_per_round(scheme, workers, d, b)
        rows.append(
            Row(
                f"scheme ({scheme}) bits per round, all {workers} workers, b={b}",
                paper,
                measured,
                "bit",
            )
        )
        notes.append(
            f"Scheme ({scheme}), d={d}, b={b}, M={workers}: the paper's formula gives {paper:,} "
            f"bits per round; the payload bodies hold {body:,} (exact; "
            + (
                "byte padding only"
                if scheme == "a"
                else "the server is a rank, so M-1 workers talk to it"
            )
            + f") and framing adds {measured - body:,} (headers, CRCs, 8-byte length prefixes)."
        )
    return rows, notes
