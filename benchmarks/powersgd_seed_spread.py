"""How much gradzip's PowerSGD loss after a few steps moves with the run seed (the first Q).

Run: ``python benchmarks/powersgd_seed_spread.py [--world-size 4] [--seeds 5] [--codec fp16]``.

The setting of ``gradzip bench cluster``'s mlp-4096 rows: the same initial weights, the same
MNIST batches per rank (its :func:`~gradzip_lab.bench.cluster_rank.batches`), SGD lr 0.03, batch 32
per rank, 2 warm-up + 5 timed steps, PowerSGD rank 1 with error feedback and ``start_step=2``
(the first two steps uncompressed, as torch's ``start_powerSGD_iter=2`` there). The ranks are
simulated in one process (:func:`~gradzip.comm.local.run_local`, through
``CompressedOptimizer``). Prints, per run seed, the ranks' mean loss at the first and the last
timed step: the spread is the noise against which one run's loss is compared with another
method's.
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F  # noqa: N812 (the conventional alias)

import gradzip
from gradzip.comm.local import run_local
from gradzip.comm.transport import Transport
from gradzip.models.paper import build_model
from gradzip.optim import CompressedOptimizer
from gradzip.schemes import PowerSGD
from gradzip.sync import GradientSync
from gradzip_lab.bench.cluster_rank import MODEL_SEED, RankConfig, batches

WARMUP, TIMED = 2, 5


def losses(
    transport: Transport, data: list[list[tuple[torch.Tensor, torch.Tensor]]], seed: int, codec: str
) -> list[float]:
    """One rank's training losses, step by step."""
    model = build_model("dryden-mlp", MODEL_SEED)
    scheme = PowerSGD(
        gradzip.create(codec), run_seed=seed, rank=1, start_step=WARMUP, error_feedback=True
    )
    sync = GradientSync(transport, scheme=scheme)
    opt = CompressedOptimizer(torch.optim.SGD(model.parameters(), lr=0.03), sync)
    out = []
    for x, y in data[transport.rank]:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        out.append(float(loss.detach()))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--codec", default="fp16")
    args = parser.parse_args()
    world = args.world_size
    data = [
        batches(
            RankConfig(rank=r, world_size=world, master_addr="", master_port=0, model="mlp-4096",
                       variants=[], steps=TIMED, warmup=WARMUP, batch=32, lr=0.03, data="mnist",
                       threads=1, timeout=1.0)
        )
        for r in range(world)
    ]  # fmt: skip
    last = []
    for seed in range(args.seeds):
        runs = run_local(world, lambda t, s=seed: losses(t, data, s, args.codec))
        first = statistics.fmean(r[WARMUP] for r in runs)
        last.append(statistics.fmean(r[-1] for r in runs))
        print(f"run seed {seed}: first timed step {first:.4f}, last {last[-1]:.4f}", flush=True)
    print(
        f"{args.codec} factors, {world} ranks: last step {min(last):.4f} to {max(last):.4f} "
        f"(mean {statistics.fmean(last):.4f}, sd {statistics.stdev(last):.4f})"
    )


if __name__ == "__main__":
    main()
