"""``gradzip bench cluster``'s ratios to a baseline, per mode and, with ``--mode both``, the
isolated and the interleaved ratios side by side.

A ratio is the baseline variant's figure over the row's (step time, or time to the target
loss): above 1 the row's variant is faster. Step time cells show the median over every timed
step of every launch and, with several rounds, the range of the rounds' own medians in
brackets; ``interl/isol`` is the interleaved figure over the isolated one (the crowding's
effect on that variant alone).
"""

from __future__ import annotations

from typing import Any

from gradzip_lab.bench.cluster_plan import INTERLEAVED, ISOLATED


def default_baseline(names: list[str]) -> str:
    """The first selected variant that communicates (``none`` only where nothing else is)."""
    return next((n for n in names if n != "none"), names[0])


def _figure(row: dict[str, Any] | None, key: str) -> float | None:
    value = None if row is None else row.get(key)
    return None if value is None else float(value)


def _ratio(num: float | None, den: float | None) -> str:
    return "-" if num is None or den is None or den <= 0 else f"{num / den:.2f}"


def _cell(row: dict[str, Any] | None, key: str) -> str:
    value = _figure(row, key)
    if value is None or row is None:
        return "-"
    text = f"{value:,.0f}" if key == "step_ms" else f"{value:,.1f}"
    rounds = row.get("step_ms_rounds") or []
    if key == "step_ms" and len(rounds) > 1:
        text += f" [{min(rounds):,.0f}-{max(rounds):,.0f}]"
    return text


def format_comparison(
    rows: list[dict[str, Any]], baseline: str, key: str = "step_ms", what: str = "ms/step"
) -> list[str]:
    """Per model, world size and rate: a line per variant with each mode's ``key`` figure and
    its ratio to ``baseline`` (see the module docstring)."""
    modes = [m for m in (ISOLATED, INTERLEAVED) if any(r.get("mode") == m for r in rows)]
    lines = [
        f"{what} per mode and x {baseline} (its figure over the variant's; > 1: faster)"
        + (", and the interleaved figure over the isolated one" if len(modes) == 2 else "")
    ]
    header = ["variant"]
    for m in modes:
        header += [f"{m} {what}", "x base"]
    if len(modes) == 2:
        header.append("interl/isol")
    settings = list(dict.fromkeys((r["model"], r["world_size"], r["rate"]) for r in rows))
    for model, world, rate in settings:
        block = [
            r for r in rows if (r["model"], r["world_size"], r["rate"]) == (model, world, rate)
        ]
        by = {(r.get("mode"), r["variant"]): r for r in block}
        table = [header]
        for variant in dict.fromkeys(r["variant"] for r in block):
            line = [variant]
            for m in modes:
                row = by.get((m, variant))
                line += [
                    _cell(row, key),
                    _ratio(_figure(by.get((m, baseline)), key), _figure(row, key)),
                ]
            if len(modes) == 2:
                line.append(
                    _ratio(_figure(by.get((INTERLEAVED, variant)), key),
                           _figure(by.get((ISOLATED, variant)), key))
                )  # fmt: skip
            table.append(line)
        widths = [max(len(line[i]) for line in table) for i in range(len(header))]
        lines.append(f"{model}, P = {world}, rate {rate}")
        for line in table:
            cells = [line[0].ljust(widths[0])] + [
                c.rjust(w) for c, w in zip(line[1:], widths[1:], strict=True)
            ]
            lines.append("  ".join(cells))
        lines.append("")
    return lines
