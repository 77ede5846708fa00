"""``lpc-timesplit``: LPC-SVRG's split of the running time into computation, encoding,
transmission and decoding (Fig. 4, spec 3.8), timed on the emulated cluster (needs root).

The paper decomposes the time of full-precision SVRG, QSGD, ECQ-SGD, LPC-SVRG and ALPC-SVRG on
Syn-20k (``d = 20,000``) into those four parts and finds that LPC-SVRG saves running time over
SVRG by cutting the transmission, the computation being alike; its figure carries no numbers in
the text. Here ``P = 4`` ranks run rounds of distributed SVRG's communication on Syn-20k's
dimension: each round, each rank computes (emulated, see below), then the ranks exchange their
``d``-vectors through LPC-SVRG's scheme (a), an all-gather of the payloads decoded by every
rank, in float32 (SVRG), as QSGD codes with 7 levels (``qsgd``, ``s=7``, max norm) and as
LPC codes with 7 levels (``lpc``, ``b=4``), interleaved. The split comes from the ranks' clocks:
the time inside the codec's ``encode`` and ``decode``, the rest of the exchange (the wire and
the waiting for peers) as transmission.

Compute per round [CHOICE]: Reddi et al.'s mini-batch as in ``lpc-fig3c`` (``M B = n^(2/3)``
over 4 workers, an epoch of ``m = n / (M B)`` rounds, ``n = 50,000``): per round a worker takes
its mini-batch's gradient at the iterate and at the snapshot, plus its share of the epoch's full
gradient, i.e. ``2 + n / (M B m)`` mini-batch gradients; one mini-batch gradient of Syn-20k is
timed on one thread of this machine and the round's total is its compute. QSGD (an SGD
method) computes one mini-batch gradient per round, and is run with that compute.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from gradzip_lab.bench.cluster_exchange import ExchangeCase
from gradzip_lab.bench.cluster_timing import (
    case_summaries,
    measure_exchanges,
    paired_ratio,
    time_split,
)
from gradzip_lab.reproduce.outcome import Outcome, Row
from gradzip_lab.reproduce.timing_setup import method_notes, one_thread_seconds

RATE = "100mbit"
WORKERS = 4
DIM, SAMPLES = 20_000, 50_000
BATCH = round(SAMPLES ** (2 / 3) / WORKERS)  # per worker, as lpc-fig3c
INNER = SAMPLES // (WORKERS * BATCH)  # rounds per epoch
FULL_STEPS, QUICK_STEPS = 40, 6
#: label -> (compressor, parameters, mini-batch gradients per round)
METHODS: dict[str, tuple[str, dict[str, Any], float]] = {
    "SVRG": ("identity", {}, 2 + SAMPLES / (WORKERS * BATCH * INNER)),
    "QSGD-7": ("qsgd", {"s": 7, "bucket_size": None, "norm": "max"}, 1.0),
    "LPC-SVRG-7": ("lpc", {"b": 4}, 2 + SAMPLES / (WORKERS * BATCH * INNER)),
}
PARTS = ("computation", "encoding", "transmission", "decoding")


def gradient_seconds() -> float:
    """One thread's time for a least-squares mini-batch gradient ``A_B^T (A_B x - y) / B``."""
    gen = torch.Generator().manual_seed(0)
    a, x, y = torch.randn(BATCH, DIM, generator=gen), torch.randn(DIM), torch.randn(BATCH)
    return one_thread_seconds(lambda: a.T @ (a @ x - y) / BATCH)


def cases(gradient: float) -> list[ExchangeCase]:
    return [
        ExchangeCase(
            name,
            "scheme",
            (DIM,),
            compressor,
            params,
            "allgather",
            compute_seconds=gradients * gradient,
        )
        for name, (compressor, params, gradients) in METHODS.items()
    ]


def split_rows(ranks: list[dict[str, Any]]) -> tuple[list[Row], dict[str, dict[str, float]]]:
    """Per method the four parts in ms, the round's total; SVRG over LPC-SVRG in transmission
    and in total (the paper's claim), and the splits themselves."""
    splits = {name: time_split(ranks, name) for name in METHODS}
    rows = []
    for name, split in splits.items():
        for part in PARTS:
            rows.append(Row(f"{name} {part} per round", None, 1000 * split[part], "ms"))
    base, lpc = splits["SVRG"], splits["LPC-SVRG-7"]
    rows += [
        Row(
            "SVRG / LPC-SVRG-7 transmission time",
            None,
            base["transmission"] / lpc["transmission"],
            "x",
        ),
        Row(
            "SVRG / LPC-SVRG-7 round time (paired, slowest rank)",
            None,
            paired_ratio(ranks, "SVRG", "LPC-SVRG-7"),
            "x",
        ),
    ]
    for name in ("SVRG", "LPC-SVRG-7"):
        split = splits[name]
        share = 100 * split["transmission"] / sum(split.values())
        rows.append(Row(f"{name} transmission share of the round", None, share, "%"))
    return rows, splits


def run(out: Path, quick: bool) -> Outcome:
    steps = QUICK_STEPS if quick else FULL_STEPS
    gradient = gradient_seconds()
    ranks = measure_exchanges(WORKERS, RATE, cases(gradient), steps=steps, warmup=1)
    rows, splits = split_rows(ranks)
    return Outcome(
        id="lpc-timesplit",
        title="LPC-SVRG Fig. 4: computation, encoding, transmission, decoding",
        quick=quick,
        rows=rows,
        scaled_down=[
            f"{steps} rounds of communication (after one warm-up), not a run to the paper's "
            "(lost) loss: the split per round times the number of rounds is the run's split, "
            "and lpc-fig3c shows how many rounds each method needs.",
            f"{WORKERS} workers [CHOICE, as lpc-fig3c: the paper does not give its count], "
            f"links of {RATE} [CHOICE: the paper does not describe its network]; at that rate a "
            "float32 round's transmission and its computation are of the same order.",
            f"Computation emulated: one mini-batch gradient ({BATCH} x {DIM:,}) took "
            f"{1000 * gradient:.1f} ms on one thread here; SVRG-type rounds count "
            f"{METHODS['SVRG'][2]:.2f} of them, QSGD one.",
            "ECQ-SGD (QSGD's codes plus error feedback) and ALPC-SVRG (LPC-SVRG's codes and "
            "rounds, fewer of them) are not run: per round their split equals QSGD's and "
            "LPC-SVRG's.",
        ],
        notes=[
            *method_notes(RATE, f"P = {WORKERS}"),
            "Shape: the paper finds LPC-SVRG's time below SVRG's because transmission shrinks "
            "while computation stays; encoding and decoding are small. The rows give each part "
            "per round and the ratios that carry the claim (the paper prints no numbers).",
            "Transmission here includes the waiting for the slowest peer; encoding and decoding "
            "run on cores shared by all ranks, so they take longer than on nodes of their own.",
        ],
        extra={
            "rate": RATE,
            "batch": BATCH,
            "inner": INNER,
            "gradient_s": gradient,
            "splits": splits,
            "steps": steps,
            "cases": case_summaries(ranks),
        },
    )
