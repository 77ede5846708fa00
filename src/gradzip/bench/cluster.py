"""``gradzip bench cluster``: end-to-end DDP training steps on an emulated bandwidth-limited cluster.

For each world size ``P`` the launcher builds a cluster of its own (:mod:`.cluster_netns`: a
network namespace per rank, veth pairs through a bridge namespace, ``tc tbf`` on both ends of
every link), then for each rate sets the limit and starts ``P`` rank processes inside their
namespaces (``ip netns exec ... python -m gradzip.bench.cluster_rank``, :mod:`.cluster_rank`),
which train the model under every variant (:mod:`.cluster_variants`) with torch.distributed gloo
and DDP, the variants' steps interleaved so that the machine's load affects all alike. Rows,
table, JSON and plot: :mod:`.cluster_report`; the time to a target loss (``--target-loss``):
:mod:`.cluster_target`.

The namespaces are always deleted: in a ``finally`` (errors included), and SIGINT / SIGTERM are
turned into an exception that reaches it (the ranks, in sessions of their own, are killed
first). Namespaces left by a launcher that died are swept at start. Needs root and iproute2;
otherwise :func:`main` prints one line and returns 2.

[CHOICE] Memory: every variant holds a model copy, its gradients (DDP bucket views) and its
hook's state (error feedback, PowerSGD's memories) on every rank, about 4 model sizes; the
variants are split into chunks that fit half the available memory, and each chunk runs
interleaved (chunks one after another).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import gradzip
from gradzip.bench.cluster_launch import (
    ClusterInterruptedError,
    ClusterRunError,
    built_cluster,
    launch,
    signals_raise,
)
from gradzip.bench.cluster_netns import missing_privilege, sweep_stale
from gradzip.bench.cluster_rank import MODEL_NAMES, RankConfig
from gradzip.bench.cluster_report import fill_references, format_table, make_row, write_json
from gradzip.bench.cluster_target import Target
from gradzip.bench.cluster_variants import Variant, select
from gradzip.errors import GradzipError

MASTER_PORT = 29500
DEFAULT_LR = {"mlp-4096": 0.03, "fc-300-100": 0.2}  # the loss falls within a few steps
MODEL_NUMEL = {"mlp-4096": 36_818_954, "fc-300-100": 266_610}
VARIANT_MODEL_COPIES = 4  # see the module docstring


def check_variants(variants: list[Variant]) -> None:
    """Build each gradzip variant's scheme once here, so a bad configuration fails before any
    namespace exists (``ValueError`` naming it)."""
    from gradzip.schemes import make_variant

    for v in variants:
        if v.kind != "gradzip":
            continue
        try:
            compressor = gradzip.create(v.compressor, **v.params)
            make_variant(v.scheme, compressor, run_seed=0, error_feedback=v.error_feedback)
        except (TypeError, ValueError, GradzipError) as err:
            raise ValueError(f"variant {v.name}: {err}") from None


def available_memory() -> int:
    """MemAvailable from /proc/meminfo in bytes (8 GiB where it cannot be read)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


def chunks(names: list[str], model: str, world_size: int, memory: int) -> list[list[str]]:
    """``names`` cut into consecutive chunks whose model copies fit half of ``memory`` over
    all ``world_size`` ranks (at least one variant per chunk)."""
    per_variant = VARIANT_MODEL_COPIES * 4 * MODEL_NUMEL[model] * world_size
    size = max(1, (memory // 2) // per_variant)
    return [names[i : i + size] for i in range(0, len(names), size)]


def run(
    world_sizes: list[int],
    rates: list[str],
    model: str,
    steps: int,
    warmup: int,
    variants: list[Variant],
    timeout: float,
    data: str = "mnist",
    batch: int = 32,
    lr: float | None = None,
    threads: int | None = None,
    json_path: str | None = None,
    png_path: str | None = None,
    target: Target | None = None,
) -> list[dict[str, Any]]:
    """Build, measure and tear down per world size; print the table; write JSON and PNG (with
    a ``target``, also the time to the target loss and its curves)."""
    from gradzip.bench.cluster_report import write_png
    from gradzip.bench.cluster_target import format_targets, write_curves_png

    names = [v.name for v in variants]
    lr = DEFAULT_LR[model] if lr is None else lr
    stale = sweep_stale()
    if stale:
        print(f"removed stale namespaces of dead runs: {', '.join(stale)}")
    print(
        f"gradzip bench cluster: {model} ({MODEL_NUMEL[model]:,} parameters), batch {batch} per "
        f"rank, {data} data, SGD lr {lr}; {warmup} warm-up + {steps} timed steps per variant, "
        f"variants interleaved step by step; {os.cpu_count()} cores"
    )
    print(
        "ms/step: slowest rank per step, median over timed steps; MB/step: bytes the rank's veth "
        "sent per step (tx_bytes, TCP/IP included), mean over steps and ranks; x fp32: fp32's "
        "ms/step over the row's"
    )
    rows: list[dict[str, Any]] = []
    with signals_raise():
        for index, world in enumerate(world_sizes):
            rows.extend(_one_world(index, world, rates, model, steps, warmup, names, timeout,
                                   data, batch, lr, threads, target))  # fmt: skip
    fill_references(rows)
    print()
    for line in format_table(rows):
        print(line)
    meta = {"steps": steps, "warmup": warmup, "batch": batch, "lr": lr, "data": data,
            "cpu_count": os.cpu_count(), "interleaved": "step by step within a chunk"}  # fmt: skip
    if target is not None:
        meta["target_loss"], meta["window"] = target.loss, target.window
        for line in format_targets(rows, target.loss, target.window):
            print(line)
        if target.curves_png:
            write_curves_png(target.curves_png, rows, target.loss, target.window)
            print(f"wrote {target.curves_png}")
    if json_path:
        write_json(json_path, rows, meta)
        print(f"wrote {json_path}")
    if png_path:
        write_png(png_path, rows)
        print(f"wrote {png_path}")
    return rows


def _one_world(
    index: int,
    world: int,
    rates: list[str],
    model: str,
    steps: int,
    warmup: int,
    names: list[str],
    timeout: float,
    data: str,
    batch: int,
    lr: float,
    threads: int | None,
    target: Target | None = None,
) -> list[dict[str, Any]]:
    from gradzip.bench.cluster_target import target_figures

    rows: list[dict[str, Any]] = []
    per_rank_threads = threads or max(1, (os.cpu_count() or 1) // world)
    plan = chunks(names, model, world, available_memory())
    with built_cluster(world, run=index) as net:
        for k, rate in enumerate(rates):
            net.set_rate(rate)
            start = time.perf_counter()
            configs = [
                RankConfig(
                    rank=r, world_size=world, master_addr=net.address(0),
                    master_port=MASTER_PORT + k, model=model, variants=plan, steps=steps,
                    warmup=warmup, batch=batch, lr=lr, data=data, threads=per_rank_threads,
                    timeout=timeout,
                    target_loss=None if target is None else target.loss,
                    window=10 if target is None else target.window,
                )
                for r in range(world)
            ]  # fmt: skip
            with tempfile.TemporaryDirectory(prefix="gradzip-cluster-") as tmp:
                ranks = launch(net, configs, timeout, Path(tmp))
            block = [make_row(model, world, rate, name, ranks) for name in names]
            if target is not None:
                for row in block:
                    row.update(target_figures([r["variants"][row["variant"]] for r in ranks]))
            rows.extend(block)
            print(
                f"  P = {world}, rate {rate}: {len(names)} variants in {len(plan)} chunk(s), "
                f"{per_rank_threads} thread(s) per rank, {time.perf_counter() - start:.0f} s",
                flush=True,
            )
    return rows


def main(
    world_sizes: list[int],
    rates: list[str],
    model: str,
    steps: int,
    warmup: int,
    variant_names: list[str] | None,
    timeout: float,
    json_path: str | None,
    png_path: str | None,
    data: str = "mnist",
    threads: int | None = None,
    target: Target | None = None,
    lr: float | None = None,
) -> int:
    """The command: 2 on bad input or missing privileges, 130 on SIGINT/SIGTERM, 1 on a failed
    run, else 0 (the namespaces are gone in every case)."""
    if model not in MODEL_NAMES:
        print(
            f"gradzip bench cluster: unknown model {model!r}; choose one of "
            f"{', '.join(MODEL_NAMES)}",
            file=sys.stderr,
        )
        return 2
    try:
        variants = select(variant_names)
        check_variants(variants)
    except ValueError as err:
        print(f"gradzip bench cluster: {err}", file=sys.stderr)
        return 2
    reason = missing_privilege()
    if reason:
        print(f"gradzip bench cluster: {reason}", file=sys.stderr)
        return 2
    try:
        run(world_sizes, rates, model, steps, warmup, variants, timeout, data=data, lr=lr,
            threads=threads, json_path=json_path, png_path=png_path, target=target)  # fmt: skip
    except ClusterInterruptedError as err:
        print(f"gradzip bench cluster: {err}; namespaces removed", file=sys.stderr)
        return 130
    except (ClusterRunError, GradzipError) as err:
        print(f"gradzip bench cluster: {err}", file=sys.stderr)
        return 1
    return 0
