"""One experiment over several seeds: every row's mean ± sample sd, and the designated method
comparisons tested for significance (``gradzip reproduce ID --seeds N``).

A seed fixes an experiment's initial weights, data order, noise and dithers, and every method
of one seed starts from the same of them, so the comparisons are **paired**: the per-seed
difference ``a - b`` removes what the methods share (an unlucky initialisation lowers both),
and Student's paired t-test (``n - 1`` degrees of freedom) asks whether its mean is 0. With 3
seeds the test has 2 degrees of freedom (95% interval ±4.30 standard errors), so only a
difference well above the seed-to-seed noise is called significant; the report says so.

An experiment designates its comparisons with a module-level ``COMPARISONS`` tuple of
:class:`Comparison`; each names two rows by the start of their quantity (so that one name
holds for the quick and the full mode, whose quantities may name the step count).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradzip_lab.reproduce.outcome import (
    Outcome,
    Row,
    footnote_lines,
    format_value,
    paper_cell,
    table_cell,
)
from gradzip_lab.reproduce.stats import (
    PairedTest,
    mean,
    paired_t_test,
    sample_sd,
    t_quantile,
)


@dataclass(frozen=True)
class Comparison:
    """``a - b`` over seeds, ``a`` and ``b`` the start of two rows' quantities."""

    label: str
    a: str
    b: str
    unit: str = ""


@dataclass(frozen=True)
class SeedRow:
    """One row of the experiment, measured once per seed (``None``: not measured)."""

    quantity: str
    unit: str
    paper: float | None
    paper_derived: str
    values: list[float | None]

    @property
    def measured(self) -> list[float]:
        return [v for v in self.values if v is not None]

    @property
    def mean(self) -> float | None:
        return mean(self.measured) if self.measured else None

    @property
    def sd(self) -> float | None:
        return sample_sd(self.measured)

    def to_dict(self) -> dict[str, Any]:
        return {
            "quantity": self.quantity,
            "unit": self.unit,
            "paper": self.paper,
            "paper_derived": self.paper_derived,
            "values": self.values,
            "mean": self.mean,
            "sd": self.sd,
            "n": len(self.measured),
        }


@dataclass(frozen=True)
class ComparisonResult:
    comparison: Comparison
    differences: list[float]
    test: PairedTest

    def to_dict(self) -> dict[str, Any]:
        t = self.test
        return {
            "label": self.comparison.label,
            "a": self.comparison.a,
            "b": self.comparison.b,
            "unit": self.comparison.unit,
            "differences": self.differences,
            "test": "paired t-test over seeds (two-sided)",
            "n": t.n,
            "mean": t.mean,
            "sd": t.sd,
            "t": t.t,
            "df": t.n - 1,
            "p": t.p,
            "ci95": [t.ci_low, t.ci_high],
            "significant": t.significant,
            "verdict": t.verdict(),
        }


@dataclass
class SeededOutcome:
    """The per-seed outcomes of one experiment folded into mean ± sd rows and tests."""

    id: str
    title: str
    quick: bool
    seeds: list[int]
    rows: list[SeedRow]
    comparisons: list[ComparisonResult]
    scaled_down: list[str]
    notes: list[str]
    plots: list[str]
    seconds: float


def find_row(rows: list[SeedRow], start: str) -> SeedRow:
    """The one row whose quantity starts with ``start``."""
    found = [r for r in rows if r.quantity.startswith(start)]
    if len(found) != 1:
        raise KeyError(f"{len(found)} rows start with {start!r} (need exactly one)")
    return found[0]


def compare(rows: list[SeedRow], comparison: Comparison) -> ComparisonResult:
    """The paired test of ``comparison`` over the seeds that measured both rows."""
    a, b = find_row(rows, comparison.a), find_row(rows, comparison.b)
    differences = [
        x - y for x, y in zip(a.values, b.values, strict=True) if x is not None and y is not None
    ]
    if not differences:
        raise ValueError(f"{comparison.label}: no seed measured both rows")
    return ComparisonResult(comparison, differences, paired_t_test(differences))


def aggregate(
    outcomes: list[Outcome],
    seeds: list[int],
    comparisons: tuple[Comparison, ...] | list[Comparison],
) -> SeededOutcome:
    """Fold one outcome per seed (the same rows in the same order) into mean ± sd rows and
    the paired tests of ``comparisons``."""
    if not outcomes or len(outcomes) != len(seeds):
        raise ValueError("one outcome per seed, at least one")
    first = outcomes[0]
    for seed, o in zip(seeds, outcomes, strict=True):
        if [r.quantity for r in o.rows] != [r.quantity for r in first.rows]:
            raise ValueError(f"seed {seed}'s rows differ from seed {seeds[0]}'s")
    rows = [
        SeedRow(r.quantity, r.unit, r.paper, r.paper_derived, [o.rows[i].ours for o in outcomes])
        for i, r in enumerate(first.rows)
    ]
    return SeededOutcome(
        id=first.id,
        title=first.title,
        quick=first.quick,
        seeds=list(seeds),
        rows=rows,
        comparisons=[compare(rows, c) for c in comparisons],
        scaled_down=first.scaled_down,
        notes=first.notes,
        plots=first.plots,
        seconds=sum(o.seconds for o in outcomes),
    )


def mean_sd(m: float | None, sd: float | None) -> str:
    """``12.34 ± 0.56`` (just the mean for one value, ``-`` for none)."""
    if m is None:
        return "-"
    if sd is None:
        return format_value(m)
    if sd <= 1e-12 * max(1.0, abs(m)):  # rounding noise of a figure every seed shares
        sd = 0.0
    return f"{format_value(m)} ± {format_value(sd)}"


def format_seed_rows(rows: list[dict[str, Any]]) -> str:
    """The rows (as in ``result.json``) as a Markdown table of mean ± sd over seeds."""
    lines = [
        "| quantity | unit | paper | ours: mean ± sd | n | per seed |",
        "|---|---|---:|---:|---:|---:|",
    ]
    footnotes: list[str] = []
    for r in rows:
        per_seed = ", ".join(format_value(v) for v in r["values"])
        paper = paper_cell(r["paper"], r.get("paper_derived", ""), footnotes)
        lines.append(
            f"| {table_cell(r['quantity'])} | {table_cell(r['unit'])} | {paper} | "
            f"{mean_sd(r['mean'], r['sd'])} | {r['n']} | {per_seed} |"
        )
    return "\n".join(lines + footnote_lines(footnotes))


def format_comparisons(comparisons: list[dict[str, Any]]) -> str:
    """The designated comparisons (as in ``result.json``) as a Markdown table."""
    lines = [
        "| comparison (a - b) | unit | mean ± sd | 95% CI | t | p | verdict |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for c in comparisons:
        low, high = c["ci95"]
        ci = "-" if low is None else f"[{format_value(low)}, {format_value(high)}]"
        t = "-" if c["t"] is None else f"{c['t']:.2f}"
        p = "-" if c["p"] is None else f"{c['p']:.3g}"
        lines.append(
            f"| {table_cell(c['label'])} | {table_cell(c['unit'])} | "
            f"{mean_sd(c['mean'], c['sd'])} | {ci} | {t} | {p} "
            f"| {c['verdict']} |"
        )
    return "\n".join(lines)


def comparison_note(n: int) -> str:
    """What the comparison table's test is, and what "not significant" means with ``n`` seeds."""
    width = f"±{t_quantile(0.975, n - 1):.2f} standard errors" if n > 1 else "undefined"
    return (
        "Comparisons: Student's paired t-test over seeds, two-sided, n - 1 degrees of freedom. "
        "Paired because every method of one seed starts from the same initial weights, data "
        "order and noise, so the per-seed difference removes what they share. Significant "
        f"means p < 0.05; with {n} seeds the 95% interval of the difference is {width}, so a "
        "difference within the seed-to-seed noise is reported as not significant rather than "
        "as a finding."
    )


def seeded_result(o: SeededOutcome) -> dict[str, Any]:
    """What ``result.json`` holds: every seed's value of every row, so that the tables (and
    the docs generated from them) can be recomputed from the file alone."""
    return {
        "id": o.id,
        "title": o.title,
        "quick": o.quick,
        "seeds": o.seeds,
        "seconds": o.seconds,
        "rows": [r.to_dict() for r in o.rows],
        "comparisons": [c.to_dict() for c in o.comparisons],
        "scaled_down": o.scaled_down,
        "notes": o.notes,
        "plots": o.plots,
    }


def format_seeded_report(result: dict[str, Any]) -> str:
    """The Markdown report of a multi-seed run, from its :func:`seeded_result`."""
    mode = "--quick (scaled down further for a fast check)" if result["quick"] else "full"
    seeds = result["seeds"]
    first = f"seed-{seeds[0]}"
    parts = [
        f"# {result['id']}: {result['title']}",
        "",
        f"Mode: {mode}. Seeds: {', '.join(map(str, seeds))} (n = {len(seeds)}). "
        f"Wall time, all seeds: {result['seconds']:.1f} s. Every seed's own report is in "
        "seed-<seed>/report.md.",
        "",
        format_seed_rows(result["rows"]),
    ]
    if result["comparisons"]:
        parts += ["", "## Method comparisons", "", format_comparisons(result["comparisons"])]
        parts += ["", comparison_note(len(seeds))]
    parts += [
        "",
        "## What was scaled down, and why",
        "",
        *(f"- {s}" for s in result["scaled_down"]),
    ]
    if result["notes"]:
        parts += ["", f"## Notes (of {first})", "", *(f"- {n}" for n in result["notes"])]
    if result["plots"]:
        parts += ["", f"## Plots ({first})", ""]
        parts += [f"![{p}]({first}/{p})" for p in result["plots"]]
    return "\n".join(parts) + "\n"


def write_seeded(o: SeededOutcome, directory: Path) -> None:
    """Write the multi-seed ``report.md`` and ``result.json`` into ``directory``."""
    result = seeded_result(o)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "report.md").write_text(format_seeded_report(result))
    (directory / "result.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")


def read_outcome(path: Path) -> Outcome:
    """The :class:`Outcome` a single-seed ``result.json`` was written from (its rows, texts
    and time; ``extra`` is left out), so that stored runs can be aggregated again."""
    data = json.loads(path.read_text())
    rows = [
        Row(r["quantity"], r["paper"], r["ours"], r.get("unit", ""), r.get("paper_derived", ""))
        for r in data["rows"]
    ]
    return Outcome(
        id=data["id"],
        title=data["title"],
        quick=data["quick"],
        rows=rows,
        scaled_down=data["scaled_down"],
        notes=data["notes"],
        plots=data["plots"],
        seconds=data["seconds"],
    )
