"""The step time of FC-300-100 (784-300-100-10, six parameter tensors) in DDP over gloo on
this machine, plain and with gradzip's hook for each exchange spec: the median of the last five
of eight forward-backward passes on rank 0 (the hook's reductions are inside ``backward``).

Run: ``python benchmarks/ddp_hook_step.py [--ranks 8] [--hidden 300] [--port 29583]
[SPEC ...]`` with specs such as ``fp32`` (plain DDP) or ``gradzip:qsgd[s=16]:allreduce``.

Without a rate limit the step is latency-bound: a scheme that pays its rounds per parameter
pays them six times here. The P processes share this machine's cores, so the figures are upper
bounds and scatter with the load.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

STEPS, WARM_UP = 8, 3


def _rank(rank: int, ranks: int, port: int, hidden: int, specs: list[str]) -> None:
    from torch.nn.parallel import DistributedDataParallel

    from gradzip.integrations.ddp import register_gradzip_hook
    from gradzip.schemes.spec import ExchangeSpec

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # P processes on the machine's cores
    dist.init_process_group("gloo", rank=rank, world_size=ranks)
    torch.manual_seed(0)
    for spec in specs:
        net = torch.nn.Sequential(
            torch.nn.Linear(784, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, 100),
            torch.nn.ReLU(),
            torch.nn.Linear(100, 10),
        )
        model = DistributedDataParallel(net)
        if spec != "fp32":
            register_gradzip_hook(model, ExchangeSpec.parse(spec).build(run_seed=0))
        x, y = torch.randn(32, 784), torch.randint(0, 10, (32,))
        times = []
        for _ in range(STEPS):
            dist.barrier()
            start = time.perf_counter()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            times.append(time.perf_counter() - start)
        if rank == 0:
            median = sorted(times[WARM_UP:])[(STEPS - WARM_UP) // 2]
            print(f"P={ranks} {spec:48s} median {median * 1e3:8.1f} ms", flush=True)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=300)
    parser.add_argument("--port", type=int, default=29583)
    parser.add_argument("specs", nargs="*", default=["fp32", "gradzip:qsgd[s=16]:allreduce"])
    args = parser.parse_args()
    mp.spawn(_rank, args=(args.ranks, args.port, args.hidden, args.specs), nprocs=args.ranks)


if __name__ == "__main__":
    main()
