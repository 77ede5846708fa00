"""The step time of ResNet-20 (Fashion-MNIST shapes, random batches of 32) in DDP over gloo as a
user launches it: ``torchrun --standalone --nproc_per_node 4 benchmarks/torchrun_step.py
[SPEC ...]``, nothing else set. torchrun gives each rank one torch thread when it starts
several on a machine (``OMP_NUM_THREADS=1``); the figure shows what the gradzip hook's kernels
do with that (their numba thread count on the hook's stage threads is printed too).

Specs: ``fp32`` (plain DDP), ``fp16`` (``fp16_compress_hook``) or a gradzip spec such as
``'gradzip:qsgd[s=16]+ef:allreduce'`` (the default). Prints rank 0's median step (forward,
backward with the hook's exchange, optimizer step) over ``--steps`` after three warm-up steps,
the slowest rank's time per step. The ranks share the machine's cores: compare specs and
versions on the same machine, in the same minutes.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

WARM_UP = 3


def _model(spec: str) -> tuple[DistributedDataParallel, list[int]]:
    """The wrapped model and, for a gradzip spec, a list the stage threads' numba counts land in."""
    from gradzip.models.resnet import CifarResNet

    torch.manual_seed(0)
    model = DistributedDataParallel(CifarResNet(20, in_channels=1))
    seen: list[int] = []
    if spec == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif spec != "fp32":
        import numba

        from gradzip.integrations.ddp import register_gradzip_hook
        from gradzip.schemes.spec import ExchangeSpec

        state = register_gradzip_hook(model, ExchangeSpec.parse(spec).build(run_seed=0))
        reduce = state.scheme.reduce_many_if_all_finite

        def noted(*args, **kwargs):  # type: ignore[no-untyped-def]
            seen.append(numba.get_num_threads())  # on the stage thread that runs the kernels
            return reduce(*args, **kwargs)

        state.scheme.reduce_many_if_all_finite = noted  # type: ignore[method-assign]
    return model, seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="*", default=["gradzip:qsgd[s=16]+ef:allreduce"])
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    data = torch.Generator().manual_seed(1 + rank)
    x = torch.randn(32, 1, 28, 28, generator=data)
    y = torch.randint(0, 10, (32,), generator=data)
    for spec in args.specs:
        model, seen = _model(spec)
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
                f"P={dist.get_world_size()} {spec:36s} median {statistics.median(times) * 1e3:7.1f}"
                f" ms a step (torch threads {torch.get_num_threads()}{threads})",
                flush=True,
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
