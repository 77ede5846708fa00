"""Held-out evaluation and time to a held-out target in ``gradzip bench cluster`` (real workloads).

Every ``--eval-every N`` timed steps (and after the last) each rank evaluates its share of the
fixed held-out subset (:func:`~.cluster_workloads.heldout_shard`) with the variant's model in
evaluation mode, and the ranks' sums (loss, correct predictions, items) are all-reduced in float64
on the default group: every rank gets the same figures, those of the whole subset. Before it,
rank 0's buffers (batch-norm running statistics, which each rank updates from its own batch) are
broadcast, as DDP does at the start of the next forward anyway: the model evaluated is the one
rank 0 would save, and training is unchanged. The evaluation is outside the step timing, so a
curve's time axis is training time only (the sum of the timed steps, slowest rank per step).

Targets [CHOICE]: ``--target-accuracy A`` is top-1 accuracy **in percent** (85 = 85%); the
held-out ``--target-loss L`` is the mean cross-entropy per item (per character for the language
model) in nats. With both, a checkpoint must meet both. The target is reached at the first
evaluation that meets it: its step count and the training time up to it are reported. Variants
never stop at the target [CHOICE]: each runs all ``--steps``, so their held-out metric after the
same number of steps (the largest step count every variant ran) can be compared too. The MLP
workloads keep the training-loss window of :mod:`.cluster_target`.
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812 (the conventional alias)
from torch import nn

EVAL_CHUNK = 256  # items per evaluation forward: bounds the activations' memory


@dataclass(frozen=True)
class HeldoutTarget:
    """What the real workloads evaluate and aim for (module docstring)."""

    eval_every: int = 20
    accuracy: float | None = None  # percent
    loss: float | None = None
    seeds: int = 1
    curves_png: str | None = None

    def __post_init__(self) -> None:
        if self.eval_every < 1 or self.seeds < 1:
            raise ValueError(f"--eval-every and --seeds must be >= 1, got {self.eval_every}, "
                             f"{self.seeds}")  # fmt: skip
        if self.accuracy is not None and not 0 < self.accuracy <= 100:
            raise ValueError(f"--target-accuracy is in percent, in (0, 100]; got {self.accuracy}")
        if self.loss is not None and not self.loss > 0:
            raise ValueError(f"--target-loss must be > 0, got {self.loss}")

    def met(self, loss: float, accuracy: float) -> bool:
        """Whether one evaluation meets every target given (False when none is)."""
        if self.accuracy is None and self.loss is None:
            return False
        return (self.accuracy is None or accuracy >= self.accuracy) and (
            self.loss is None or loss <= self.loss
        )

    def describe(self) -> str:
        parts = []
        if self.accuracy is not None:
            parts.append(f"held-out accuracy >= {self.accuracy}%")
        if self.loss is not None:
            parts.append(f"held-out loss <= {self.loss}")
        return " and ".join(parts) or "no target"


def item_losses(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per item (per position for sequences) cross-entropy and whether the top-1 is right."""
    flat = logits.reshape(-1, logits.shape[-1])
    wanted = targets.reshape(-1)
    return F.cross_entropy(flat, wanted, reduction="none"), flat.argmax(1) == wanted


def evaluate(module: nn.Module, shard: tuple[torch.Tensor, torch.Tensor]) -> tuple[float, float]:
    """Held-out (mean loss, accuracy in percent) of ``module`` over every rank's shard: a
    collective, every rank must call it and gets the same pair (module docstring)."""
    for buffer in module.buffers():
        dist.broadcast(buffer, 0)
    x, y = shard
    sums = torch.zeros(3, dtype=torch.float64)
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            for start in range(0, len(x), EVAL_CHUNK):
                losses, right = item_losses(
                    module(x[start : start + EVAL_CHUNK]), y[start : start + EVAL_CHUNK]
                )
                sums += torch.tensor(
                    [losses.double().sum(), right.double().sum(), losses.numel()],
                    dtype=torch.float64,
                )
    finally:
        module.train(was_training)
    dist.all_reduce(sums)
    loss_sum, correct, count = sums.tolist()
    return loss_sum / count, 100.0 * correct / count


def eval_due(timed_step: int, steps: int, every: int) -> bool:
    """Whether the evaluation follows timed step ``timed_step`` (0-based): every ``every``
    steps and after the last one."""
    return (timed_step + 1) % every == 0 or timed_step + 1 == steps


def heldout_fields(per_rank: list[dict[str, Any]], target: HeldoutTarget) -> dict[str, Any]:
    """A row's held-out fields from every rank's figures of one variant: the evaluations'
    ``eval_steps`` (timed steps done), ``eval_elapsed_s`` (training time up to them),
    ``eval_loss`` and ``eval_accuracy``; ``steps_to_target`` / ``time_to_target_s`` (None where
    not reached). ``ValueError`` when the ranks' figures differ (they are all-reduced)."""
    first = per_rank[0]
    for other in per_rank[1:]:
        if (other["eval_loss"], other["eval_accuracy"]) != (
            first["eval_loss"],
            first["eval_accuracy"],
        ):
            raise ValueError("the ranks disagree on the held-out figures")  # fmt: skip
    slowest = [max(step) for step in zip(*(f["seconds"] for f in per_rank), strict=True)]
    elapsed = list(itertools.accumulate(slowest))
    steps = list(first["eval_steps"])
    fields: dict[str, Any] = {
        "eval_steps": steps,
        "eval_elapsed_s": [elapsed[s - 1] for s in steps],
        "eval_loss": list(first["eval_loss"]),
        "eval_accuracy": list(first["eval_accuracy"]),
    }
    fields.update(first_reached(fields, target))
    return fields


def first_reached(curve: dict[str, Any], target: HeldoutTarget) -> dict[str, Any]:
    """``steps_to_target`` and ``time_to_target_s`` of the first evaluation of ``curve`` that
    meets ``target`` (both None where none does)."""
    for step, seconds, loss, accuracy in zip(
        curve["eval_steps"], curve["eval_elapsed_s"], curve["eval_loss"], curve["eval_accuracy"],
        strict=True,
    ):  # fmt: skip
        if target.met(loss, accuracy):
            return {"steps_to_target": step, "time_to_target_s": seconds}
    return {"steps_to_target": None, "time_to_target_s": None}


def at_step(row: dict[str, Any], step: int) -> tuple[float, float]:
    """(loss, accuracy) of ``row``'s last evaluation at or before timed step ``step``."""
    index = max(i for i, s in enumerate(row["eval_steps"]) if s <= step)
    return row["eval_loss"][index], row["eval_accuracy"][index]


def _spread(values: list[float], fmt: str) -> str:
    """``mean ± sample sd`` (the mean alone for one value)."""
    if not values:
        return "-"
    mean = format(statistics.fmean(values), fmt)
    return mean if len(values) == 1 else f"{mean} ± {format(statistics.stdev(values), fmt)}"


def format_heldout(rows: list[dict[str, Any]], target: HeldoutTarget) -> list[str]:
    """Per model, world size and rate, a line per variant over its seeds: steps and seconds to
    the target (mean ± sd over the seeds that reached it, and how many did), and the held-out
    loss and accuracy after the same number of steps (mean ± sd over the seeds)."""
    lines = [
        f"time to {target.describe()} (evaluated every {target.eval_every} steps on a fixed "
        "held-out subset, evaluation time excluded); seconds: the timed steps' sum, slowest rank "
        "per step; mean ± sd over seeds"
    ]
    groups: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for row in rows:
        if row["variant"] != "none":  # no communication: not a way to train on several ranks
            groups.setdefault((row["model"], row["world_size"], row["rate"]), []).append(row)
    for (model, world, rate), block in groups.items():
        common = min(r["eval_steps"][-1] for r in block)
        variants = list(dict.fromkeys(r["variant"] for r in block))
        width = max(len(v) for v in variants) + 2
        lines.append(f"{model}, P = {world}, rate {rate}; held-out figures after {common} steps")
        lines.append(
            f"{'variant':<{width}}| {'seeds':>5} {'reached':>7} {'steps':>13} {'seconds':>15} "
            f"{'loss':>15} {'accuracy %':>15}"
        )
        for name in variants:
            runs = [r for r in block if r["variant"] == name]
            hit = [r for r in runs if r["time_to_target_s"] is not None]
            after = [at_step(r, common) for r in runs]
            lines.append(
                f"{name:<{width}}| {len(runs):>5} {len(hit):>7} "
                f"{_spread([r['steps_to_target'] for r in hit], '.0f'):>13} "
                f"{_spread([r['time_to_target_s'] for r in hit], ',.1f'):>15} "
                f"{_spread([a[0] for a in after], '.3f'):>15} "
                f"{_spread([a[1] for a in after], '.2f'):>15}"
            )
        lines.append("")
    return lines


def write_heldout_png(path: str, rows: list[dict[str, Any]], target: HeldoutTarget) -> None:
    """Held-out accuracy (with an accuracy target or none) or loss (with a loss target alone)
    against training time, a line per variant and seed, a panel per model, world size and rate;
    the target dashed (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_loss = target.loss is not None and target.accuracy is None
    key, label = (
        ("eval_loss", "held-out loss") if by_loss else ("eval_accuracy", "held-out accuracy, %")
    )
    goal = target.loss if by_loss else target.accuracy
    panels = list(dict.fromkeys((r["model"], r["world_size"], r["rate"]) for r in rows))
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(10, 4.6 * len(panels)), squeeze=False, constrained_layout=True
    )
    colours: dict[str, Any] = {}
    for ax, panel in zip(axes[:, 0], panels, strict=True):
        for r in rows:
            if (r["model"], r["world_size"], r["rate"]) != panel or r["variant"] == "none":
                continue
            first = r["variant"] not in colours
            colour = colours.setdefault(r["variant"], f"C{len(colours) % 10}")
            ax.plot(r["eval_elapsed_s"], r[key], color=colour, marker=".", lw=1.3,
                    label=r["variant"] if first else None)  # fmt: skip
        if goal is not None:
            ax.axhline(goal, color="k", ls="--", lw=0.8, label=f"target {goal}")
        ax.set_xlabel(
            "training time, s (timed steps' sum, slowest rank per step; evaluation excluded)"
        )
        ax.set_ylabel(label)
        model, world, rate = panel
        ax.set_title(f"held-out metric against training time: {model}, P = {world}, rate {rate}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        colours.clear()
    fig.savefig(path, dpi=110)
    plt.close(fig)
