"""A variant's row from every launch that ran it (``gradzip bench cluster``, any mode and rounds).

Each launch (:class:`~.cluster_plan.Launch`) hands back one result per rank. For a variant and
a mode, :func:`merged_row` pools the timed steps of every launch of that mode that trained it
(in launch order) and makes the row of :func:`~.cluster_report.make_row` from them: ``step_ms``
is the median, over all the launches' timed steps, of the slowest rank's time. It adds:

* ``mode``: ``isolated`` or ``interleaved``;
* ``launches``: how many launches trained the variant (the rounds);
* ``pids``: per launch, the rank processes' ids (an isolated variant's are its own);
* ``co_resident``: per launch, the variants interleaved with it in the same processes;
* ``step_ms_rounds``: per launch, the median of its own timed steps (the drift between rounds);
* ``param_digests``: per launch, each rank's SHA-256 of the final parameters.

With a target loss (:mod:`.cluster_target`) each launch trains to the target on its own, so
the time-to-target fields come from each launch separately (:func:`combined_targets`).
"""

from __future__ import annotations

import statistics
from typing import Any

from gradzip_lab.bench.cluster_plan import Launch
from gradzip_lab.bench.cluster_report import make_row
from gradzip_lab.bench.cluster_target import target_figures

#: the per-step lists of a rank's figures that pool over launches
STEP_LISTS = ("seconds", "tx_bytes", "rx_bytes", "losses", "mean_losses")

Done = list[tuple[Launch, list[dict[str, Any]]]]


def launches_of(done: Done, mode: str, name: str) -> Done:
    """The launches of ``mode`` that trained ``name``, with their ranks' results."""
    return [
        (launch, ranks) for launch, ranks in done if launch.mode == mode and name in launch.names
    ]


def pooled_ranks(runs: Done, name: str) -> list[dict[str, Any]]:
    """Per rank, ``name``'s figures with every per-step list concatenated over ``runs``."""
    world = len(runs[0][1])
    pooled: list[dict[str, Any]] = []
    for rank in range(world):
        figures = [ranks[rank]["variants"][name] for _, ranks in runs]
        merged: dict[str, Any] = {key: [v for f in figures for v in f[key]] for key in STEP_LISTS}
        payloads = [f["payload_bytes"] for f in figures]
        merged["payload_bytes"] = (
            None if any(p is None for p in payloads) else [v for p in payloads for v in p]
        )
        pooled.append({"variants": {name: merged}})
    return pooled


def merged_row(
    model: str, world: int, rate: str, name: str, mode: str, done: Done, target: bool = False
) -> dict[str, Any]:
    """``name``'s row in ``mode`` from every launch in ``done`` (see the module docstring)."""
    runs = launches_of(done, mode, name)
    if not runs:
        raise ValueError(f"no {mode} launch trained {name}")
    row = make_row(model, world, rate, name, pooled_ranks(runs, name))
    row["mode"] = mode
    row["launches"] = len(runs)
    row["pids"] = [[r["pid"] for r in ranks] for _, ranks in runs]
    row["co_resident"] = [ranks[0]["variants"][name]["co_resident"] for _, ranks in runs]
    row["step_ms_rounds"] = [
        make_row(model, world, rate, name, ranks)["step_ms"] for _, ranks in runs
    ]
    row["param_digests"] = [
        [r["variants"][name]["param_digest"] for r in ranks] for _, ranks in runs
    ]
    if target:
        row.update(combined_targets([target_figures([r["variants"][name] for r in ranks])
                                     for _, ranks in runs]))  # fmt: skip
    return row


def combined_targets(per_launch: list[dict[str, Any]]) -> dict[str, Any]:
    """The time-to-target fields over launches: ``time_to_target_s`` and ``steps_to_target``
    the medians (the lower middle one for an even count) where every launch reached the
    target, else None; ``time_to_target_s_rounds`` every launch's own; the curves
    (``mean_losses``, ``elapsed_s``) those of the launch with the median time (the first
    launch's where one did not reach it)."""
    times = [f["time_to_target_s"] for f in per_launch]
    reached = all(t is not None for t in times)
    chosen = per_launch[0]
    if reached:
        middle = statistics.median_low(times)
        chosen = per_launch[times.index(middle)]
    return {
        "mean_losses": chosen["mean_losses"],
        "elapsed_s": chosen["elapsed_s"],
        "steps_to_target": (
            statistics.median_low([f["steps_to_target"] for f in per_launch]) if reached else None
        ),
        "time_to_target_s": statistics.median_low(times) if reached else None,
        "time_to_target_s_rounds": times,
    }
