"""``gradzip bench cluster``: end-to-end DDP training steps on an emulated bandwidth-limited cluster.

For each world size ``P`` the launcher builds a cluster of its own (:mod:`.cluster_netns`: a
network namespace per node of ``--ranks-per-node`` ranks (:mod:`.cluster_topology`), veth pairs
through a bridge namespace, ``tc tbf`` on both ends of every link), then for each rate sets the
limit and starts ``P`` rank processes inside their nodes' namespaces (``ip netns exec ...
python -m gradzip_lab.bench.cluster_rank``, :mod:`.cluster_rank`), which train the model
under the variants (:mod:`.cluster_variants`) with torch.distributed gloo and DDP. Which
processes run which variants (``--mode``, ``--rounds``): :mod:`.cluster_plan`; by default each
variant in rank processes of its own, one launch per variant, as a user runs it; ``--mode
interleaved`` runs them all in the same processes, their steps interleaved so that
the machine's load affects all alike. A variant's row over its launches: :mod:`.cluster_merge`;
rows, table, JSON and plot: :mod:`.cluster_report`; the ratios to the baseline, the two modes
side by side: :mod:`.cluster_compare`; the time to a target loss (``--target-loss``):
:mod:`.cluster_target`. The real workloads (``--model resnet20 | transformer-lm``,
:mod:`.cluster_workloads`) evaluate a held-out subset every ``--eval-every`` steps and report
time to a held-out target and the held-out metric after the same steps, over ``--seeds`` seeds
(:mod:`.cluster_heldout`); each seed is a run of its own (a cluster built per seed).

The namespaces are always deleted: in a ``finally`` (errors included), and SIGINT / SIGTERM are
turned into an exception that reaches it (the ranks, in sessions of their own, are killed
first). Namespaces left by a launcher that died are swept at start. Needs root and iproute2;
otherwise :func:`main` prints one line and returns 2.

[CHOICE] Memory: every variant holds a model copy, its gradients (DDP bucket views) and its
hook's state (error feedback, PowerSGD's memories) on every rank, about 4 model sizes, and every
rank process holds torch, the data set and its buffers (:data:`RANK_PROCESS_BYTES`); the
variants of an interleaved launch are split into chunks that fit half the available memory, and
each chunk runs interleaved (chunks one after another, in the same processes). The plan's
estimate is printed before the launches, and each launch's measured peak (resident memory of
all its ranks) after it. Where even one variant per rank process does not fit the available
memory, the run stops before it starts, naming both figures.

[CHOICE] Time limit: by default a launch may take :data:`TIMEOUT_PER_LAUNCH_S` x max(1, P / 4)
seconds (P ranks share the cores, so a step's compute grows with P), also each collective's.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gradzip.errors import GradzipError
from gradzip_lab.bench.cluster_compare import default_baseline, format_comparison
from gradzip_lab.bench.cluster_heldout import HeldoutTarget, format_heldout, heldout_fields
from gradzip_lab.bench.cluster_launch import (
    ClusterInterruptedError,
    ClusterRunError,
    PeakMemory,
    built_cluster,
    launch,
    signals_raise,
)
from gradzip_lab.bench.cluster_merge import launches_of, merged_row
from gradzip_lab.bench.cluster_netns import missing_privilege, sweep_stale
from gradzip_lab.bench.cluster_plan import (
    BOTH,
    INTERLEAVED,
    ISOLATED,
    Launch,
    modes_of,
    plan_launches,
)
from gradzip_lab.bench.cluster_probe import PROBE_BYTES_PER_PEER, probe_summary
from gradzip_lab.bench.cluster_rank import ALL_MODELS, RankConfig
from gradzip_lab.bench.cluster_report import (
    add_topology,
    fill_references,
    format_table,
    write_json,
)
from gradzip_lab.bench.cluster_target import Target
from gradzip_lab.bench.cluster_topology import Topology, with_ranks_per_node
from gradzip_lab.bench.cluster_variants import Variant, select
from gradzip_lab.bench.cluster_workloads import WORKLOADS

MASTER_PORT = 29500
DEFAULT_LR = {"mlp-4096": 0.03, "fc-300-100": 0.2}  # the loss falls within a few steps
DEFAULT_LR.update({name: w.lr for name, w in WORKLOADS.items()})
MODEL_NUMEL = {"mlp-4096": 36_818_954, "fc-300-100": 266_610}
MODEL_NUMEL.update({name: w.numel for name, w in WORKLOADS.items()})
VARIANT_MODEL_COPIES = 4  # see the module docstring
#: a rank process without any variant: torch, gloo, the MNIST arrays, allocator slack
#: [RECON] measured: 5.3 GiB peak for 8 ranks of fc-300-100 (a small model: the processes'
#: own), about 0.66 GiB a rank; rounded up
RANK_PROCESS_BYTES = 768 << 20
TIMEOUT_PER_LAUNCH_S = 1800.0


def launch_timeout(world_size: int, given: float | None) -> float:
    """Seconds a launch of ``world_size`` ranks may take: ``given``, or by default
    :data:`TIMEOUT_PER_LAUNCH_S` scaled by ``max(1, P / 4)`` (see the module docstring)."""
    return given if given is not None else TIMEOUT_PER_LAUNCH_S * max(1.0, world_size / 4)


def variant_bytes(model: str, world_size: int) -> int:
    """Estimated memory one variant takes over all ``world_size`` ranks."""
    return VARIANT_MODEL_COPIES * 4 * MODEL_NUMEL[model] * world_size


def check_memory(model: str, world_size: int, memory: int) -> None:
    """``ValueError`` naming both figures where ``world_size`` rank processes with one variant
    each are estimated to need more than ``memory`` bytes."""
    need = world_size * RANK_PROCESS_BYTES + variant_bytes(model, world_size)
    if need > memory:
        raise ValueError(
            f"{model} at P = {world_size}: one variant per rank process needs about "
            f"{need / 2**30:.1f} GiB, {memory / 2**30:.1f} GiB available"
        )


def check_variants(variants: list[Variant]) -> None:
    """Build each gradzip variant's scheme once here, so a bad configuration fails before any
    namespace exists (``ValueError`` naming it)."""
    for v in variants:
        if v.kind != "gradzip":
            continue
        try:
            v.spec.build(run_seed=0)
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
    all ``world_size`` ranks, less the rank processes' own (:data:`RANK_PROCESS_BYTES`; at least
    one variant per chunk)."""
    budget = memory // 2 - world_size * RANK_PROCESS_BYTES
    size = max(1, budget // variant_bytes(model, world_size))
    return [names[i : i + size] for i in range(0, len(names), size)]


def run(
    world_sizes: list[int],
    rates: list[str],
    model: str,
    steps: int,
    warmup: int,
    variants: list[Variant],
    timeout: float | None,
    data: str = "mnist",
    batch: int = 32,
    lr: float | None = None,
    threads: int | None = None,
    json_path: str | None = None,
    png_path: str | None = None,
    target: Target | None = None,
    mode: str = ISOLATED,
    rounds: int = 1,
    baseline: str | None = None,
    ranks_per_node: int = 1,
    heldout: HeldoutTarget | None = None,
    data_dir: str | None = None,
    ring_gather_from: int | None = None,
    segment_from: int | None = None,
) -> list[dict[str, Any]]:
    """Build, measure and tear down per world size (``timeout``: None scales the default with
    P, :func:`launch_timeout`); print the tables (per mode, then the ratios to ``baseline``);
    write JSON and PNG (with a ``target``, also the time to the target loss and its curves). The
    PNGs draw the isolated rows where there are any."""
    from gradzip_lab.bench.cluster_report import write_png
    from gradzip_lab.bench.cluster_target import format_targets, write_curves_png

    names = [v.name for v in variants]
    baseline = baseline or default_baseline(names)
    lr = DEFAULT_LR[model] if lr is None else lr
    stale = sweep_stale()
    if stale:
        print(f"removed stale namespaces of dead runs: {', '.join(stale)}")
    how = {
        ISOLATED: "each variant in rank processes of its own",
        INTERLEAVED: "variants interleaved step by step in the same processes",
        BOTH: "each variant in processes of its own, and all interleaved in the same processes",
    }[mode]
    print(
        f"gradzip bench cluster: {model} ({MODEL_NUMEL[model]:,} parameters), batch {batch} per "
        f"rank, {data} data, SGD lr {lr}; {warmup} warm-up + {steps} timed steps per variant, "
        f"{how}; {rounds} round(s); {ranks_per_node} rank(s) per node; {os.cpu_count()} cores"
    )
    print(
        "ms/step: slowest rank per step, median over timed steps; MB/step: bytes a node's veth "
        "sent per step (tx_bytes, TCP/IP included; a node's own ranks talk over its loopback), "
        f"mean over steps and nodes; per rank = node / {ranks_per_node}; x fp32: fp32's "
        "ms/step over the row's"
    )
    rows: list[dict[str, Any]] = []
    seeds = 1 if heldout is None else heldout.seeds
    with signals_raise():
        for seed in range(seeds):
            real = None if heldout is None else RealRun(heldout, data_dir, seed)
            for index, world in enumerate(world_sizes):
                rows.extend(_one_world(seed * len(world_sizes) + index, world, rates, model,
                                       steps, warmup, names, launch_timeout(world, timeout),
                                       data, batch, lr, threads, target, mode, rounds,
                                       ranks_per_node, real, ring_gather_from,
                                       segment_from))  # fmt: skip
    modes = modes_of(mode)
    for seed in range(seeds):  # each seed's rows are referred to its own fp32 and baseline
        fill_references([r for r in rows if r.get("seed", 0) == seed], baseline)
    for seed in range(seeds):
        if seeds > 1:
            print(f"\nseed {seed}:")
        block = [r for r in rows if r.get("seed", 0) == seed]
        _per_mode(block, modes, format_table)
        _print(format_comparison(block, baseline))
    meta = {"steps": steps, "warmup": warmup, "batch": batch, "lr": lr, "data": data,
            "cpu_count": os.cpu_count(), "mode": mode, "rounds": rounds, "baseline": baseline,
            "ranks_per_node": ranks_per_node, "ring_gather_from": ring_gather_from,
            "segment_from": segment_from,
            "interleaved": "step by step within a chunk"}  # fmt: skip
    headline = [r for r in rows if r["mode"] == (ISOLATED if ISOLATED in modes else INTERLEAVED)]
    if target is not None:
        goal = target
        meta["target_loss"], meta["window"] = goal.loss, goal.window
        _per_mode(rows, modes, lambda block: format_targets(block, goal.loss, goal.window))
        _print(format_comparison(rows, baseline, "time_to_target_s", "s to target"))
        if target.curves_png:
            write_curves_png(target.curves_png, headline, target.loss, target.window)
            print(f"wrote {target.curves_png}")
    if heldout is not None:
        held = heldout
        meta["eval_every"], meta["seeds"] = held.eval_every, held.seeds
        meta["target_accuracy_percent"], meta["target_heldout_loss"] = held.accuracy, held.loss
        _per_mode(rows, modes, lambda block: format_heldout(block, held))
        if held.curves_png:
            from gradzip_lab.bench.cluster_heldout import write_heldout_png

            write_heldout_png(held.curves_png, headline, held)
            print(f"wrote {held.curves_png}")
    if json_path:
        write_json(json_path, rows, meta)
        print(f"wrote {json_path}")
    if png_path:
        write_png(png_path, headline)
        print(f"wrote {png_path}")
    return rows


def memory_plan(plan: list[Launch], model: str, world: int, memory: int) -> list[str]:
    """One line: the most variants a launch holds per rank process and the estimated memory of
    that launch against the available memory."""
    most = max((len(chunk) for launch in plan for chunk in launch.chunks), default=0)
    need = world * RANK_PROCESS_BYTES + most * variant_bytes(model, world)
    split = [len(launch.chunks) for launch in plan if launch.mode == INTERLEAVED]
    chunked = f", interleaved in {split[0]} chunk(s)" if split else ""
    return [
        f"  P = {world}: at most {most} variant(s) per rank process{chunked}: about "
        f"{need / 2**30:.1f} GiB estimated for the {world} ranks, "
        f"{memory / 2**30:.1f} GiB available"
    ]


class RealRun:
    """A real workload's run settings for the ranks: the held-out evaluation and the seed."""

    def __init__(self, heldout: HeldoutTarget, data_dir: str | None, seed: int = 0) -> None:
        self.heldout, self.data_dir, self.seed = heldout, data_dir, seed

    def fields(self, model: str) -> dict[str, Any]:
        """The :class:`RankConfig` fields of a real workload."""
        work = WORKLOADS[model]
        return {"seed": self.seed, "data_dir": self.data_dir, "momentum": work.momentum,
                "eval_every": self.heldout.eval_every, "heldout": work.heldout}  # fmt: skip


def rank_threads_env(threads: int) -> dict[str, str]:
    """The ranks' thread budget for gradzip's numba kernels: the same ``threads`` as torch's.

    [CHOICE] numba's pool is sized once, at import, from ``NUMBA_NUM_THREADS`` (every core by
    default), and ``numba.set_num_threads`` binds only the thread that calls it, not the DDP
    hook's worker thread that runs the kernels: so the ranks get it in their environment. P
    ranks with every core each oversubscribed the machine, and a parallel region's threads then
    waited for each other a time slice at a time."""
    return {"NUMBA_NUM_THREADS": str(threads)}


def _print(lines: list[str]) -> None:
    for line in lines:
        print(line)


def _per_mode(
    rows: list[dict[str, Any]], modes: list[str], table: Callable[[list[dict[str, Any]]], list[str]]
) -> None:
    """Print ``table`` of each mode's rows (under the mode's name where there are two)."""
    for m in modes:
        print(f"\n{m}:" if len(modes) > 1 else "")
        _print(table([r for r in rows if r["mode"] == m]))


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
    mode: str = ISOLATED,
    rounds: int = 1,
    ranks_per_node: int = 1,
    real: RealRun | None = None,
    ring_gather_from: int | None = None,
    segment_from: int | None = None,
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    per_rank_threads = threads or max(1, (os.cpu_count() or 1) // world)
    env = rank_threads_env(per_rank_threads)
    memory = available_memory()
    plan = plan_launches(names, mode, rounds, lambda order: chunks(order, model, world, memory))
    _print(memory_plan(plan, model, world, memory))
    port = MASTER_PORT  # a port per launch: a finished launch's sockets cannot delay the next
    with built_cluster(world, run=index, ranks_per_node=ranks_per_node) as net:
        for rate in rates:
            net.set_rate(rate)
            start = time.perf_counter()
            done = []
            for number, planned in enumerate(plan, 1):
                configs = [
                    RankConfig(
                        rank=r, world_size=world, master_addr=net.address(0),
                        master_port=port, model=model,
                        variants=[list(chunk) for chunk in planned.chunks], steps=steps,
                        warmup=warmup, batch=batch, lr=lr, data=data, threads=per_rank_threads,
                        timeout=timeout,
                        target_loss=None if target is None else target.loss,
                        window=10 if target is None else target.window,
                        ring_gather_from=ring_gather_from,
                        segment_from=segment_from,
                        probe_bytes_per_peer=PROBE_BYTES_PER_PEER if number == 1 else 0,
                        **({} if real is None else real.fields(model)),
                    )
                    for r in range(world)
                ]  # fmt: skip
                port += 1
                peak = PeakMemory()
                with tempfile.TemporaryDirectory(prefix="gradzip-cluster-") as tmp:
                    done.append(
                        (planned, launch(net, configs, timeout, Path(tmp), env=env, memory=peak))
                    )
                what = ", ".join(planned.names) if planned.mode == ISOLATED else "all interleaved"
                print(
                    f"  P = {world}, rate {rate}: launch {number}/{len(plan)} (round "
                    f"{planned.round + 1}, {planned.mode}: {what}) done after "
                    f"{time.perf_counter() - start:.0f} s, the ranks' peak resident memory "
                    f"{peak.bytes / 2**30:.1f} GiB",
                    flush=True,
                )
            merged = [
                add_topology(
                    merged_row(model, world, rate, name, m, done, target is not None),
                    ranks_per_node,
                )
                for m in modes_of(mode)
                for name in names
            ]
            probe = done[0][1][0].get("link_probe")  # the first launch's (rank 0's copy)
            for row in merged:
                row["link_probe"] = probe
            if probe is not None:
                print(f"  P = {world}, rate {rate}: {probe_summary(probe)}", flush=True)
            if real is not None:
                for row in merged:  # the first launch's curve where there are rounds [CHOICE]
                    _, ranks = launches_of(done, row["mode"], row["variant"])[0]
                    row["seed"] = real.seed
                    row.update(heldout_fields([r["variants"][row["variant"]] for r in ranks],
                                              real.heldout))  # fmt: skip
            rows.extend(merged)
            print(
                f"  P = {world}, rate {rate}: {len(names)} variants, {len(plan)} launch(es), "
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
    timeout: float | None,
    json_path: str | None,
    png_path: str | None,
    data: str | None = None,
    threads: int | None = None,
    target: Target | None = None,
    lr: float | None = None,
    mode: str = ISOLATED,
    rounds: int = 1,
    baseline: str | None = None,
    ranks_per_node: int = 1,
    heldout: HeldoutTarget | None = None,
    data_dir: str | None = None,
    batch: int | None = None,
    ring_gather_from: int | None = None,
    segment_from: int | None = None,
) -> int:
    """The command: 2 on bad input or missing privileges, 130 on SIGINT/SIGTERM, 1 on a failed
    run, else 0 (the namespaces are gone in every case)."""
    if model not in ALL_MODELS:
        print(
            f"gradzip bench cluster: unknown model {model!r}; choose one of "
            f"{', '.join(ALL_MODELS)}",
            file=sys.stderr,
        )
        return 2
    try:
        for world in world_sizes:
            Topology(world, ranks_per_node)
            check_memory(model, world, available_memory())
        if variant_names:
            variant_names = [with_ranks_per_node(n, ranks_per_node) for n in variant_names]
        if baseline is not None:
            baseline = with_ranks_per_node(baseline, ranks_per_node)
        variants = select(variant_names)
        check_variants(variants)
        modes_of(mode)
        if rounds < 1:
            raise ValueError(f"--rounds must be >= 1, got {rounds}")
        if baseline is not None and baseline not in [v.name for v in variants]:
            raise ValueError(f"baseline {baseline} is not among the variants run")
        if model in WORKLOADS:
            heldout = heldout or HeldoutTarget()
            data = _check_real_data(model, data, data_dir)
        else:
            data = data or "mnist"
            if data not in ("mnist", "synthetic"):
                raise ValueError(f"--model {model} trains on mnist or synthetic, not {data!r}")
            if heldout is not None:
                raise ValueError(
                    f"--model {model} has no held-out evaluation (its --target-loss is the "
                    "training loss)"
                )
    except ValueError as err:
        print(f"gradzip bench cluster: {err}", file=sys.stderr)
        return 2
    reason = missing_privilege()
    if reason:
        print(f"gradzip bench cluster: {reason}", file=sys.stderr)
        return 2
    try:
        run(world_sizes, rates, model, steps, warmup, variants, timeout, data=data, lr=lr,
            threads=threads, json_path=json_path, png_path=png_path, target=target, mode=mode,
            rounds=rounds, baseline=baseline, ranks_per_node=ranks_per_node, heldout=heldout,
            data_dir=data_dir, ring_gather_from=ring_gather_from, segment_from=segment_from,
            batch=batch or (WORKLOADS[model].batch if model in WORKLOADS else 32))  # fmt: skip
    except ClusterInterruptedError as err:
        print(f"gradzip bench cluster: {err}; namespaces removed", file=sys.stderr)
        return 130
    except (ClusterRunError, GradzipError) as err:
        print(f"gradzip bench cluster: {err}", file=sys.stderr)
        return 1
    return 0


def _check_real_data(model: str, data: str | None, data_dir: str | None) -> str:
    """The data a real workload trains on (its default for None), loaded once here so that a
    missing data set fails before any namespace exists (``ValueError`` saying how to get it)."""
    from gradzip_lab.bench.cluster_workloads import check_data, heldout_shard

    data = data or WORKLOADS[model].data[0]
    check_data(model, data)
    try:
        heldout_shard(model, data, data_dir, 1, 0, 1)
    except (GradzipError, OSError) as err:
        raise ValueError(f"{model} on {data}: {err}") from None
    return data
