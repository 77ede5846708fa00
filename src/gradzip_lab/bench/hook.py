"""``gradzip bench hook``: DDP step time of each communication hook, one process, one device.

One rank (``torch.distributed`` with world size 1: NCCL on CUDA, gloo on the CPU, an in-memory
store, so no port is opened) trains the model of ``gradzip bench cluster`` under each variant in
turn (:mod:`gradzip_lab.bench.hook_steps`) and prints the median step time over the timed steps
and its ratio to torch's ``fp16_compress_hook`` and to torch's ``powerSGD_hook`` (rank 1). With
one rank nothing crosses a wire: what is measured is each hook's own cost on the device (the
compression, the decompression, the bookkeeping), the part that link speed does not hide.
The variants are named as in the cluster bench (:mod:`gradzip_lab.bench.cluster_variants`);
``fp32`` is DDP without a hook.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from gradzip_lab.bench.cluster import DEFAULT_LR  # the cluster bench's, per model
from gradzip_lab.bench.cluster_variants import Variant, select
from gradzip_lab.bench.devices import device_name
from gradzip_lab.bench.hook_steps import VariantTiming, synthetic_batches, time_variant

#: what the command compares by default (names of gradzip bench cluster's variants)
DEFAULT_VARIANTS = (
    "fp32",
    "fp16_hook",
    "powersgd_r1",
    "gradzip:dqsg[M=2]:allgather",
    "gradzip:qsgd:allgather",
    "gradzip:onebit+ef:allgather",
    "gradzip:topk[ratio=0.01]+ef:allgather",
    "gradzip:fp16+ef:powersgd[r1,start2]",
)
#: the references of the ratio columns
REFERENCES = ("fp16_hook", "powersgd_r1")


@contextmanager
def single_rank_group(device: torch.device, timeout: float) -> Iterator[None]:
    """A default process group of one rank for ``device`` (NCCL on CUDA, else gloo), over an
    in-memory store; destroyed when the block ends. Refuses to replace an existing group."""
    if dist.is_initialized():
        raise RuntimeError("a torch.distributed process group exists already in this process")
    cuda = device.type == "cuda"
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        store=dist.HashStore(),  # type: ignore[attr-defined]  # re-exported by torch
        rank=0,
        world_size=1,
        timeout=timedelta(seconds=timeout),
        device_id=device if cuda else None,
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def format_table(timings: Sequence[VariantTiming]) -> list[str]:
    """The printed table: variant, median and fastest ms/step, the ratios to the references
    (``-`` where a reference was not run), the loss over the timed steps."""
    medians = {t.name: t.median_ms for t in timings}
    width = max(len("variant"), *(len(t.name) for t in timings))
    lines = [
        f"{'variant':<{width}} {'ms/step':>9} {'fastest':>9} "
        + " ".join(f"{'/ ' + r:>13}" for r in REFERENCES)
        + f"  {'loss first -> last':>20}"
    ]
    for t in timings:
        ratios = [
            f"{t.median_ms / medians[r]:>13.3f}" if r in medians else f"{'-':>13}"
            for r in REFERENCES
        ]
        lines.append(
            f"{t.name:<{width}} {t.median_ms:>9.2f} {1000 * min(t.seconds):>9.2f} "
            + " ".join(ratios)
            + f"  {t.first_loss:>9.4f} -> {t.last_loss:.4f}"
        )
    return lines


def run(
    device: torch.device,
    model: str = "mlp-4096",
    steps: int = 20,
    warmup: int = 3,
    batch: int = 32,
    variants: Sequence[str] | None = None,
    json_path: str | None = None,
    timeout: float = 600.0,
    threads: int | None = None,
) -> list[VariantTiming]:
    """Time every variant (``variants``, else :data:`DEFAULT_VARIANTS`) on ``device``; print
    the table; optionally write JSON. ``ValueError`` for an unknown variant name.

    ``threads``: torch's intra-op thread count meanwhile (None: as it is). [CHOICE] On a CPU
    with few cores, torch's thread pool spinning beside gloo's worker thread made DDP's own
    all-reduce steps (``fp32``) 75 ms instead of 1.6 ms on 2 cores; one thread avoids that."""
    chosen = select(list(variants or DEFAULT_VARIANTS))
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _run(device, model, steps, warmup, batch, chosen, json_path, timeout)
    finally:
        torch.set_num_threads(before)


def _run(
    device: torch.device,
    model: str,
    steps: int,
    warmup: int,
    batch: int,
    chosen: Sequence[Variant],
    json_path: str | None,
    timeout: float,
) -> list[VariantTiming]:
    lr = DEFAULT_LR[model]
    data = synthetic_batches(warmup + steps, batch, device)
    print(
        f"gradzip bench hook on {device_name(device)}: {model}, batch {batch}, synthetic data, "
        f"SGD lr {lr}; one rank, {torch.get_num_threads()} torch thread(s); {warmup} warm-up + {steps} timed steps per variant "
        "(forward, backward with the hook, optimizer step), the device synchronized around each",
        flush=True,
    )
    timings = []
    with single_rank_group(device, timeout):
        for variant in chosen:
            timings.append(time_variant(variant, model, device, data, warmup, lr, timeout))
            print(f"  {variant.name}: {timings[-1].median_ms:.2f} ms/step", flush=True)
    for line in format_table(timings):
        print(line)
    if json_path:
        meta: dict[str, Any] = {
            "device": device_name(device), "model": model, "steps": steps, "warmup": warmup,
            "batch": batch, "lr": lr, "threads": torch.get_num_threads(), "torch": torch.__version__, "cuda": torch.version.cuda,
        }  # fmt: skip
        rows = [{**asdict(t), "median_ms": t.median_ms} for t in timings]
        Path(json_path).write_text(json.dumps({**meta, "variants": rows}, indent=2))
        print(f"wrote {json_path}")
    return timings
