"""Speed of simulating P data-parallel workers of FC-300-100 on one machine.

Run: ``.venv/bin/python benchmarks/workers_speed.py [--workers 8 64] [--batch 256] [--threads N]``.

A total batch of ``--batch`` random MNIST-shaped samples is split over P workers. Steps per
second (best of ``--repeats`` windows of about ``--seconds`` each) of:

* ``vmap grads``: every worker's gradient in one vectorized pass (:class:`WorkerGradients`);
* ``loop grads``: one ordinary forward and backward per worker, in turn;
* ``sync alone``: :meth:`RankPool.run` where every rank averages its own gradients with
  ``GradientSync`` (``ps[fp32]`` around DQSG, M = 2);
* ``full step``: the vectorized gradients, that synchronisation, and an SGD update of the
  shared model.

For reference it also times one ordinary backward over the whole batch (one worker), and the
cost per call of :meth:`RankPool.run` against :func:`run_local` for a function that does nothing.

The P per-worker gradients are P x 266,610 fresh floats per step (68 MB at P = 64). glibc's
malloc hands blocks above its mmap threshold (32 MiB at most unless set) back to the OS when
freed, so every step then pays page faults on them; ``MALLOC_MMAP_THRESHOLD_=1073741824`` in the
environment keeps them in the heap instead.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Callable

import torch
from torch.nn.functional import cross_entropy

import gradzip
from gradzip.comm.local import LocalTransport, run_local
from gradzip.comm.pool import RankPool
from gradzip.models.paper import build_model
from gradzip.schemes import make_scheme
from gradzip.simulation.workers import WorkerGradients, WorkerStep, per_worker_gradients
from gradzip.sync import GradientSync


def rate(fn: Callable[[], object], args: argparse.Namespace, scale: float = 1.0) -> float:
    """Calls per second of ``fn``: the best of ``args.repeats`` windows of about
    ``scale * args.seconds``."""
    repeats, seconds = args.repeats, scale * args.seconds
    fn()  # warm up
    start = time.perf_counter()
    fn()
    per_call = max(time.perf_counter() - start, 1e-9)
    calls = max(1, math.ceil(seconds / per_call))
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = max(best, calls / (time.perf_counter() - start))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"FC-300-100, total batch {args.batch}, torch threads {torch.get_num_threads()}")
    print(f"steps/s, best of {args.repeats} windows of ~{args.seconds} s\n")

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch, 1, 28, 28, generator=gen)
    y = torch.randint(0, 10, (args.batch,), generator=gen)

    model = build_model("fc-300-100", seed=0)
    params = list(model.parameters())

    def whole_batch() -> None:
        torch.autograd.grad(cross_entropy(model(x), y), params)

    print(f"{'one backward over the whole batch (1 worker)':48} {rate(whole_batch, args):9.1f}")

    for P in args.workers:
        if args.batch % P:
            raise SystemExit(f"--batch {args.batch} does not split over {P} workers")
        bench_workers(model, x.view(P, args.batch // P, 1, 28, 28), y.view(P, -1), args)


def bench_workers(
    model: torch.nn.Module, xs: torch.Tensor, ys: torch.Tensor, args: argparse.Namespace
) -> None:
    P = xs.shape[0]
    params = list(model.parameters())
    vectorized = WorkerGradients(model)
    optimizer = torch.optim.SGD(params, lr=0.01)

    def nothing(t: LocalTransport) -> None:
        return None

    with RankPool(P) as pool:
        syncs = [
            GradientSync(t, scheme=make_scheme("ps[fp32]", gradzip.create("dqsg", M=2)))
            for t in pool.transports
        ]
        fixed = vectorized(xs, ys)

        def sync(grads: WorkerStep) -> list[torch.Tensor]:
            means = pool.run(lambda t: syncs[t.rank].synchronize(grads.worker(t.rank)))
            assert means[0] is not None
            return means[0]

        def full_step() -> None:
            for p, g in zip(params, sync(vectorized(xs, ys)), strict=True):
                p.grad = g
            optimizer.step()

        figures = {
            "vmap grads": rate(lambda: vectorized(xs, ys), args),
            "loop grads": rate(lambda: per_worker_gradients(model, xs, ys), args),
            "sync alone (RankPool + ps[fp32] dqsg M=2)": rate(lambda: sync(fixed), args),
            "full step (vmap grads + sync + SGD)": rate(full_step, args),
        }
        for name, value in figures.items():
            print(f"P={P:<3} {name:42} {value:9.1f}")
        pool_us = 1e6 / rate(lambda: pool.run(nothing), args, 0.25)
    local_us = 1e6 / rate(lambda: run_local(P, nothing), args, 0.25)
    print(
        f"P={P:<3} per call, fn doing nothing: RankPool.run {pool_us:.0f} us, run_local {local_us:.0f} us"
    )
    print()


if __name__ == "__main__":
    main()
