"""Timing gradient exchanges on the emulated cluster, and the figures taken from the ranks.

:func:`measure_exchanges` builds a cluster of ``P`` namespaces (:mod:`.cluster_netns`), limits
every link to a rate, runs :mod:`.cluster_exchange` in every namespace and returns the ranks'
figures, the namespaces deleted whatever happens (:mod:`.cluster_launch`). The other functions
reduce those figures: a step's time is the slowest rank's (a synchronous step ends when its
last rank is done), and two interleaved cases are compared step by step (:func:`paired_ratio`),
so that load which slows one step of the shared machine slows both sides of that ratio.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

from gradzip_lab.bench.cluster_exchange import ExchangeCase, ExchangeConfig
from gradzip_lab.bench.cluster_launch import built_cluster, launch, signals_raise
from gradzip_lab.bench.cluster_netns import sweep_stale

EXCHANGE_RANK = "gradzip_lab.bench.cluster_exchange"
MASTER_PORT = 29700


def measure_exchanges(
    world_size: int,
    rate: str,
    cases: list[ExchangeCase],
    steps: int,
    warmup: int = 1,
    timeout: float = 600.0,
    run: int = 0,
) -> list[dict[str, Any]]:
    """Every rank's figures (:func:`.cluster_exchange.exchange_cases`) for ``cases`` timed on a
    ``world_size``-rank cluster whose links run at ``rate`` (a tc rate such as ``1gbit``).
    Needs root and iproute2 (the caller checks :func:`.cluster_netns.missing_privilege`)."""
    sweep_stale()
    with signals_raise(), built_cluster(world_size, run=run) as net:
        net.set_rate(rate)
        configs = [
            ExchangeConfig(
                rank=r, world_size=world_size, master_addr=net.address(0),
                master_port=MASTER_PORT + run, cases=cases, steps=steps, warmup=warmup,
                timeout=timeout,
            )
            for r in range(world_size)
        ]  # fmt: skip
        with tempfile.TemporaryDirectory(prefix="gradzip-exchange-") as tmp:
            return launch(net, configs, timeout, Path(tmp), module=EXCHANGE_RANK)


def step_seconds(
    ranks: list[dict[str, Any]], label: str, compute: float | None = None
) -> list[float]:
    """Per timed step of case ``label``: the slowest rank's compute plus exchange seconds.

    ``compute`` replaces the compute the ranks recorded: the computation is added, never run
    (see :mod:`.cluster_exchange`), so one measured exchange gives the step time at any stated
    compute per step."""
    figures = [r["cases"][label] for r in ranks]
    per_rank = [
        [
            (c if compute is None else compute) + e
            for c, e in zip(f["compute_s"], f["exchange_s"], strict=True)
        ]
        for f in figures
    ]
    return [max(step) for step in zip(*per_rank, strict=True)]


def median_step(ranks: list[dict[str, Any]], label: str, compute: float | None = None) -> float:
    """The median over timed steps of :func:`step_seconds`."""
    return statistics.median(step_seconds(ranks, label, compute))


def paired_ratio(
    ranks: list[dict[str, Any]], slower: str, faster: str, compute: float | None = None
) -> float:
    """The median over timed steps of ``slower``'s step time over ``faster``'s in the same
    step (the speed-up of ``faster``; the cases ran interleaved, one after the other)."""
    pairs = zip(
        step_seconds(ranks, slower, compute), step_seconds(ranks, faster, compute), strict=True
    )
    return statistics.median(a / b for a, b in pairs)


def time_split(ranks: list[dict[str, Any]], label: str) -> dict[str, float]:
    """Where a step of ``label`` goes, in seconds: ``computation``, ``encoding``,
    ``transmission`` (the exchange less encoding and decoding: the wire and the waiting for
    peers) and ``decoding``, each the median over steps of the mean over ranks."""
    figures = [r["cases"][label] for r in ranks]

    def component(values: list[list[float]]) -> float:
        return statistics.median(float(sum(step) / len(step)) for step in zip(*values, strict=True))

    encode = [f["encode_s"] for f in figures]
    decode = [f["decode_s"] for f in figures]
    transmit = [
        [x - e - d for x, e, d in zip(f["exchange_s"], f["encode_s"], f["decode_s"], strict=True)]
        for f in figures
    ]
    return {
        "computation": component([f["compute_s"] for f in figures]),
        "encoding": component(encode),
        "transmission": component(transmit),
        "decoding": component(decode),
    }


def wire_megabytes(ranks: list[dict[str, Any]], label: str) -> dict[str, float]:
    """Per step of ``label``, the mean over steps of the veth bytes of the busiest rank and of
    the mean rank (sent plus received, MB), and the mean payload MB a rank sent."""
    totals = [
        statistics.fmean(t + x for t, x in zip(f["tx_bytes"], f["rx_bytes"], strict=True))
        for f in (r["cases"][label] for r in ranks)
    ]
    payload = statistics.fmean(statistics.fmean(r["cases"][label]["payload_bytes"]) for r in ranks)
    return {"max_rank": max(totals) / 1e6, "mean_rank": statistics.fmean(totals) / 1e6,
            "payload_sent": payload / 1e6}  # fmt: skip


def case_summaries(ranks: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per case, what a result file keeps of the ranks' figures: the median step and exchange
    times (slowest rank, ms), the medians of the mean rank's encode and decode ms, and
    :func:`wire_megabytes`."""
    out = {}
    for label in ranks[0]["cases"]:
        split = time_split(ranks, label)
        out[label] = {
            "step_ms": 1000 * median_step(ranks, label),
            "exchange_ms": 1000 * median_step(ranks, label, compute=0.0),
            "encode_ms": 1000 * split["encoding"],
            "decode_ms": 1000 * split["decoding"],
            **{f"wire_mb_{k}": v for k, v in wire_megabytes(ranks, label).items()},
        }
    return out
