"""Training runs for ``gradzip reproduce``: one :func:`~gradzip.experiments.backends.train` call
per curve, its per-step rows read back from the run directory, and the curve plot."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradzip.comm.local import DEFAULT_TIMEOUT
from gradzip.compressors.buckets import papers_scales
from gradzip.experiments.config import TrainConfig
from gradzip_lab.reproduce.plots import line_plot


@dataclass
class Run:
    """One finished run: its label, the summary of ``train`` and the per-step metrics rows."""

    label: str
    summary: dict[str, Any]
    rows: list[dict[str, Any]]

    def mean(self, key: str) -> float | None:
        """Mean of ``key`` over the steps that report it (e.g. ``entropy_bits``)."""
        values = [float(r[key]) for r in self.rows if r.get(key) is not None]
        return sum(values) / len(values) if values else None

    def curve(self, key: str = "test_acc") -> list[tuple[int, float]]:
        """``(step, value)`` for every step that reports ``key``."""
        return [(int(r["step"]), float(r[key])) for r in self.rows if r.get(key) is not None]


def run_training(label: str, out: Path, **options: Any) -> Run:
    """Train with ``TrainConfig(**options)`` into ``out`` (simulated workers, no progress bar),
    replacing the run a previous ``gradzip reproduce`` left there."""
    from gradzip.experiments.backends import train

    if "compressor" in options:  # the papers' one scale per tensor, as they ran it
        options["compressor_params"] = papers_scales(
            options["compressor"], options.get("compressor_params", {})
        )
    if "scheme" not in options:  # the papers' parameter server with its fp32 downlink
        options["scheme"] = "nested[server]" if options.get("compressor") == "ndqsg" else "ps[fp32]"
    # the simulated ranks' deadlock guard, not `gradzip train`'s 60 s for process ranks: on a
    # loaded machine a large model's step between two messages can take minutes
    options.setdefault("timeout", DEFAULT_TIMEOUT)
    config = TrainConfig(out=str(out), progress=False, **options)
    summary = train(config, force=True).to_dict()
    with (out / "metrics.jsonl").open() as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return Run(label, summary, rows)


def plot_curves(runs: list[Run], path: Path, title: str, key: str = "test_acc") -> None:
    """``key`` (in %) against the iteration for every run, as one PNG."""
    series = []
    for run in runs:
        points = run.curve(key)
        series.append((run.label, [p[0] for p in points], [100 * p[1] for p in points]))
    ylabel = "test accuracy (%)" if key == "test_acc" else key
    line_plot(path, series, title=title, ylabel=ylabel)
