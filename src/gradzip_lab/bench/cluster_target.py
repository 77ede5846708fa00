"""Time to a target loss in ``gradzip bench cluster --target-loss L``: figures, table and curves.

Every variant trains from the same weights on the same batches until the mean of its last
``window`` timed steps' losses (each step's loss averaged over the ranks, so over the global
batch) is at most ``L``, or until ``--steps`` run out. Its time is the sum of its timed steps'
times (per step the slowest rank, as in the main table): the training time on the limited
link, without the barriers and the loss agreement between steps. [CHOICE] The clock starts
after the warm-up steps, which train every variant alike (PyTorch's PowerSGD hook runs plain
all-reduces there, its ``start_powerSGD_iter``); the loss counted is the training loss of each
step's own batch, the figure every user sees while training.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Target:
    """The target loss, the window its mean is taken over, and where to draw the curves."""

    loss: float
    window: int = 10
    curves_png: str | None = None


def target_figures(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """The row's time-to-target fields from every rank's figures of one variant:
    ``mean_losses`` (per timed step), ``elapsed_s`` (cumulative step time after each),
    ``steps_to_target`` and ``time_to_target_s`` (None where the target was not reached)."""
    slowest = [max(step) for step in zip(*(f["seconds"] for f in per_rank), strict=True)]
    elapsed = list(itertools.accumulate(slowest))
    reached = per_rank[0]["reached"]
    if any(f["reached"] != reached for f in per_rank):
        raise ValueError("the ranks disagree on the step at which the target was reached")
    return {
        "mean_losses": per_rank[0]["mean_losses"],
        "elapsed_s": elapsed,
        "steps_to_target": None if reached is None else reached + 1,
        "time_to_target_s": None if reached is None else elapsed[reached],
    }


def window_reached(mean_losses: list[float], window: int, target: float) -> bool:
    """Whether the last ``window`` losses are all there and their mean is at most ``target``
    (what stops a variant, decided on every rank from the same list)."""
    last = mean_losses[-window:]
    return len(last) == window and sum(last) / window <= target


def format_targets(rows: list[dict[str, Any]], target: float, window: int) -> list[str]:
    """Per model, world size and rate: the steps and seconds each variant took to the target,
    and how many times faster than fp32 it got there."""
    lines = [
        f"time to a training loss of {target} (mean of the last {window} steps' losses over the "
        "ranks); seconds: the timed steps' sum, slowest rank per step"
    ]
    groups: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["model"], row["world_size"], row["rate"]), []).append(row)
    for (model, world, rate), block in groups.items():
        fp32 = next((r["time_to_target_s"] for r in block if r["variant"] == "fp32"), None)
        width = max(len(r["variant"]) for r in block) + 2
        lines.append(f"{model}, P = {world}, rate {rate}")
        lines.append(f"{'variant':<{width}}| {'steps':>6} {'seconds':>9} {'x fp32':>7}")
        for r in block:
            if r["variant"] == "none":
                continue  # no communication: not a way to train on several ranks
            seconds = r["time_to_target_s"]
            if seconds is None:
                ran = len(r["mean_losses"])
                last = window_means(r["mean_losses"], window)[-1] if ran else float("nan")
                lines.append(
                    f"{r['variant']:<{width}}| not reached in {ran} steps "
                    f"({r['elapsed_s'][-1]:,.1f} s; last window's mean {last:.3f})"
                )
                continue
            speed = "-" if fp32 is None else f"{fp32 / seconds:.2f}"
            lines.append(
                f"{r['variant']:<{width}}| {r['steps_to_target']:>6} {seconds:>9,.1f} {speed:>7}"
            )
        lines.append("")
    return lines


def window_means(losses: list[float], window: int) -> list[float]:
    """The mean of the last ``window`` values at each step (fewer at the start)."""
    sums = list(itertools.accumulate(losses, initial=0.0))
    return [
        (sums[k + 1] - sums[max(0, k + 1 - window)]) / min(k + 1, window)
        for k in range(len(losses))
    ]


def write_curves_png(
    path: str | Path, rows: list[dict[str, Any]], target: float, window: int
) -> None:
    """The windowed loss (the target's mean of the ranks' mean losses) against cumulative step
    time, a line per variant and a panel per model, world size and rate; the target dashed
    (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(dict.fromkeys((r["model"], r["world_size"], r["rate"]) for r in rows))
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(10, 4.6 * len(panels)), squeeze=False, constrained_layout=True
    )
    for ax, (model, world, rate) in zip(axes[:, 0], panels, strict=True):
        for r in rows:
            if (r["model"], r["world_size"], r["rate"]) != (model, world, rate):
                continue
            if r["variant"] == "none":
                continue
            seconds = r["time_to_target_s"]
            if seconds is None:
                done = " (not reached)"
            else:
                done = f" ({seconds:,.0f} s)" if seconds >= 100 else f" ({seconds:.1f} s)"
            means = window_means(r["mean_losses"], window)
            ax.plot(r["elapsed_s"], means, label=r["variant"] + done, lw=1.3)
        ax.axhline(target, color="k", ls="--", lw=0.8, label=f"target {target}")
        ax.set_xscale("log")
        ax.set_xlabel("training time, s (timed steps' sum, slowest rank per step; log scale)")
        ax.set_ylabel(f"training loss, mean of the last {window} steps")
        ax.set_title(f"time to target loss: {model}, P = {world}, rate {rate}")
        ax.grid(which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)
