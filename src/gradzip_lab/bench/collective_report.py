"""The printed table of ``gradzip bench collectives`` and the growth of bytes with ``P``."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from gradzip_lab.bench.collective_baselines import ring_allreduce_bytes
from gradzip_lab.bench.collective_figures import RankFigures


@dataclass
class CollectiveRow:
    """One line of the table (bytes per rank and step; ``bytes_source`` says how they were got)."""

    scheme: str
    compressor: str
    world_size: int
    numel: int
    sent_mean: float
    sent_max: float
    received_mean: float
    received_max: float
    busiest_rank_bytes: float  # max over ranks of sent + received
    bits_per_element: float  # 8 * sent_mean / numel
    ms_per_step: float
    bytes_source: str  # "measured" (transport meter) or "formula" (ring all-reduce)
    error_feedback: bool
    timed: str
    extra_ms: dict[str, float] = field(default_factory=dict)


def make_row(
    label: str,
    compressor: str,
    figures: list[RankFigures],
    numel: int,
    *,
    error_feedback: bool = False,
    timed: str,
    element_bytes: int = 0,
) -> CollectiveRow:
    """Aggregate the ranks' figures; ``element_bytes > 0`` means bytes by the ring formula."""
    world = len(figures)
    if element_bytes:
        sent = received = [ring_allreduce_bytes(world, numel, element_bytes)] * world
    else:
        sent = [statistics.fmean(f.sent) for f in figures]
        received = [statistics.fmean(f.received) for f in figures]
    slowest = [max(per_rank) for per_rank in zip(*(f.seconds for f in figures), strict=True)]
    extra: dict[str, float] = {}
    for name in figures[0].extra_seconds:
        per_step = zip(*(f.extra_seconds[name] for f in figures), strict=True)
        extra[name] = 1e3 * statistics.median([max(s) for s in per_step])
    return CollectiveRow(
        scheme=label,
        compressor=compressor,
        world_size=world,
        numel=numel,
        sent_mean=statistics.fmean(sent),
        sent_max=max(sent),
        received_mean=statistics.fmean(received),
        received_max=max(received),
        busiest_rank_bytes=max(s + r for s, r in zip(sent, received, strict=True)),
        bits_per_element=8 * statistics.fmean(sent) / numel,
        ms_per_step=1e3 * statistics.median(slowest),
        bytes_source="formula" if element_bytes else "measured",
        error_feedback=error_feedback,
        timed=timed,
        extra_ms=extra,
    )


HEADER = (
    f"{'scheme':<21} {'compressor':<10} {'P':>2}  {'sent B/rank/step':>23}  "
    f"{'recv B/rank/step':>23}  {'bits/elem':>9}  {'ms/step':>8}  bytes"
)
SUBHEADER = f"{'':<21} {'':<10} {'':>2}  {'mean / max':>23}  {'mean / max':>23}  {'(sent)':>9}"


def format_row(row: CollectiveRow) -> str:
    source = "measured" if row.bytes_source == "measured" else "FORMULA 2(P-1)/P*bytes*n"
    return (
        f"{row.scheme:<21} {row.compressor:<10} {row.world_size:>2}  "
        f"{row.sent_mean:>11,.0f} / {row.sent_max:>9,.0f}  "
        f"{row.received_mean:>11,.0f} / {row.received_max:>9,.0f}  "
        f"{row.bits_per_element:>9.3f}  {row.ms_per_step:>8.2f}  {source}"
    )


@dataclass
class Growth:
    """How one scheme's bytes per rank grow from the smallest to the largest world size."""

    scheme: str
    compressor: str
    from_p: int
    to_p: int
    sent_mean_ratio: float
    received_mean_ratio: float
    busiest_rank_ratio: float
    bytes_source: str


def growth(rows: list[CollectiveRow]) -> list[Growth]:
    """Ratios of the largest-P row to the smallest-P row of every (scheme, compressor)."""
    by_case: dict[tuple[str, str], list[CollectiveRow]] = {}
    for row in rows:
        by_case.setdefault((row.scheme, row.compressor), []).append(row)
    out = []
    for (scheme, compressor), case_rows in by_case.items():
        low = min(case_rows, key=lambda r: r.world_size)
        high = max(case_rows, key=lambda r: r.world_size)
        if low.world_size == high.world_size:
            continue
        out.append(
            Growth(
                scheme=scheme,
                compressor=compressor,
                from_p=low.world_size,
                to_p=high.world_size,
                sent_mean_ratio=_ratio(high.sent_mean, low.sent_mean),
                received_mean_ratio=_ratio(high.received_mean, low.received_mean),
                busiest_rank_ratio=_ratio(high.busiest_rank_bytes, low.busiest_rank_bytes),
                bytes_source=low.bytes_source,
            )
        )
    return out


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def format_growth(items: list[Growth]) -> list[str]:
    if not items:
        return []
    lo, hi = items[0].from_p, items[0].to_p
    lines = [
        f"Growth of bytes per rank and step with P (ratio P={hi} / P={lo}; for reference "
        f"P-1 grows {(hi - 1) / (lo - 1):.2f}x, 2(P-1)/P grows {(hi - 1) * lo / (hi * (lo - 1)):.2f}x):",
        f"{'scheme':<21} {'compressor':<10} {'mean sent':>10} {'mean recv':>10} "
        f"{'busiest rank sent+recv':>23}",
    ]
    for g in items:
        note = "  (formula)" if g.bytes_source == "formula" else ""
        lines.append(
            f"{g.scheme:<21} {g.compressor:<10} {g.sent_mean_ratio:>9.2f}x "
            f"{g.received_mean_ratio:>9.2f}x {g.busiest_rank_ratio:>22.2f}x{note}"
        )
    return lines
