"""``gradzip bench project --validate``: the scaling model against ``gradzip bench cluster``.

Each row of a cluster JSON file (P, rate, variant, measured ms a step and MB a rank) is predicted
with the same model as the projection, from this machine's measured codecs and payload sizes:
nothing is fitted per row. What comes from the file:

* the compute time: the row's ``compute_ms`` (the ``none`` variant's step in the same launch),
  else the ``none`` rows of the given files at the same model and P, measured on the row's CPU
  where there are any (:func:`compute_of`; rows with neither are listed as skipped);
* the codecs' share of a core: ``min(1, cpu_count / P)`` from the file's ``cpu_count`` (P ranks
  share its cores; [CHOICE] a fact of the run, not a fit);
* the link: the row's tc rate, at the wire efficiency of TCP framing
  (:data:`~gradzip_lab.bench.project_links.WIRE_EFFICIENCY`) and the alpha given (default
  :data:`DEFAULT_ALPHA_S`); its all-to-all efficiency from the row's ``link_probe``
  (:mod:`~gradzip_lab.bench.cluster_probe`, measured on the same links before the variants),
  1 for files written before the probe (the table prints ``-``); the transport's gather form
  from the file's ``ring_gather_from`` (a part of the row's configuration). Rows at rate ``none`` (no limit) are skipped: the veth's own rate
  is not a link parameter the file records;
* the rows scored: each configuration's newest measurement (:func:`newest`; older ones are
  listed as superseded);
* the nodes: the row's ``ranks_per_node`` (else the file's, else 1). Ranks of one node talk
  over its loopback, which the cluster does not limit: [CHOICE] those links are modelled at
  ``intra_gbit`` (the projection's ``--intra-gbit``), the node's own link at the row's rate.
  The MB column stays the file's bytes a rank (a node's veth bytes / K).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gradzip_lab.bench.project_borrowed_probes import lend_probes
from gradzip_lab.bench.project_links import Link
from gradzip_lab.bench.project_rows import MeasuredRow
from gradzip_lab.bench.project_variants import Network, Workload, predict

if TYPE_CHECKING:
    from gradzip.schemes.spec import Value

#: [CHOICE] the per-message latency on the emulated cluster (veth through a bridge namespace):
#: tens of microseconds; it is negligible beside the megabyte messages of these rows
DEFAULT_ALPHA_S = 50e-6


#: variant names the stored files wrote before the exchange-spec spelling settled
OLD_NAMES = {
    "gradzip:topk+ef:allgather": "gradzip:topk[ratio=0.01]+ef:allgather",
    "gradzip:topk-rice-qsgd+ef:allgather": (
        "gradzip:topk[ratio=0.01,index_coding=rice,value_codec=qsgd]+ef:allgather"
    ),
}

#: scheme defaults that changed, as ``(scheme, option, old value, since)``: a row measured
#: before ``since`` (or at an unknown time) ran the old value, so it is scored as the variant
#: spelled with it (:func:`as_measured`); the integer all-reduce summed one chunk before its
#: pipelined chunks became the default
CHANGED_DEFAULTS: tuple[tuple[str, str, Value, str], ...] = (
    ("allreduce", "chunk_values", None, "2026-11-29T14:00:00+00:00"),
)


def as_measured(variant: str, measured_at: str) -> str:
    """``variant`` spelled with the defaults it ran with when measured at ``measured_at`` (ISO
    time, "" unknown): a gradzip exchange that leaves a changed option to its default gets the
    old value written out (see :data:`CHANGED_DEFAULTS`); anything else as it is."""
    if not variant.startswith("gradzip:"):
        return variant
    from gradzip.schemes.spec import ExchangeSpec, SchemeSpec

    spec = ExchangeSpec.parse(variant)
    options = dict(spec.scheme.options)
    for scheme, option, old, since in CHANGED_DEFAULTS:
        if spec.scheme.name == scheme and option not in options and measured_at < since:
            options[option] = old
    if options == dict(spec.scheme.options):
        return variant
    return str(replace(spec, scheme=SchemeSpec.of(spec.scheme.name, **options)))


@dataclass(frozen=True)
class Checked:
    """A measured row and its prediction."""

    row: MeasuredRow
    predicted_ms: float
    predicted_mb: float

    @property
    def relative_error(self) -> float:
        return (self.predicted_ms - self.row.step_ms) / self.row.step_ms


def read_rows(path: str | Path) -> list[MeasuredRow]:
    """The rows of one ``gradzip bench cluster --json`` file; ``ValueError`` naming the file and
    what is missing when it is not one."""
    from gradzip_lab.bench.cluster_netns import parse_rate

    text = Path(path).read_text()
    try:
        data = json.loads(text)
        runs: list[dict[str, Any]] = data["runs"]
        cpu_count = int(data.get("cpu_count") or data.get("machine", {}).get("cpu_count") or 0)
        file_nodes = int(data.get("ranks_per_node") or 1)
        ring_from = data.get("ring_gather_from")
        segment_from = data.get("segment_from")
        measured_at, cpu = _when_and_where(Path(path), data)
        rows = []
        for run in runs:
            sent = run.get("bytes_sent_per_rank")
            rows.append(
                MeasuredRow(
                    source=Path(path).name,
                    model=str(run.get("model", "mlp-4096")),
                    world_size=int(run["world_size"]),
                    rate=str(run["rate"]),
                    bits_per_s=parse_rate(str(run["rate"])),
                    variant=as_measured(
                        OLD_NAMES.get(str(run["variant"]), str(run["variant"])), measured_at
                    ),
                    step_ms=float(run["step_ms"]),
                    compute_ms=None if run.get("compute_ms") is None else float(run["compute_ms"]),
                    mb_per_rank=None if sent is None else float(sent) / 1e6,
                    cpu_count=cpu_count,
                    ranks_per_node=int(run.get("ranks_per_node") or file_nodes),
                    measured_at=measured_at,
                    cpu=cpu,
                    ring_gather_from=None if ring_from is None else int(ring_from),
                    segment_from=None if segment_from is None else int(segment_from),
                    alltoall_efficiency=_probed_efficiency(run.get("link_probe")),
                    probed_alpha_s=_probed_alpha(run.get("link_probe"), int(run["world_size"])),
                )
            )
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise ValueError(
            f"{path}: not a `gradzip bench cluster --json` file (a 'runs' list of rows with "
            f"world_size, rate, variant, step_ms): {err}"
        ) from None
    return rows


def _probed_efficiency(probe: Any) -> float | None:
    """A row's measured all-to-all efficiency (:mod:`~gradzip_lab.bench.cluster_probe`), None
    where it has no probe."""
    if probe is None:
        return None
    value = float(probe["alltoall_efficiency"])
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"link_probe's alltoall_efficiency is not a number > 0: {value}")
    return value


def _probed_alpha(probe: Any, world_size: int) -> float | None:
    """A row's alpha from its probe's small all-to-all (:mod:`~gradzip_lab.bench.cluster_probe`:
    the model counts ``P - 1`` messages an all-to-all), None where it has none."""
    if probe is None or probe.get("alltoall_latency_s") is None:
        return None
    value = float(probe["alltoall_latency_s"])
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"link_probe's alltoall_latency_s is not a number >= 0: {value}")
    return value / max(1, world_size - 1)


def _when_and_where(path: Path, data: dict[str, Any]) -> tuple[str, str]:
    """(date, CPU) of a cluster file: its own ``machine`` record, else the entry of the
    ``manifest.json`` beside it (files written before the record), else unknown."""
    machine = data.get("machine")
    if isinstance(machine, dict):
        return str(machine.get("date") or ""), str(machine.get("cpu") or "")
    manifest = path.with_name("manifest.json")
    try:
        listing = json.loads(manifest.read_text())
        entry = listing["files"].get(path.name, {})
        machines = listing.get("machines", {})
    except (OSError, json.JSONDecodeError, KeyError, AttributeError):
        return "", ""
    return str(entry.get("date") or ""), str(machines.get(entry.get("machine"), ""))


def newest(rows: list[MeasuredRow]) -> tuple[list[MeasuredRow], list[str]]:
    """The rows of each configuration's newest measurement, and a line for each older one.

    [CHOICE] The model predicts today's code from today's codec speeds; an older row of the
    same configuration measured code that has changed since (a faster hook, another wire
    pattern), so it is listed as superseded rather than scored. Rows of one file share its date
    (a ``--mode both`` file's isolated and interleaved rows are both kept)."""
    latest: dict[tuple[str, int, str, str, int, int | None, int | None], str] = {}
    for r in rows:
        key = r.configuration
        latest[key] = max(latest.get(key, ""), r.measured_at)
    kept, superseded = [], []
    for r in rows:
        if r.measured_at == latest[r.configuration]:
            kept.append(r)
        else:
            superseded.append(
                f"{r.source}: P={r.world_size} {r.rate} {r.variant}: superseded by the "
                f"measurement of {latest[r.configuration][:16] or 'unknown date'}"
            )
    return kept, superseded


def compute_lookup(rows: list[MeasuredRow], cpu: str | None = None) -> dict[tuple[str, int], float]:
    """The mean step ms of the ``none`` rows (no communication) per (model, P); with ``cpu``,
    of the rows measured on that CPU only."""
    found: dict[tuple[str, int], list[float]] = {}
    for r in rows:
        if r.variant == "none" and (cpu is None or r.cpu == cpu):
            found.setdefault((r.model, r.world_size), []).append(r.step_ms)
    return {key: statistics.fmean(v) for key, v in found.items()}


def compute_of(
    row: MeasuredRow, computes: dict[str | None, dict[tuple[str, int], float]]
) -> float | None:
    """The compute ms behind ``row``: its own ``compute_ms``, else the ``none`` rows at its
    model and P measured on its CPU, else on any CPU (``computes``: :func:`compute_lookup` by
    CPU, and under None over every CPU). [CHOICE] Compute differs between CPUs by tens of
    percent, so a row is matched with its own machine's where one was measured."""
    if row.compute_ms is not None:
        return row.compute_ms
    key = (row.model, row.world_size)
    own = computes.get(row.cpu or None, {}).get(key)
    return own if own is not None else computes.get(None, {}).get(key)


def validate(
    rows: list[MeasuredRow],
    workloads: dict[str, Workload],
    alpha_s: float = DEFAULT_ALPHA_S,
    intra_gbit: float = 800.0,
    newest_only: bool = True,
) -> tuple[list[Checked], list[str]]:
    """Predict every row that can be (``workloads``: the measured model per model name); the
    checked rows and a line for each skipped one. ``intra_gbit``: the links inside a node of
    a row with ``ranks_per_node > 1``. ``newest_only``: score only each configuration's newest
    measurement (:func:`newest`)."""
    skipped: list[str] = []
    if newest_only:
        rows, skipped = newest(rows)
    rows = lend_probes(rows)
    computes = {cpu: compute_lookup(rows, cpu) for cpu in {None} | {r.cpu or None for r in rows}}
    checked: list[Checked] = []
    for r in rows:
        if r.variant == "none":
            continue
        where = f"{r.source}: P={r.world_size} {r.rate} {r.variant}"
        compute_ms = compute_of(r, computes)
        if r.bits_per_s is None:
            skipped.append(f"{where}: no rate limit (the veth's rate is not recorded)")
            continue
        if compute_ms is None:
            skipped.append(f"{where}: no compute time (no `none` row at this P)")
            continue
        if r.model not in workloads:
            skipped.append(f"{where}: model {r.model} not measured")
            continue
        share = min(1.0, r.cpu_count / r.world_size) if r.cpu_count else 1.0
        work = replace(
            workloads[r.model],
            compute_s=compute_ms / 1e3,
            cpu_share=share,
            overlap_codec=overlaps_codec(r),
        )
        # the row's own probed alpha where its file has one, else the one given; [CHOICE] a
        # probe whose all-to-all outran the ring (an unlimited or latency-bound link) prices
        # it at the ring's rate: the model's ring already runs at the link's
        row_alpha = alpha_s if r.probed_alpha_s is None else r.probed_alpha_s
        link = Link(
            row_alpha,
            r.bits_per_s / 1e9,
            alltoall_efficiency=min(1.0, r.alltoall_efficiency or 1.0),
        )
        try:
            intra = link if r.ranks_per_node == 1 else Link(alpha_s, intra_gbit)
            net = Network(link, intra, ring_gather_from=r.gathers)
            pred = predict(r.variant, work, r.world_size, net)
        except ValueError as err:
            skipped.append(f"{where}: {err}")
            continue
        checked.append(Checked(r, 1e3 * pred.step_s, pred.bytes_per_rank / 1e6))
    return checked, skipped


def overlaps_codec(row: MeasuredRow) -> bool:
    """Whether ``row``'s ranks could overlap their codec work with their transfers: [CHOICE]
    with two cores a rank or more (one for the codec, one for the thread moving the bytes and
    the kernel's network stack), or where the file does not say how many cores it had (the
    projection's assumption). See :class:`~gradzip_lab.bench.project_variants.Workload`."""
    if not row.cpu_count:
        return True
    return row.cpu_count / row.world_size >= 2  # every rank of a file shares its machine


def gather_form(ring_gather_from: int | None) -> str:
    """How a row's transport sent its gathers: ``a2a`` (every one an all-to-all, the default),
    ``ring`` (every one round gloo's ring) or ``ring>=B`` (slots of B bytes and more)."""
    if ring_gather_from is None:
        return "a2a"
    return "ring" if ring_gather_from == 0 else f"ring>={ring_gather_from}"


def validation_table(checked: list[Checked]) -> str:
    """Predicted against measured, a line a row (with the row's gather form and its probed
    all-to-all efficiency and alpha, ``*`` where another file's probe of the same links was
    lent, ``-`` where none was measured: the defaults were used),
    then the mean and largest |error| per P and over all."""
    width = max([len(c.row.variant) for c in checked] + [7])
    lines = [
        f"{'P':>3} {'rate':>7} {'variant':<{width}} {'gathers':>10} {'a2a eff.':>8} "
        f"{'alpha us':>8} "
        f"{'measured ms':>12} {'predicted ms':>13} {'error':>7} {'MB meas.':>9} {'MB pred.':>9}"
    ]
    for c in checked:
        mb = f"{c.row.mb_per_rank:9.3f}" if c.row.mb_per_rank is not None else f"{'-':>9}"
        eff, alpha = c.row.alltoall_efficiency, c.row.probed_alpha_s
        form = "-"
        if c.row.variant.startswith("gradzip:"):
            form = gather_form(c.row.gathers)
            if c.row.segment_from is not None:
                form += f",seg>={c.row.segment_from}"
        lent = "*" if c.row.probe_borrowed else ""
        probed = (
            f"{'-' if eff is None else f'{eff:.2f}{lent}':>8} "
            f"{'-' if alpha is None else f'{1e6 * alpha:.0f}{lent}':>8}"
        )
        lines.append(
            f"{c.row.world_size:>3} {c.row.rate:>7} {c.row.variant:<{width}} {form:>10} {probed} "
            f"{c.row.step_ms:>12.0f} {c.predicted_ms:>13.0f} {100 * c.relative_error:>+6.1f}% "
            f"{mb} {c.predicted_mb:9.3f}"
        )
    groups: dict[str, list[float]] = {"all": [abs(c.relative_error) for c in checked]}
    for c in checked:
        groups.setdefault(f"P={c.row.world_size}", []).append(abs(c.relative_error))
    for name, errors in sorted(groups.items()):
        if errors:
            lines.append(
                f"{name}: {len(errors)} rows, mean |error| {100 * statistics.fmean(errors):.1f}%, "
                f"max {100 * max(errors):.1f}%"
            )
    return "\n".join(lines)
