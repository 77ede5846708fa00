"""``qesgd-speedup``: the speed-ups of QESGD's Table 2 (spec 2.4), timed on the emulated cluster
(needs root).

The paper trains on a parameter server (8 K40 GPUs and one server, in docker) and reports the
time per epoch of SGD over QESGD's: ResNet-56 (0.85 M parameters) 1.12x on 4 GPUs and 1.31x on
8, AlexNet (57 M) 1.34x and 1.49x; 8-bit codes up and float32 down make the ideal on a
bandwidth-bound link ``2 / (1 + 8/32) = 1.6``. Here ``P`` ranks (the server is rank 0, a
worker too, as in gradzip's ``ps[fp32]``) exchange a gradient of the model's size each step
after the step's compute: SGD sends float32 up (``identity``), QESGD 8-bit codes
(``qesgd``, ``bits=8``), both receive the float32 mean; the two run interleaved and the
speed-up is the ratio of their step times.

[RECON] Compute per step: the paper gives neither the batch nor the time per step, so the
compute is estimated for a K40 on a batch of 128, about 600 images/s for ResNet-56 (0.2 s) and
450 for AlexNet (0.3 s), with a 1 Gbit/s network [CHOICE]. On a bandwidth-bound link only the
ratio of gradient bytes to compute matters, so both are run 10 times slower (100 Mbit/s, where
the wire's time dominates the jitter of this loaded machine, and 10x the compute), and AlexNet's
gradient is cut to ResNet-56's size with its compute cut alike (57 M values in 0.3 s are
850,000 in 4.5 ms): the two models differ only in compute per byte, as in the paper.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gradzip_lab.bench.cluster_exchange import ExchangeCase
from gradzip_lab.bench.cluster_timing import (
    case_summaries,
    measure_exchanges,
    median_step,
    paired_ratio,
)
from gradzip_lab.reproduce.outcome import Outcome, Row
from gradzip_lab.reproduce.timing_setup import method_notes

RATE = "100mbit"
SLOWDOWN = 10  # 1 Gbit/s -> 100 Mbit/s, so the K40 compute estimates x 10
IDEAL = 2 / (1 + 8 / 32)
VALUES = 850_000  # ResNet-56's parameters; AlexNet's gradient is cut to this size
#: name -> (parameters, K40 seconds per batch of 128) [RECON]
PAPER_MODELS = {"ResNet-56": (850_000, 0.2), "AlexNet": (57_000_000, 0.3)}
#: the paper's Table 2: (model, GPUs) -> speed-up
PAPER = {("ResNet-56", 4): 1.12, ("ResNet-56", 8): 1.31, ("AlexNet", 4): 1.34, ("AlexNet", 8): 1.49}
QUICK_SCALE = 8  # --quick: gradient and compute / 8


def models(quick: bool) -> dict[str, tuple[int, float]]:
    """name -> (gradient values, compute seconds per step) as run (see the module docstring)."""
    scale = QUICK_SCALE if quick else 1
    return {
        name: (VALUES // scale, SLOWDOWN * seconds * VALUES / params / scale)
        for name, (params, seconds) in PAPER_MODELS.items()
    }


#: QESGD's grid step [CHOICE]: 2^7 steps cover +-5 standard deviations of the benchmark's
#: gradient (N(0, 1.25)); the payload's size and the codec's cost do not depend on it
DELTA = 0.045
FULL_STEPS, QUICK_STEPS = 5, 2


def cases(plan: dict[str, tuple[int, float]]) -> list[ExchangeCase]:
    out = []
    for model, (numel, compute) in plan.items():
        out.append(
            ExchangeCase(
                f"SGD {model}",
                "scheme",
                (numel,),
                "identity",
                scheme="ps[fp32]",
                compute_seconds=compute,
            )
        )
        out.append(
            ExchangeCase(
                f"QESGD {model}",
                "scheme",
                (numel,),
                "qesgd",
                {"delta": DELTA, "bits": 8},
                "ps[fp32]",
                compute_seconds=compute,
            )
        )
    return out


def speedup_rows(
    ranks: list[dict[str, Any]], plan: dict[str, tuple[int, float]], world: int
) -> list[Row]:
    """Per model: the speed-up beside the paper's, the exchange-only speed-up beside the ideal
    1.6, and the two median step times."""
    rows = []
    for model in plan:
        sgd, qesgd = f"SGD {model}", f"QESGD {model}"
        rows.append(
            Row(
                f"speed-up over SGD, {model}, {world} workers",
                PAPER.get((model, world)),
                paired_ratio(ranks, sgd, qesgd),
                "x",
            )
        )
        comm = median_step(ranks, sgd, compute=0.0) / median_step(ranks, qesgd, compute=0.0)
        rows.append(
            Row(
                f"communication-only speed-up, {model}, {world} workers",
                IDEAL,
                comm,
                "x",
            )
        )
        for label in (sgd, qesgd):
            ms = 1000 * median_step(ranks, label)
            rows.append(Row(f"{label} step time, {world} workers", None, ms, "ms"))
    return rows


def run(out: Path, quick: bool) -> Outcome:
    plan = models(quick)
    steps = QUICK_STEPS if quick else FULL_STEPS
    rows: list[Row] = []
    measured: dict[str, Any] = {}
    for index, world in enumerate((4, 8)):
        ranks = measure_exchanges(world, RATE, cases(plan), steps=steps, warmup=1, run=index)
        rows += speedup_rows(ranks, plan, world)
        measured[str(world)] = case_summaries(ranks)
    run_as = "; ".join(f"{m}: {n:,} values, {c:.3g} s" for m, (n, c) in plan.items())
    scaled = [
        "Workers: 4 and 8 ranks, the server being rank 0 (the paper has a separate server "
        "machine beside its 8 GPUs); all on 2 shared cores.",
        f"Links of {RATE}; the server's link carries P - 1 gradients each way, which is what "
        "makes the speed-up grow with the number of workers.",
        f"Gradient and compute per step as run: {run_as} (see the module docstring: K40 "
        f"estimates at 1 Gbit/s [RECON], both {SLOWDOWN}x slower; AlexNet cut to ResNet-56's "
        "gradient size with its compute per byte kept). VGG-19 is not run.",
        f"{steps} timed steps per variant after one warm-up, not whole epochs: an epoch is a "
        "fixed number of identical steps, so the ratio of step times is the ratio of epoch "
        "times.",
    ]
    if quick:
        scaled.append(f"--quick: gradients and compute / {QUICK_SCALE}, fewer steps.")
    return Outcome(
        id="qesgd-speedup",
        title="QESGD Table 2: speed-up over SGD on a parameter server",
        quick=quick,
        rows=rows,
        scaled_down=scaled,
        notes=[
            *method_notes(RATE, "P = 4 and 8"),
            "Shape: in the paper the speed-up stays below the ideal 1.6 because of the compute, "
            "is larger for the larger model (more communication per unit of compute) and larger "
            "with 8 GPUs than with 4 (the server's link carries more). The rows give the same "
            "three comparisons; the communication-only rows check the ideal itself (the "
            "exchange time of SGD over QESGD's, compute subtracted).",
            "Differences to expect: QESGD's encoding and the server's decoding of P - 1 "
            "payloads run on the shared cores, which lowers the exchange-only speed-up below "
            "1.6; the ratio of compute to communication is an estimate (see above), so the "
            "absolute speed-ups are not a measurement of the paper's machine.",
            "Per case, result.json keeps under cases the median step, exchange, encode and "
            "decode ms and the wire MB per step (veth bytes sent + received: busiest rank, "
            "mean rank; payload MB sent).",
        ],
        extra={"rate": RATE, "steps": steps, "delta": DELTA, "cases": measured},
    )
