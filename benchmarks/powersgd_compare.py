"""gradzip's PowerSGD (through CompressedOptimizer) against PyTorch's ``powerSGD_hook`` on DDP:
step time, bytes per rank and step, and the loss trajectory, two gloo ranks on loopback.

Run: ``python benchmarks/powersgd_compare.py [--steps 30] [--rank 1] [--model dryden-mlp]``.

Every variant trains its own copy of the model from the same initial weights on the same MNIST
batches (batch 32 per rank, SGD lr 0.03), one variant after the other in the same two
processes. Variants: torch's hook (waited for per bucket, as ``gradzip bench cluster`` runs it: the
stock hook's collectives from future callbacks deadlocked gloo; error feedback and warm start on; ``start_powerSGD_iter=2``, the
earliest it accepts, so its first two steps are plain all-reduces, left out of the timing), and gradzip's ``powersgd`` scheme with float32 (``identity``),
``fp16``, ``bf16`` and ``qsgd`` (s = 127, 8 bits a value plus a scale per 512) factors, all
all-gathered, and the ``qsgd`` factors again as integer codes summed by a ring
(``factor_scheme="allreduce"``). Bytes:
gradzip's are its transport's meter (payloads and 8-byte length prefixes a rank sends); torch's
are what its all-reduces carry, ``4 r (n + m)`` per compressed matrix plus ``4 numel`` per
uncompressed tensor (a two-rank ring sends that much per rank), from the third step on. Step time: the median over the
steps after the first two, slowest rank. With no bandwidth limit this measures the compute each
method adds; the loss columns say whether the quantized factors change the trajectory.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

#: gradzip's variants: (label, factor codec, its parameters, factor scheme)
VARIANTS: list[tuple[str, str, dict[str, Any], str]] = [
    ("identity factors", "identity", {}, "allgather"),
    ("fp16 factors", "fp16", {}, "allgather"),
    ("bf16 factors", "bf16", {}, "allgather"),
    ("qsgd factors", "qsgd", {"s": 127}, "allgather"),
    ("qsgd factors, integer sums", "qsgd", {"s": 127}, "allreduce"),
]


def rank_main(transport: Any, steps: int, rank: int, model_name: str) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F  # noqa: N812
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState
    from torch.nn.parallel import DistributedDataParallel

    import gradzip
    from gradzip.data.datasets import load_dataset
    from gradzip.models.paper import build_model
    from gradzip.optim import CompressedOptimizer
    from gradzip.schemes import PowerSGD
    from gradzip.sync import GradientSync
    from gradzip_lab.bench.cluster_variants import waited_powersgd_hook

    torch.set_num_threads(1)
    data = load_dataset("mnist")
    order = torch.randperm(len(data.train_x), generator=torch.Generator().manual_seed(5))
    batches = []
    for step in range(steps):
        index = order[(2 * step + transport.rank) * 32 : (2 * step + transport.rank + 1) * 32]
        batches.append((data.train_x[index], data.train_y[index]))
    results: dict[str, Any] = {}

    def run(name: str, model: Any, step_fn: Any, sent: Any) -> None:
        times, losses = [], []
        for x, y in batches:
            dist.barrier()
            start = time.perf_counter()
            loss = step_fn(x, y)
            times.append(time.perf_counter() - start)
            losses.append(float(loss))
        results[name] = {"times": times, "losses": losses, "sent": sent()}

    # torch's hook
    model = build_model(model_name, 13)
    ddp = DistributedDataParallel(model)
    state = PowerSGDState(process_group=None, matrix_approximation_rank=rank, start_powerSGD_iter=2)
    # waited per bucket: the stock hook's collectives from future callbacks deadlocked gloo
    # against the barriers between steps (as in gradzip bench cluster)
    ddp.register_comm_hook(state, waited_powersgd_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.03)

    def torch_step(x: Any, y: Any) -> Any:
        opt.zero_grad()
        loss = F.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    def torch_bytes() -> float:
        total = 0
        for p in model.parameters():
            if p.dim() < 2:
                total += 4 * p.numel()
                continue
            n, m = p.shape[0], p.numel() // p.shape[0]
            r = min(rank, n, m)
            compressed = (n + m) * r
            total += 4 * (compressed if compressed * 2 < n * m else n * m)
        return float(total)

    run("torch powerSGD_hook", model, torch_step, torch_bytes)

    for label, codec, params, factor_scheme in VARIANTS:
        model = build_model(model_name, 13)
        compressor = gradzip.create(codec, **params)
        scheme = PowerSGD(
            compressor,
            run_seed=1,
            rank=rank,
            factor_scheme=factor_scheme,
            error_feedback=True,
        )
        sync = GradientSync(transport, scheme=scheme)
        copt = CompressedOptimizer(torch.optim.SGD(model.parameters(), lr=0.03), sync)
        before = transport.meter.total().sent

        def gz_step(x: Any, y: Any, model: Any = model, copt: Any = copt) -> Any:
            copt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            copt.step()
            return loss.detach()

        def gz_bytes(before: int = before) -> float:
            return float((transport.meter.total().sent - before) / steps)

        run(f"gradzip powersgd, {label}", model, gz_step, gz_bytes)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rank", type=int, default=1)
    parser.add_argument("--model", default="dryden-mlp")
    args = parser.parse_args()
    from gradzip.comm.spawn import run_processes

    ranks = run_processes(2, rank_main, args.steps, args.rank, args.model, timeout=600)
    print(
        f"2 gloo ranks on loopback, {args.model}, rank {args.rank}, {args.steps} steps, batch 32 "
        "per rank; ms/step: median after 2 steps, slowest rank"
    )
    print(f"{'variant':<48} {'ms/step':>8} {'MB/step':>9} {'loss 1st':>9} {'mean last 5':>12}")
    for name in ranks[0]:
        times = [max(r[name]["times"][i] for r in ranks) for i in range(args.steps)]
        losses = [statistics.fmean(r[name]["losses"][i] for r in ranks) for i in range(args.steps)]
        print(
            f"{name:<48} {1e3 * statistics.median(times[2:]):>8.0f} "
            f"{ranks[0][name]['sent'] / 1e6:>9.3f} {losses[0]:>9.4f} "
            f"{statistics.fmean(losses[-5:]):>12.4f}"
        )


if __name__ == "__main__":
    main()
