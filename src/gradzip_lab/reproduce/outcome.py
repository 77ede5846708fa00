"""Shared pieces of ``gradzip reproduce``: comparison rows, the report and the result file.

Every experiment returns a :class:`Outcome`: rows of (quantity, the paper's value, ours), notes
on what was scaled down, and extra sections; :func:`write_outcome` turns it into
``<out>/<id>/report.md`` and ``<out>/<id>/result.json``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Row:
    """One compared quantity: ``ours`` beside ``paper`` (``None`` where there is nothing to
    compare: the paper gives no figure, or we did not measure it).

    ``paper_derived`` says how a paper value was obtained when the paper does not state it
    (e.g. "mean of the paper's 619.2 and 422.8 Kbit"): the report prints such a value as
    "521.00 (derived [1])" with the explanation as footnote [1], so a reader never takes a
    computed figure for one the authors printed. Empty: the paper states the value.
    """

    quantity: str
    paper: float | None
    ours: float | None
    unit: str = ""
    paper_derived: str = ""

    @property
    def deviation(self) -> float | None:
        """``ours - paper``."""
        if self.paper is None or self.ours is None:
            return None
        return self.ours - self.paper

    @property
    def deviation_pct(self) -> float | None:
        """``100 * (ours / paper - 1)``."""
        if self.paper is None or self.ours is None or self.paper == 0:
            return None
        return 100.0 * (self.ours / self.paper - 1.0)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(deviation=self.deviation, deviation_pct=self.deviation_pct)
        return out


@dataclass
class Outcome:
    """What one experiment measured, ready to be written."""

    id: str
    title: str
    quick: bool
    rows: list[Row]
    scaled_down: list[str]
    notes: list[str] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


def format_value(value: float | None, digits: int = 2, sign: bool = False) -> str:
    """A figure as the reports print it: ``-`` for none, thousands separators, ``digits``
    decimals, and 3 significant digits for very small or very large values."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if value != 0 and not 10**-digits <= abs(value) < 1e9:
        # a convergence ratio of 1e-7 or a divergence of 1e12 keeps its significant digits
        return f"{value:+.3g}" if sign else f"{value:.3g}"
    return f"{value:+,.{digits}f}" if sign else f"{value:,.{digits}f}"


def table_cell(text: str) -> str:
    """``text`` safe inside a Markdown table cell: its ``|`` (a norm, ``||w||``) escaped, which
    would otherwise end the cell."""
    return text.replace("|", "\\|")


def format_rows(rows: list[Row]) -> str:
    """The comparison as a Markdown table; derived paper values are marked and explained in
    numbered footnotes below it (one number per distinct explanation)."""
    lines = [
        "| quantity | unit | paper | ours | deviation | deviation % |",
        "|---|---|---:|---:|---:|---:|",
    ]
    footnotes: list[str] = []
    for r in rows:
        paper = paper_cell(r.paper, r.paper_derived, footnotes)
        lines.append(
            f"| {table_cell(r.quantity)} | {table_cell(r.unit)} | {paper} | {format_value(r.ours)} | "
            f"{format_value(r.deviation, sign=True)} | {format_value(r.deviation_pct, sign=True)} |"
        )
    return "\n".join(lines + footnote_lines(footnotes))


def paper_cell(paper: float | None, derived: str, footnotes: list[str]) -> str:
    """A paper value as a table cell; a derived one is marked "(derived [n])", its explanation
    appended to ``footnotes`` (once per distinct text) as footnote n."""
    cell = format_value(paper)
    if derived and paper is not None:
        if derived not in footnotes:
            footnotes.append(derived)
        cell += f" (derived [{footnotes.index(derived) + 1}])"
    return cell


def footnote_lines(footnotes: list[str]) -> list[str]:
    """The lines below a table that explain its derived paper values (none if there are none)."""
    if not footnotes:
        return []
    return [
        "",
        "Derived paper values (the paper does not print them):",
        "",
        *(f"- [{i}] {text}" for i, text in enumerate(footnotes, 1)),
    ]


def format_report(o: Outcome) -> str:
    """The Markdown report of one experiment."""
    mode = "--quick (scaled down further for a fast check)" if o.quick else "full"
    parts = [
        f"# {o.id}: {o.title}",
        "",
        f"Mode: {mode}. Wall time: {o.seconds:.1f} s.",
        "",
        format_rows(o.rows),
        "",
        "## What was scaled down, and why",
        "",
        *(f"- {s}" for s in o.scaled_down),
    ]
    if o.notes:
        parts += ["", "## Notes", "", *(f"- {n}" for n in o.notes)]
    if o.plots:
        parts += ["", "## Plots", "", *(f"![{p}]({p})" for p in o.plots)]
    return "\n".join(parts) + "\n"


def write_outcome(o: Outcome, directory: Path) -> None:
    """Write ``report.md`` and ``result.json`` into ``directory`` (created)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "report.md").write_text(format_report(o))
    result = {
        "id": o.id,
        "title": o.title,
        "quick": o.quick,
        "seconds": o.seconds,
        "rows": [r.to_dict() for r in o.rows],
        "scaled_down": o.scaled_down,
        "notes": o.notes,
        "plots": o.plots,
        **o.extra,
    }
    (directory / "result.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
