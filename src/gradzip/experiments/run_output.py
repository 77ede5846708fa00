"""A training run's directory: the resolved config, per-step metrics, a summary, plots, a report.

Layout of ``<out>/``:

* ``config.json``: every option, defaults resolved;
* ``metrics.jsonl``: one JSON object per step (step, epoch, loss, train_acc, test_acc when
  evaluated, bits per worker: wire bits of this step's own payloads, paper bits, entropy
  bits, bits every rank sent as counted by the transport, wall time);
* ``summary.json``: final accuracy, mean bits per worker per step, steps per second;
  ``complete`` is false for a run stopped early (``steps`` of ``total_steps`` done,
  ``interrupted_by`` the signal), whose plots and report cover the steps it took;
* ``accuracy.png``, ``loss.png``, ``bits.png``: the curves against the iteration;
* ``report.md``: a short human-readable account;
* ``checkpoint.pt``: what ``gradzip train --resume`` continues from
  (:mod:`gradzip.experiments.checkpoint`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TextIO


class RunWriter:
    """Writes a run directory incrementally (metrics are flushed every step). ``rows``: the
    rows of the steps already taken (a resumed run); ``metrics.jsonl`` is rewritten to hold
    exactly those (a checkpoint may be older than the last rows written) before new ones."""

    def __init__(
        self, out: str | Path, config: dict[str, Any], rows: list[dict[str, Any]] | None = None
    ) -> None:
        self.dir = Path(out)
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        self.rows: list[dict[str, Any]] = []
        temporary = self.dir / "metrics.jsonl.tmp"
        with temporary.open("w") as start:
            start.writelines(json.dumps(row, sort_keys=True) + "\n" for row in rows or [])
        temporary.replace(self.dir / "metrics.jsonl")
        self.rows.extend(rows or [])
        self._metrics: TextIO = (self.dir / "metrics.jsonl").open("a")

    def step(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        self._metrics.write(json.dumps(row, sort_keys=True) + "\n")
        self._metrics.flush()

    def finish(self, summary: dict[str, Any], config: dict[str, Any]) -> None:
        self._metrics.close()
        (self.dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
        plot_run(self.rows, self.dir, summary)
        (self.dir / "report.md").write_text(partial_note(report(summary, config), summary))


def partial_note(text: str, summary: dict[str, Any]) -> str:
    """``text`` (a report) with a line after its title saying the run stopped early, if so."""
    if summary.get("complete", True):
        return text
    title, _, rest = text.partition("\n")
    why = summary.get("interrupted_by") or "an interruption"
    note = (
        f"**Partial run**: stopped by {why} after {summary['steps']} of "
        f"{summary.get('total_steps', '?')} steps; the figures below cover those steps. "
        "`gradzip train --resume DIR` continues it."
    )
    return f"{title}\n\n{note}\n{rest}"


def plot_run(rows: list[dict[str, Any]], out: Path, summary: dict[str, Any] | None = None) -> None:
    """Accuracy, loss and bits against the iteration, as PNG files; ``bits.png`` draws the
    fp32 references of ``summary`` (one worker's uplink, a rank's ring all-reduce traffic)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    series = {
        "accuracy.png": (
            "accuracy",
            [("train", [r["train_acc"] for r in rows])],
            [("test", [(r["step"], r["test_acc"]) for r in rows if r.get("test_acc") is not None])],
        ),
        "loss.png": ("training loss", [("loss", [r["loss"] for r in rows])], []),
        "bits.png": (
            "Kbit per iteration",
            [
                (name, [r[key] / 1000 if r.get(key) is not None else float("nan") for r in rows])
                for name, key in (
                    ("uplink payload (wire)", "wire_bits"),
                    ("uplink payload (entropy)", "entropy_bits"),
                    ("sent per rank (mean)", "sent_bits"),
                    ("sent, busiest rank", "sent_bits_max"),
                    ("received per rank (mean)", "received_bits"),
                )
            ],
            [],
        ),
    }
    titles = {
        "accuracy.png": "Accuracy",
        "loss.png": "Training loss (mean over the workers)",
        "bits.png": "Bits per step, every byte counted, beside fp32",
    }
    references = [
        (label, (summary or {}).get(key))
        for label, key in (
            ("fp32 uplink of one worker (32 d)", "baseline_bits"),
            ("fp32 ring all-reduce, per rank", "fp32_ring_allreduce_bits"),
        )
    ]
    for name, (ylabel, lines, points) in series.items():
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for label, values in lines:
            ax.plot(steps, values, label=label)
        for label, pairs in points:
            if pairs:
                ax.plot([p[0] for p in pairs], [p[1] for p in pairs], "o-", label=label)
        if name == "bits.png":
            for (label, value), style in zip(references, ("--", ":"), strict=True):
                if value is not None:
                    ax.axhline(value / 1000, color="black", linestyle=style, label=label)
            ax.set_yscale("log")  # compressed traffic sits orders of magnitude below fp32
        ax.set_title(titles[name])
        ax.set_xlabel("iteration")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
        fig.tight_layout()
        fig.savefig(out / name, dpi=100)
        plt.close(fig)


def report(summary: dict[str, Any], config: dict[str, Any]) -> str:
    """A short Markdown account of the run."""

    def fmt(value: Any, scale: float = 1.0, digits: int = 1) -> str:
        return "n/a" if value is None else f"{value / scale:,.{digits}f}"

    return "\n".join(
        [
            f"# gradzip run: {config['model']} on {summary['dataset']}",
            "",
            f"- compressor `{config['compressor']}` {config['compressor_params']}, scheme "
            f"`{config['scheme']}`, error feedback {config['error_feedback']}",
            f"- {config['workers']} workers ({config['backend']}), {config['optimizer']} "
            f"lr {config['lr']}, total batch {config['batch_size']}, {summary['steps']} steps",
            "- final test accuracy: "
            + ("n/a" if summary["test_acc"] is None else f"{100 * summary['test_acc']:.2f}%"),
            f"- final training loss: {fmt(summary['loss'], 1.0, 4)}",
            "",
            "Per step, in Kbit (every byte the transport counted, finite-gradient flags, "
            "headers and length prefixes included):",
            "",
            "| what | Kbit |",
            "|---|---|",
            f"| a worker's uplink payload: wire | {fmt(summary['wire_bits'], 1000)} |",
            f"| a worker's uplink payload: paper bits | {fmt(summary['paper_bits'], 1000)} |",
            f"| a worker's uplink payload: entropy | {fmt(summary['entropy_bits'], 1000)} |",
            f"| a worker's uplink in fp32 (32 d) | {fmt(summary['baseline_bits'], 1000)} |",
            f"| sent per rank: mean / busiest | {fmt(summary.get('sent_bits'), 1000)} / "
            f"{fmt(summary.get('sent_bits_max'), 1000)} |",
            f"| received per rank: mean / busiest | {fmt(summary.get('received_bits'), 1000)} / "
            f"{fmt(summary.get('received_bits_max'), 1000)} |",
            f"| sent (and received) per rank by fp32 ring all-reduce, 2(P-1)/P 32 d | "
            f"{fmt(summary.get('fp32_ring_allreduce_bits'), 1000)} |",
            "",
            f"- {fmt(summary['steps_per_second'], 1.0, 2)} steps/s, "
            f"{fmt(summary['seconds'], 1.0, 1)} s in all",
            "",
            "Files: `config.json`, `metrics.jsonl`, `summary.json`, `accuracy.png`, `loss.png`, "
            "`bits.png`.",
            "",
        ]
    )
