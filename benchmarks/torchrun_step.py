"""The step time of ResNet-20 (Fashion-MNIST shapes, random batches of 32) in DDP over gloo as a
user launches it: ``torchrun --standalone --nproc_per_node 4 benchmarks/torchrun_step.py
[SPEC ...]``, nothing else set. torchrun gives each rank one torch thread when it starts
several on a machine (``OMP_NUM_THREADS=1``); the figure shows what the gradzip hook's kernels
do with that (their numba thread count on the hook's stage threads is printed too).

Variants are ``gradzip bench cluster``'s names: ``fp32`` (plain DDP), ``fp16_hook``,
``powersgd_r1`` or a gradzip spec such as ``'gradzip:qsgd[s=16]+ef:allreduce'`` (the default),
each hooked as the bench hooks it. Prints rank 0's median step (forward, backward with the
hook's exchange, optimizer step) over ``--steps`` after three warm-up steps, the slowest
rank's time per step, and for a gradzip variant the numba thread counts its stage threads ran
at. The ranks share the machine's cores: compare variants and versions on the same machine,
in the same minutes.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from gradzip_lab.bench.cluster_variants import Variant, attach, select

WARM_UP = 3


def _stage_thread_counts() -> list[int]:
    """The numba thread count of every hook stage call from now on: recorded where the stage
    has just set its thread counts (``_match_threads``, looked up at each call)."""
    import numba

    from gradzip.integrations import ddp

    seen: list[int] = []
    match = ddp._match_threads

    def noted(job: object) -> None:
        match(job)  # type: ignore[arg-type]
        seen.append(numba.get_num_threads())

    ddp._match_threads = noted  # type: ignore[assignment]
    return seen


def _model(variant: Variant) -> DistributedDataParallel:
    """ResNet-20 wrapped in DDP with ``variant``'s hook (the bench's :func:`attach`)."""
    from gradzip.models.resnet import CifarResNet

    torch.manual_seed(0)
    model = DistributedDataParallel(CifarResNet(20, in_channels=1))
    attach(variant, model, dist.group.WORLD, timeout=600.0)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="*", default=["gradzip:qsgd[s=16]+ef:allreduce"])
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    data = torch.Generator().manual_seed(1 + rank)
    x = torch.randn(32, 1, 28, 28, generator=data)
    y = torch.randint(0, 10, (32,), generator=data)
    seen = _stage_thread_counts()
    for variant in select(args.variants):
        seen.clear()
        model = _model(variant)
        opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
        times = []
        for step in range(WARM_UP + args.steps):
            dist.barrier()
            start = time.perf_counter()
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            took = torch.tensor([time.perf_counter() - start])
            dist.all_reduce(took, op=dist.ReduceOp.MAX)
            if step >= WARM_UP:
                times.append(float(took))
        if rank == 0:
            threads = f", numba threads on the hook's stage {sorted(set(seen))}" if seen else ""
            print(
                f"P={dist.get_world_size()} {variant.name:36s} median {statistics.median(times) * 1e3:7.1f}"
                f" ms a step (torch threads {torch.get_num_threads()}{threads})",
                flush=True,
            )
        del model, opt  # DDP released before the group (see examples/ddp_hook.py)
        gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
