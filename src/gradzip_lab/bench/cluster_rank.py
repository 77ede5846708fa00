"""One rank of ``gradzip bench cluster``: ``python -m gradzip_lab.bench.cluster_rank CONFIG OUT``.

The launcher starts it inside the rank's network namespace (``ip netns exec``); ``CONFIG`` is a
JSON file (:class:`RankConfig`), ``OUT`` the JSON file this rank writes its figures to.

What a rank does: joins the gloo group at rank 0's namespace address (``GLOO_SOCKET_IFNAME`` =
the rank's veth, so all traffic crosses the emulated links), builds every variant of its chunk
(each its own model copy from the same seed, its own process group, its own SGD optimizer),
then runs the steps interleaved: for each step, every variant in turn does one training step
(zero_grad, forward, cross-entropy, backward with the variant's communication, ``opt.step()``).
Before each variant's step all ranks meet at a barrier on the default group; the step is timed
from after the barrier to after ``opt.step()``, and the veth's ``tx_bytes`` counter
(``/sys/class/net/veth0/statistics``, the real wire: payload plus TCP/IP and Ethernet headers,
retransmissions, ACKs) is read right after the barrier and right after the step. Where the
launcher asks for it, the ranks first time the link as a ring and as an all-to-all
(:mod:`.cluster_probe`).

Data [CHOICE]: MNIST from :mod:`gradzip.data.datasets` (offline), one fixed permutation; at
step ``s`` rank ``r`` takes examples ``[(s P + r) B, (s P + r + 1) B)``; every variant sees the
same batches, so their losses are comparable. ``synthetic`` data: Gaussian inputs labelled by a
fixed random linear teacher (learnable, so the loss still falls). The real workloads
(``resnet20``, ``transformer-lm``): their data, batches and held-out subset are those of
:mod:`.cluster_workloads`, and every ``eval_every`` timed steps the ranks evaluate it together
(:mod:`.cluster_heldout`), outside the step timing.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import numba
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from gradzip_lab.bench.cluster_heldout import eval_due, evaluate, item_losses
from gradzip_lab.bench.cluster_launch import PROGRESS, join_group
from gradzip_lab.bench.cluster_netns import RANK_DEVICE
from gradzip_lab.bench.cluster_probe import probe_link
from gradzip_lab.bench.cluster_target import window_reached
from gradzip_lab.bench.cluster_variants import attach, select
from gradzip_lab.bench.cluster_workloads import WORKLOADS, heldout_shard, train_batches

#: the command-line model names and the gradzip models they are
MODEL_NAMES = {"mlp-4096": "dryden-mlp", "fc-300-100": "fc-300-100"}
#: every model ``--model`` takes: the MLPs and the real workloads (:mod:`.cluster_workloads`)
ALL_MODELS = (*MODEL_NAMES, *WORKLOADS)
MODEL_SEED = 13
DATA_SEED = 17


@dataclass
class RankConfig:
    """What the launcher tells each rank."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int
    model: str
    variants: list[list[str]]  # chunks of variant names; a chunk's variants run interleaved
    steps: int
    warmup: int
    batch: int
    lr: float
    data: str  # "mnist" or "synthetic"
    threads: int
    timeout: float
    device: str = RANK_DEVICE
    #: time to a target loss: a variant stops once the mean loss of its last ``window`` timed
    #: steps (each step's loss averaged over the ranks) is at most this; None: run every step
    target_loss: float | None = None
    window: int = 10
    #: the real workloads: the run's seed (added to the model's and the data's), the data's
    #: directory, SGD momentum, and the held-out evaluation every ``eval_every`` timed steps
    #: (0: none) of a subset of ``heldout`` items
    seed: int = 0
    data_dir: str | None = None
    momentum: float = 0.0
    eval_every: int = 0
    heldout: int = 0
    #: the gradzip variants' transport setting (``--ring-gather-from``; None: its default)
    ring_gather_from: int | None = None
    #: the gradzip variants' transport setting (``--segment-from``; None: its default)
    segment_from: int | None = None
    #: time the link as a ring and as an all-to-all first (:mod:`.cluster_probe`), this many
    #: bytes to each peer; 0: no probe
    probe_bytes_per_peer: int = 0


@dataclass
class VariantFigures:
    """One rank's figures for one variant, per timed step."""

    seconds: list[float] = field(default_factory=list)
    tx_bytes: list[int] = field(default_factory=list)
    rx_bytes: list[int] = field(default_factory=list)
    payload_bytes: list[int] | None = None  # gradzip's meter (sent), None for torch variants
    losses: list[float] = field(default_factory=list)
    #: with a target loss: each timed step's loss averaged over the ranks (the same on every
    #: rank), and the timed step at which the window's mean first reached the target
    mean_losses: list[float] = field(default_factory=list)
    reached: int | None = None
    #: the held-out evaluations (real workloads): timed steps done before each, and its figures
    eval_steps: list[int] = field(default_factory=list)
    eval_loss: list[float] = field(default_factory=list)
    eval_accuracy: list[float] = field(default_factory=list)
    #: SHA-256 of the model's parameters after the last step (their bytes in model order):
    #: equal digests, equal models, whichever processes trained them
    param_digest: str = ""
    #: the variants whose steps were interleaved with this one's in the same rank processes (its
    #: chunk, itself included; only itself in an isolated launch)
    co_resident: list[str] = field(default_factory=list)


def counter(device: str, name: str) -> int:
    """A statistics counter of ``device`` in this process's network namespace."""
    return int(Path(f"/sys/class/net/{device}/statistics/{name}").read_text())


def batches(config: RankConfig) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's batch for every step (warm-up and timed), identical for all variants."""
    total = config.warmup + config.steps
    if config.model in WORKLOADS:
        return train_batches(config.model, config.data, config.data_dir, config.seed,
                             config.rank, config.world_size, config.batch, total, DATA_SEED)  # fmt: skip
    needed = total * config.world_size * config.batch
    if config.data == "mnist":
        from gradzip.data.datasets import load_dataset

        data = load_dataset("mnist")
        x, y = data.train_x, data.train_y
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(DATA_SEED))
        order = order.repeat(needed // len(x) + 1)[:needed]
    else:
        gen = torch.Generator().manual_seed(DATA_SEED)
        x = torch.randn(needed, 1, 28, 28, generator=gen)
        teacher = torch.randn(784, 10, generator=gen)
        y = (x.flatten(1) @ teacher).argmax(1)
        order = torch.arange(needed)
    out = []
    for step in range(total):
        start = (step * config.world_size + config.rank) * config.batch
        index = order[start : start + config.batch]
        out.append((x[index], y[index]))
    return out


class Trainee:
    """One variant on this rank: its model copy, DDP wrapper, optimizer and figures."""

    def __init__(self, name: str, config: RankConfig) -> None:
        from gradzip.models.paper import build_model

        self.name = name
        self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=config.timeout))
        model: torch.nn.Module
        if config.model in WORKLOADS:
            from gradzip_lab.bench.cluster_workloads import build

            model = build(config.model, config.data, MODEL_SEED + config.seed)
        else:
            model = build_model(MODEL_NAMES[config.model], MODEL_SEED)
        # [CHOICE] gradients as views of DDP's buckets: one copy of the gradients, not two
        # (a rank holds a model per variant of its chunk)
        self.ddp = DistributedDataParallel(
            model, process_group=self.group, gradient_as_bucket_view=True
        )
        # a gradzip spec outside the table (e.g. gradzip:qsgd[s=16]+ef:allgather) is parsed
        # here as the launcher parsed it: the table alone raised KeyError for those
        self.meter = attach(
            select([name])[0],
            self.ddp,
            self.group,
            config.timeout,
            config.ring_gather_from,
            config.segment_from,
        )
        self.opt = torch.optim.SGD(self.ddp.parameters(), lr=config.lr, momentum=config.momentum)
        self.figures = VariantFigures(payload_bytes=None if self.meter is None else [])

    def step(self, x: torch.Tensor, y: torch.Tensor, device: str, timed: bool) -> None:
        payload_before = self.meter.total().sent if self.meter is not None else 0
        tx, rx = counter(device, "tx_bytes"), counter(device, "rx_bytes")
        start = time.perf_counter()
        self.opt.zero_grad(set_to_none=False)
        loss = item_losses(self.ddp(x), y)[0].mean()  # per position for a language model
        torch.autograd.backward(loss)  # typed, unlike Tensor.backward
        self.opt.step()
        elapsed = time.perf_counter() - start
        tx_after, rx_after = counter(device, "tx_bytes"), counter(device, "rx_bytes")
        if not timed:
            return
        fig = self.figures
        fig.seconds.append(elapsed)
        fig.tx_bytes.append(tx_after - tx)
        fig.rx_bytes.append(rx_after - rx)
        fig.losses.append(float(loss.detach()))
        if self.meter is not None and fig.payload_bytes is not None:
            fig.payload_bytes.append(self.meter.total().sent - payload_before)

    def check_target(self, config: RankConfig) -> None:
        """After a timed step, with a target loss: the ranks' mean of the step's loss (an
        all-gather on the default group, outside the timing: every rank gets the same list and
        so the same mean and the same verdict), and whether the window's mean reached it."""
        fig = self.figures
        if config.target_loss is None or fig.reached is not None:
            return
        mine = torch.tensor([fig.losses[-1]], dtype=torch.float64)
        every = [torch.empty_like(mine) for _ in range(config.world_size)]
        dist.all_gather(every, mine)
        fig.mean_losses.append(sum(float(t) for t in every) / config.world_size)
        if window_reached(fig.mean_losses, config.window, config.target_loss):
            fig.reached = len(fig.mean_losses) - 1

    def evaluate(self, shard: tuple[torch.Tensor, torch.Tensor], timed_steps: int) -> None:
        """The held-out figures after ``timed_steps`` (:func:`.cluster_heldout.evaluate`)."""
        loss, accuracy = evaluate(self.ddp.module, shard)
        self.figures.eval_steps.append(timed_steps)
        self.figures.eval_loss.append(loss)
        self.figures.eval_accuracy.append(accuracy)

    def digest(self) -> str:
        """SHA-256 of the parameters' bytes, in the model's order."""
        sha = hashlib.sha256()
        for param in self.ddp.module.parameters():
            sha.update(param.detach().contiguous().numpy().tobytes())
        return sha.hexdigest()


def run_rank(config: RankConfig) -> dict[str, Any]:
    """Everything one rank does (see the module docstring); its figures per variant."""
    launcher = os.getppid()  # `ip netns exec` execs this process: its parent is the launcher
    torch.set_num_threads(config.threads)
    join_group(config)
    try:
        probe = probe_link(config.probe_bytes_per_peer) if config.probe_bytes_per_peer else None
        data = batches(config)
        shard = None
        if config.eval_every:
            shard = heldout_shard(config.model, config.data, config.data_dir, config.heldout,
                                  config.rank, config.world_size)  # fmt: skip
        figures: dict[str, Any] = {}
        start = time.perf_counter()
        for number, chunk in enumerate(config.variants, 1):
            trainees = [Trainee(name, config) for name in chunk]
            for step, (x, y) in enumerate(data):
                if os.getppid() != launcher:
                    raise SystemExit("the launcher died: stopping")  # no orphan runs on
                # with a target loss, a variant that reached it trains no further
                active = [t for t in trainees if t.figures.reached is None]
                if not active:
                    break
                for trainee in active:
                    dist.barrier()
                    trainee.step(x, y, config.device, timed=step >= config.warmup)
                    if step >= config.warmup:
                        trainee.check_target(config)
                timed = step - config.warmup
                if (
                    shard is not None
                    and timed >= 0
                    and eval_due(timed, config.steps, config.eval_every)
                ):
                    for trainee in active:  # outside the step timing
                        trainee.evaluate(shard, timed + 1)
                if config.rank == 0:  # the launcher forwards these lines
                    print(
                        f"{PROGRESS}chunk {number}/{len(config.variants)}, step {step + 1}/"
                        f"{len(data)} done after {time.perf_counter() - start:.0f} s",
                        flush=True,
                    )
            for trainee in trainees:
                trainee.figures.param_digest = trainee.digest()
                trainee.figures.co_resident = list(chunk)
                figures[trainee.name] = asdict(trainee.figures)
            del trainees
        dist.barrier()
        return {
            "rank": config.rank,
            "pid": os.getpid(),  # tells the launches apart (each its own processes)
            "threads": torch.get_num_threads(),
            "numba_threads": numba.get_num_threads(),  # the launcher's NUMBA_NUM_THREADS
            "variants": figures,
            "link_probe": probe,
        }
    finally:
        dist.destroy_process_group()


def main(argv: list[str]) -> int:
    config = RankConfig(**json.loads(Path(argv[0]).read_text()))
    result = run_rank(config)
    Path(argv[1]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
