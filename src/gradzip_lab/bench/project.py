"""``gradzip bench project``: predicted step time of every variant from P = 2 to 1,024 ranks
and links from 1 to 400 Gbit/s, the winner at each, and the speed-up figure; with
``--validate``, the same model against measured ``gradzip bench cluster`` rows.

The model (:mod:`gradzip_lab.bench.project_variants`) adds to the measured compute time the
part of each variant's exchange the step waits for: its collectives' ``rounds x alpha + bytes /
beta`` (:mod:`gradzip_lab.bench.project_links`), bytes from real payloads of each compressor on
the model's parameter shapes, and its codec work at this machine's measured speed
(:mod:`gradzip_lab.bench.project_codecs`). [CHOICE] The codecs are timed on one thread: a rank
with a core of its own; a GPU rank's codecs are faster, and the projection says nothing of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from gradzip_lab.bench.project_codecs import compute_seconds
from gradzip_lab.bench.project_links import Link
from gradzip_lab.bench.project_models import named_model, parameter_shapes
from gradzip_lab.bench.project_report import (
    RATES_GBIT,
    WORLD_SIZES,
    speedup_figure,
    step_table,
    winner_map,
)
from gradzip_lab.bench.project_speeds import load_speeds, save_speeds
from gradzip_lab.bench.project_validate import read_rows, validate, validation_table
from gradzip_lab.bench.project_variants import (
    DEFAULT_VARIANTS,
    Network,
    Prediction,
    Workload,
    predict,
)


def measure_workload(model_name: str, compute_ms: float | None) -> Workload:
    """The model's shapes, and its forward+backward time measured here unless given."""
    model, sample = named_model(model_name)
    seconds = compute_seconds(model, sample) if compute_ms is None else compute_ms / 1e3
    return Workload(parameter_shapes(model), seconds)


def project(
    work: Workload,
    variants: Sequence[str],
    world_sizes: Sequence[int],
    rates_gbit: Sequence[float],
    alpha_s: float,
    intra_gbit: float,
    overlap: float,
    alltoall_efficiency: float = 1.0,
) -> list[Prediction]:
    """Every variant at every (rate, P) (a hierarchical one where it spans nodes)."""
    rows = []
    for rate in rates_gbit:
        inter = Link(alpha_s, rate, alltoall_efficiency=alltoall_efficiency)
        net = Network(inter, Link(alpha_s, intra_gbit), overlap)
        for p in world_sizes:
            rows += [predict(v, work, p, net) for v in variants if spans_nodes(v, p)]
    return rows


def spans_nodes(variant: str, world_size: int) -> bool:
    """Whether ``variant`` is predicted at ``world_size``: a ``hier[K]`` or
    ``hierarchical[ranks_per_node=K]`` variant only from two nodes on ([CHOICE] within one node
    every variant would run on the intra-node link, and the flat variants here assume a link a
    rank), and the latter only where K divides the world size (the scheme refuses others)."""
    if variant.startswith("hier["):
        k = variant[len("hier[") :].split("]", 1)[0]
        return k.isdigit() and world_size >= 2 * int(k)
    nodes = ranks_per_node(variant)
    return nodes is None or (world_size >= 2 * nodes and world_size % nodes == 0)


def ranks_per_node(variant: str) -> int | None:
    """K of a ``gradzip:...:hierarchical[ranks_per_node=K]`` variant; None for any other."""
    if not variant.startswith("gradzip:"):
        return None
    from gradzip.schemes.spec import ExchangeSpec

    scheme = ExchangeSpec.parse(variant).scheme
    if scheme.name != "hierarchical":
        return None
    k = dict(scheme.options).get("ranks_per_node")
    return k if isinstance(k, int) else None


def run(
    *,
    model: str,
    variants: Sequence[str] | None,
    world_sizes: Sequence[int] = WORLD_SIZES,
    rates_gbit: Sequence[float] = RATES_GBIT,
    table_world_sizes: Sequence[int] = (2, 8, 64, 1024),
    table_rates: Sequence[float] = (1, 100),
    alpha_s: float = 30e-6,
    alltoall_efficiency: float = 1.0,
    intra_gbit: float = 800.0,
    overlap: float = 0.0,
    compute_ms: float | None = None,
    png_path: str | None = None,
    validate_paths: Sequence[str] = (),
    speeds_path: str | None = None,
    save_speeds_path: str | None = None,
    newest_only: bool = True,
) -> int:
    """The command: print the projection (or the validation) and draw the figure."""
    torch.set_num_threads(1)
    names = list(variants or DEFAULT_VARIANTS)
    if validate_paths:
        measured = [r for path in validate_paths for r in read_rows(path)]
        models = sorted({r.model for r in measured})
        workloads = {m: measure_workload(m, 1.0) for m in models}  # compute from the files
        for work in workloads.values():
            if speeds_path:
                load_speeds(speeds_path, work)
        checked, skipped = validate(measured, workloads, alpha_s, intra_gbit, newest_only)
        if save_speeds_path and len(workloads) == 1:
            save_speeds(save_speeds_path, next(iter(workloads.values())))
        print(
            f"scaling model against {len(checked)} measured rows (alpha {1e6 * alpha_s:g} us and "
            "all-to-alls at the ring's rate where its links were never probed; * a probe of "
            "the same links from another file):"
        )
        print(validation_table(checked))
        for line in skipped:
            print(f"skipped: {line}")
        return 0
    work = measure_workload(model, compute_ms)
    if speeds_path:
        load_speeds(speeds_path, work)
    print(
        f"{model}: {work.numel:,} parameters in {len(work.shapes)} tensors, "
        f"{len(work.buckets)} DDP buckets; compute {1e3 * work.compute_s:.1f} ms a step "
        f"({'given' if compute_ms is not None else 'measured, 1 thread'}); alpha "
        f"{1e6 * alpha_s:g} us; all-to-all efficiency {alltoall_efficiency:g}; intra-node "
        f"{intra_gbit:g} Gbit/s; overlap {overlap:g}"
    )
    rows = project(
        work, names, world_sizes, rates_gbit, alpha_s, intra_gbit, overlap, alltoall_efficiency
    )
    shown = [r for r in rows if r.world_size in table_world_sizes and r.gbit_per_s in table_rates]
    print(step_table(shown))
    print("\nwinner at each link rate and P (speed-up over fp32):")
    print(winner_map(rows))
    for _, measure in sorted(work._codecs.items()):
        print(
            f"codec {measure.label}: encode {4e-9 / measure.encode_s_per_coord:.2f} GB/s, "
            f"decode {4e-9 / measure.decode_s_per_coord:.2f} GB/s (float32 bytes, 1 thread)"
        )
    if png_path:
        Path(png_path).parent.mkdir(parents=True, exist_ok=True)
        speedup_figure(rows, png_path, f"{model}: predicted speed-up over fp32 (alpha-beta model)")
        print(f"figure: {png_path}")
    if save_speeds_path:
        save_speeds(save_speeds_path, work)
    return 0
