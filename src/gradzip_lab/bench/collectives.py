"""``gradzip bench collectives``: bytes and time per rank and step of every aggregation scheme.

For each world size ``P`` the benchmark spawns ``P`` real processes (gloo on 127.0.0.1, one
thread each) once, and every rank loops over every compatible scheme x compressor pair, then the
baselines. Per case, each rank runs one warm-up step and ``steps`` timed steps, each after a
barrier. Bytes are what the transport's meter counted during ``scheme.reduce`` (payloads plus
their 8-byte length prefixes), averaged over the timed steps; the table gives their mean and
max over ranks (a server rank differs from the workers). ms/step is, per step, the slowest
rank's time, then the median over the timed steps. The baselines (plain float32 all-reduce and
DDP's ``fp16_compress_hook``) are timed the same way, but their bytes come from the ring
all-reduce formula ``2 (P-1)/P * bytes per element * n``: they are marked "formula".
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from gradzip.comm.spawn import run_processes
from gradzip.compressors.registry import create
from gradzip.schemes import VARIANTS, SchemeSpec, scheme_accepts
from gradzip_lab.bench.collective_baselines import FP16_TIMED, FP32_TIMED
from gradzip_lab.bench.collective_ranks import NOISE, Case, rank_main
from gradzip_lab.bench.collective_report import (
    HEADER,
    SUBHEADER,
    CollectiveRow,
    format_growth,
    format_row,
    growth,
    make_row,
)

DEFAULT_COMPRESSORS = ("dqsg", "ndqsg", "qsgd", "onebit")
BIASED = frozenset({"onebit", "threshold", "adaptive", "topk"})  # run under error feedback
SCHEME_TIMED = "scheme.reduce(transport, grad, step): encode, exchange, decode and average"


def plan(
    schemes: list[str] | None = None, compressors: list[str] | None = None
) -> tuple[list[Case], list[str]]:
    """The cases to run, and a note per pair left out (incompatible or refused)."""
    cases: list[Case] = []
    skipped: list[str] = []
    for label in VARIANTS:
        spec = SchemeSpec.parse(label)
        scheme, options = spec.name, spec.kwargs()
        if schemes and label not in schemes and scheme not in schemes:
            continue
        for name in compressors or DEFAULT_COMPRESSORS:
            if not scheme_accepts(label, create(name)):
                skipped.append(f"{label} x {name} (incompatible)")
                continue
            case = Case(label, scheme, name, name in BIASED, tuple(sorted(options.items())))
            try:
                case.build()
            except (TypeError, ValueError) as err:
                skipped.append(f"{label} x {name} ({err})")
                continue
            cases.append(case)
    return cases, skipped


def measure(
    world_size: int, cases: list[Case], numel: int, steps: int, baselines: bool = True
) -> list[CollectiveRow]:
    """One spawn of ``world_size`` processes running every case (and the baselines)."""
    # safety nets against a hung rank, generous for 2 cores: one wait for a peer, the whole run
    wait = 120.0 + 2e-6 * numel * world_size
    whole = 180.0 + 1e-6 * numel * (steps + 2) * (len(cases) + 3) * world_size
    ranks = run_processes(
        world_size, rank_main, cases, numel, steps, baselines, timeout=wait, run_timeout=whole
    )
    rows = [
        make_row(
            c.label,
            c.compressor,
            [r[i] for r in ranks],
            numel,
            error_feedback=c.error_feedback,
            timed=SCHEME_TIMED,
        )
        for i, c in enumerate(cases)
    ]
    if baselines:
        n = len(cases)
        fp32, fp16 = [r[n] for r in ranks], [r[n + 1] for r in ranks]
        rows.append(make_row("allreduce_fp32", "-", fp32, numel, timed=FP32_TIMED, element_bytes=4))
        rows.append(
            make_row("ddp_fp16_hook", "fp16", fp16, numel, timed=FP16_TIMED, element_bytes=2)
        )
    return rows


def run(
    world_sizes: list[int] | None = None,
    numel: int = 1 << 20,
    steps: int = 3,
    schemes: list[str] | None = None,
    compressors: list[str] | None = None,
    baselines: bool = True,
    json_path: str | None = None,
) -> dict[str, Any]:
    """Run the benchmark, print the table and the growth with P, optionally write JSON."""
    world_sizes = world_sizes or [2, 4, 8]
    cases, skipped = plan(schemes, compressors)
    print(
        f"gradzip bench collectives: n = {numel} float32 elements, P = "
        f"{', '.join(map(str, world_sizes))} gloo processes on 127.0.0.1 (1 thread each, "
        f"{os.cpu_count()} cores), 1 warm-up + {steps} timed steps per case"
    )
    print(
        "bytes: payloads + 8-byte length prefixes counted by the transport meter, mean over "
        "timed steps, mean / max over ranks; ms/step: slowest rank per step, median over steps"
    )
    if skipped:
        print(f"not run: {'; '.join(skipped)}")
    print(HEADER)
    print(SUBHEADER, flush=True)
    rows: list[CollectiveRow] = []
    seconds: dict[int, float] = {}
    for world_size in world_sizes:
        start = time.perf_counter()
        block = measure(world_size, cases, numel, steps, baselines)
        seconds[world_size] = time.perf_counter() - start
        rows.extend(block)
        for row in block:
            print(format_row(row))
        print(f"  (P = {world_size}: spawn and all cases took {seconds[world_size]:.1f} s)")
    rising = growth(rows)
    print()
    for line in format_growth(rising):
        print(line)
    print()
    print("what ms/step times:")
    print(f"  schemes: {SCHEME_TIMED}")
    if baselines:
        print(f"  allreduce_fp32: {FP32_TIMED}")
        print(f"  ddp_fp16_hook: {FP16_TIMED}")
    for row in rows:
        if row.extra_ms:
            figures = ", ".join(f"{k} {v:.2f} ms" for k, v in row.extra_ms.items())
            print(f"  {row.scheme} P={row.world_size}, for context: {figures}")
    result: dict[str, Any] = {
        "numel": numel,
        "steps": steps,
        "warmup_steps": 1,
        "world_sizes": world_sizes,
        "threads_per_process": 1,
        "cpu_count": os.cpu_count(),
        "gradient_noise": NOISE,
        "torch": torch.__version__,
        "machine": platform.machine(),
        "skipped": skipped,
        "seconds_per_world_size": seconds,
        "rows": [asdict(r) for r in rows],
        "growth": [asdict(g) for g in rising],
    }
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2))
        print(f"wrote {json_path}")
    return result
