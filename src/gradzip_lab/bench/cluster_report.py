"""Rows, table, JSON and plot of ``gradzip bench cluster``.

A row is one (model, world size, rate, variant). From the ranks' per-step figures:

* ``step_ms``: per timed step the slowest rank's time, then the median over the timed steps;
* ``compute_ms``: the ``none`` variant's ``step_ms`` at the same model, world size and rate
  (None where it was not run);
* ``ranks_per_node`` (K): the ranks that share a node's namespace and its veth
  (:mod:`.cluster_topology`);
* ``bytes_sent_per_node``: the node veth's ``tx_bytes`` growth over one step (the wire, with
  TCP/IP headers and ACKs; traffic between ranks of one node is not on it), mean over the timed
  steps, then over the ranks (each reads its node's counter); ``bytes_received_per_node``
  likewise from ``rx_bytes``; ``bytes_sent_per_rank`` / ``bytes_received_per_rank``: the node's
  divided by K (K = 1: the rank's own veth);
* ``payload_bytes_per_rank``: what gradzip's transport meter counted as sent in a step (payloads
  plus length prefixes), mean over steps and ranks; None for the torch variants;
* ``loss_first`` / ``loss_last``: the training loss at the first and last timed step, mean over
  the ranks (each rank's own batch);
* ``step_ms_no_limit``: the same variant's ``step_ms`` at rate ``none`` (None where not run):
  the issue's other reading of "compute";
* ``speedup_vs_fp32``: the ``fp32`` row's ``step_ms`` over this row's, at the same model, world
  size and rate (None where fp32 was not run);
* ``speedup_vs_baseline``: likewise over the ``--baseline`` variant's row (the same mode).

The rows of several launches and modes: :mod:`.cluster_merge`; the two modes side by side:
:mod:`.cluster_compare`.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Any

MB = 1e6


def make_row(
    model: str, world_size: int, rate: str, variant: str, ranks: list[dict[str, Any]]
) -> dict[str, Any]:
    """One row from every rank's figures for ``variant`` (see the module docstring)."""
    per_rank = [r["variants"][variant] for r in ranks]
    slowest = [max(step) for step in zip(*(f["seconds"] for f in per_rank), strict=True)]
    payload = [f["payload_bytes"] for f in per_rank]
    return {
        "model": model,
        "world_size": world_size,
        "rate": rate,
        "variant": variant,
        "step_ms": 1e3 * statistics.median(slowest),
        "compute_ms": None,
        "bytes_sent_per_rank": statistics.fmean(statistics.fmean(f["tx_bytes"]) for f in per_rank),
        "bytes_received_per_rank": statistics.fmean(
            statistics.fmean(f["rx_bytes"]) for f in per_rank
        ),
        "payload_bytes_per_rank": (
            None
            if any(p is None for p in payload)
            else statistics.fmean(map(statistics.fmean, payload))
        ),
        "loss_first": statistics.fmean(f["losses"][0] for f in per_rank),
        "loss_last": statistics.fmean(f["losses"][-1] for f in per_rank),
        "step_ms_per_step": [1e3 * s for s in slowest],
        "speedup_vs_fp32": None,
    }


def add_topology(row: dict[str, Any], ranks_per_node: int) -> dict[str, Any]:
    """``row`` (of :func:`make_row`, whose per-rank bytes are what each rank read on its node's
    veth) with ``ranks_per_node``, the per-node bytes, and the per-rank bytes as the node's / K."""
    for way in ("sent", "received"):
        node = row[f"bytes_{way}_per_rank"]
        row[f"bytes_{way}_per_node"] = node
        row[f"bytes_{way}_per_rank"] = node / ranks_per_node
    row["ranks_per_node"] = ranks_per_node
    return row


def fill_references(rows: list[dict[str, Any]], baseline: str | None = None) -> None:
    """Set ``compute_ms`` (the ``none`` row's step), ``speedup_vs_fp32``, ``step_ms_no_limit``
    and, with a ``baseline`` variant, ``speedup_vs_baseline`` (its ``step_ms`` over the row's)
    on every row; a row's references are the rows of the same model, world size, rate and mode
    (``mode`` absent counts as one mode)."""

    def setting(r: dict[str, Any]) -> tuple[Any, ...]:
        return (r["model"], r["world_size"], r.get("mode"))

    for row in rows:
        by_variant = {
            r["variant"]: r for r in rows if setting(r) == setting(row) and r["rate"] == row["rate"]
        }
        if "none" in by_variant:
            row["compute_ms"] = by_variant["none"]["step_ms"]
        if "fp32" in by_variant and row["step_ms"] > 0:
            row["speedup_vs_fp32"] = by_variant["fp32"]["step_ms"] / row["step_ms"]
        if baseline is not None:
            row["baseline"] = baseline
            base = by_variant.get(baseline)
            row["speedup_vs_baseline"] = (
                base["step_ms"] / row["step_ms"] if base and row["step_ms"] > 0 else None
            )
        unlimited = [
            r
            for r in rows
            if setting(r) == setting(row) and (r["variant"], r["rate"]) == (row["variant"], "none")
        ]
        row["step_ms_no_limit"] = unlimited[0]["step_ms"] if unlimited else None


def _ordered(values: list[Any]) -> list[Any]:
    return list(dict.fromkeys(values))


def format_table(rows: list[dict[str, Any]]) -> list[str]:
    """Per model and world size: a line per variant; per rate, step ms, MB sent per node per
    step (measured on the node's veth; a node is one rank where ``ranks_per_node`` is 1 or
    absent) and the speedup over fp32."""
    lines: list[str] = []
    for model in _ordered([r["model"] for r in rows]):
        for world in _ordered([r["world_size"] for r in rows if r["model"] == model]):
            block = [r for r in rows if r["model"] == model and r["world_size"] == world]
            rates = _ordered([r["rate"] for r in block])
            width = max(len("variant"), *(len(r["variant"]) for r in block)) + 2
            per_node = block[0].get("ranks_per_node", 1)
            nodes = f", {world // per_node} nodes of {per_node} ranks" if per_node > 1 else ""
            lines.append(f"{model}, P = {world}{nodes}")
            lines.append(" " * width + "".join(f"| {rate:^28}" for rate in rates))
            lines.append(
                f"{'variant':<{width}}"
                + f"| {'ms/step':>9} {'MB/step':>8} {'x fp32':>8}  " * len(rates)
            )
            for variant in _ordered([r["variant"] for r in block]):
                cells = []
                for rate in rates:
                    match = [r for r in block if r["variant"] == variant and r["rate"] == rate]
                    if not match:
                        cells.append(f"| {'-':>9} {'-':>8} {'-':>8}  ")
                        continue
                    r = match[0]
                    speed = r["speedup_vs_fp32"]
                    cells.append(
                        f"| {r['step_ms']:>9,.0f} {node_bytes(r) / MB:>8.3f} "
                        f"{'-' if speed is None else f'{speed:.2f}':>8}  "
                    )
                lines.append(f"{variant:<{width}}" + "".join(cells))
            lines.append("")
    return lines


def node_bytes(row: dict[str, Any]) -> float:
    """The bytes a node's veth sent per step (rows from before nodes: the rank's veth)."""
    return float(row.get("bytes_sent_per_node", row["bytes_sent_per_rank"]))


def provenance() -> dict[str, Any]:
    """Where a result came from: ``command`` (this process's command line, the program as
    ``gradzip``) and ``machine`` (CPU model and count, torch version, platform, the load average
    and the UTC time when the result was written)."""
    import datetime
    import os
    import shlex
    import sys

    import torch

    cpuinfo = Path("/proc/cpuinfo")
    models = (
        re.findall(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(), re.M)
        if cpuinfo.exists()
        else []
    )
    return {
        "command": shlex.join(["gradzip", *sys.argv[1:]]),
        "machine": {
            "cpu": models[0] if models else os.uname().machine,
            "cpu_count": os.cpu_count(),
            "torch": torch.__version__,
            "platform": " ".join(os.uname()[i] for i in (0, 2, 4)),  # system, release, machine
            "loadavg": list(os.getloadavg()),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        },
    }


def write_json(path: str | Path, rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    """``{"runs": rows, **meta, **provenance()}`` as indented JSON."""
    Path(path).write_text(json.dumps({"runs": rows, **meta, **provenance()}, indent=2))


def write_png(path: str | Path, rows: list[dict[str, Any]]) -> None:
    """Bars of step time (log scale) per variant, one bar per rate, a panel per model and world
    size (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = _ordered([(r["model"], r["world_size"]) for r in rows])
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(11, 4.2 * len(panels)), squeeze=False, constrained_layout=True
    )
    for ax, (model, world) in zip(axes[:, 0], panels, strict=True):
        block = [r for r in rows if r["model"] == model and r["world_size"] == world]
        variants = _ordered([r["variant"] for r in block])
        rates = _ordered([r["rate"] for r in block])
        width = 0.8 / len(rates)
        for i, rate in enumerate(rates):
            xs, ys = [], []
            for j, variant in enumerate(variants):
                match = [r for r in block if r["variant"] == variant and r["rate"] == rate]
                if match:
                    xs.append(j + (i - (len(rates) - 1) / 2) * width)
                    ys.append(match[0]["step_ms"])
            ax.bar(xs, ys, width=width, label=f"rate {rate}")
        ax.set_yscale("log")
        ax.set_xticks(range(len(variants)))
        ax.set_xticklabels(variants, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("step time, ms (slowest rank, median)")
        per_node = block[0].get("ranks_per_node", 1)
        nodes = f", {per_node} ranks per node" if per_node > 1 else ""
        ax.set_title(f"gradzip bench cluster: {model}, P = {world}{nodes}")
        ax.grid(axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)
