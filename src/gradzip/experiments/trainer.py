"""``gradzip train``: synchronous data-parallel training with compressed gradients.

Every step, each of the P workers computes the gradient of its share of the total batch, the
ranks exchange compressed payloads through the configured scheme, and every rank applies the
same averaged gradient with the same optimizer, so all replicas stay bit-identical.

Backends:

* ``local`` (default): P simulated ranks in this process. The P gradients are computed here,
  each exactly as a process rank computes its own
  (:class:`~gradzip.simulation.workers.PerWorkerGradients`; ``--vectorized-gradients`` swaps in
  one ``torch.func.vmap`` pass that is faster but not bit-exact), the ranks run the real SPMD
  synchronisation code on threads (:class:`~gradzip.comm.pool.RankPool`) with real payloads and
  byte counts, and one model copy is updated (the replicas are identical by construction).
* ``gloo``: P spawned processes joined by a gloo group on this machine.
* ``env``: run under ``torchrun`` (env:// rendezvous); rank 0 writes the run directory.

In the process backends each rank computes its own shard's gradient with the same per-worker
function on the same data, so a process run reproduces the simulation bit for bit (the
gradients, hence every payload, loss and parameter), on any CPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from gradzip.data.datasets import Dataset, EpochBatches, load_dataset
from gradzip.experiments.config import TrainConfig
from gradzip.experiments.exchange import Exchange
from gradzip.experiments.inputs import InputFit
from gradzip.experiments.progress import Progress
from gradzip.experiments.run_output import RunWriter
from gradzip.experiments.traffic import combine_ranks, fp32_ring_allreduce_bits
from gradzip.models.paper import build_model, model_info
from gradzip.simulation.workers import PerWorkerGradients, WorkerGradients


def make_optimizer(config: TrainConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    params, lr, wd = model.parameters(), config.resolved_lr(), config.weight_decay
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=config.momentum, weight_decay=wd)
    if config.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=wd)
    return torch.optim.Adagrad(params, lr=lr, weight_decay=wd)


def evaluate(model: torch.nn.Module, data: Dataset, batch: int = 2000) -> float:
    """Test accuracy (fraction) of ``model`` in eval mode."""
    model.eval()
    correct = 0
    with torch.no_grad():
        for start in range(0, len(data.test_y), batch):
            logits = model(data.test_x[start : start + batch])
            correct += int((logits.argmax(dim=1) == data.test_y[start : start + batch]).sum())
    model.train()
    return correct / len(data.test_y)


class Trainer:
    """The training loop, shared by every backend: ``exchange(step, worker_step)`` turns the
    gradients computed here into the step's averaged gradients and gathered statistics."""

    def __init__(self, config: TrainConfig) -> None:
        # validated and preflighted once, by backends.train, before any rank starts
        self.config = config
        info = model_info(config.model)
        data = load_dataset(config.dataset or info.dataset, config.data_dir)
        self.inputs = InputFit(data, info.input_shape, config.model, config.seed)
        self.data = self.inputs.test_set(data, config.eval_images)
        self.model = build_model(config.model, config.seed)
        self.optimizer = make_optimizer(config, self.model)
        # the exact per-worker pass unless the not-bit-exact vectorized one is asked for
        self.gradients: PerWorkerGradients | WorkerGradients = (
            WorkerGradients(self.model)
            if config.vectorized_gradients
            else PerWorkerGradients(self.model)
        )
        self.batches = EpochBatches(
            len(self.data.train_y), config.batch_size, config.workers, config.seed
        )
        self.baseline_bits = 32 * sum(p.numel() for p in self.model.parameters())
        self.scheduler = torch.optim.lr_scheduler.ExponentialLR(self.optimizer, config.lr_decay)
        # where the run stands: a checkpoint saves these with the objects above
        # (gradzip.experiments.checkpoint), and a resumed run goes on from them
        self.step = 0
        self.rows: list[dict[str, Any]] = []
        self.test_acc: float | None = None  # the last evaluated one
        self.elapsed = 0.0  # seconds of training so far

    def is_epoch_end(self, step: int) -> bool:
        """Whether 0-based step ``step`` closes an epoch (or the run)."""
        return (step + 1) % self.batches.steps_per_epoch == 0 or step + 1 == self.total_steps()

    def lr(self) -> float:
        """The current learning rate (after the per-epoch decay)."""
        return float(self.optimizer.param_groups[0]["lr"])

    def total_steps(self) -> int:
        total = self.batches.steps_per_epoch * self.config.epochs
        return total if self.config.max_steps is None else min(total, self.config.max_steps)

    def run(
        self,
        exchange: Exchange,
        writer: RunWriter | None,
        shard: int | None = None,
        checkpoint: Callable[[], None] | None = None,
    ) -> dict[str, Any]:
        """Train from the current step; ``shard`` is this process's worker (process backends)
        or None (all workers computed here). Only a rank with a ``writer`` evaluates and
        records. ``checkpoint()`` is called after every epoch, after the last step and after a
        step whose exchange says to stop (then the run stops there). The summary."""
        config, model = self.config, self.model
        params = list(model.parameters())
        per_epoch, total = self.batches.steps_per_epoch, self.total_steps()
        progress = Progress(
            total, enabled=config.progress and writer is not None, first_step=self.step
        )
        start = time.perf_counter() - self.elapsed
        stop = False
        while self.step < total and not stop:
            step = self.step
            epoch = step // per_epoch
            index = self.batches.indices(epoch, step % per_epoch)  # (workers, B/P)
            images = self.inputs.train_batch(self.data.train_x[index], step)
            labels = self.data.train_y[index]
            if shard is not None:  # crops are drawn for all workers: same as the simulation
                images, labels = images[shard : shard + 1], labels[shard : shard + 1]
            out = self.gradients(images, labels)
            result = exchange(step, out)
            if result.params is not None:  # the method computed the parameters itself
                with torch.no_grad():
                    for p, new in zip(params, result.params, strict=True):
                        p.copy_(new.view_as(p))
            else:
                assert result.means is not None
                for p, g in zip(params, result.means, strict=True):
                    p.grad = g.view_as(p)
                self.optimizer.step()
            self.step = step = step + 1
            if step % per_epoch == 0:
                self.scheduler.step()
            row: dict[str, Any] = {
                "step": step,
                "epoch": epoch,
                "loss": sum(result.losses) / len(result.losses),
                "train_acc": result.correct / config.batch_size,
                "test_acc": None,
                "seconds": time.perf_counter() - start,
                **combine_ranks(result.bits),
            }
            if writer is not None:
                if step % config.eval_every == 0 or step == total:
                    row["test_acc"] = self.test_acc = evaluate(model, self.data)
                writer.step(row)
            self.rows.append(row)
            self.elapsed = row["seconds"]
            progress.update(step, row)
            stop = result.stop and step < total
            if checkpoint is not None and (step % per_epoch == 0 or step == total or stop):
                checkpoint()
        progress.close()
        return self.summary(time.perf_counter() - start)

    def summary(self, seconds: float) -> dict[str, Any]:
        """The run's summary from the rows so far: complete, or stopped after ``step`` of
        ``total_steps`` (``complete`` false)."""
        rows, step, total = self.rows, self.step, self.total_steps()
        summary: dict[str, Any] = {
            "dataset": self.data.name,
            "data_source": self.data.source,
            "complete": step >= total,
            "steps": step,
            "total_steps": total,
            "seconds": seconds,
            "steps_per_second": step / seconds if seconds else None,
            "loss": rows[-1]["loss"] if rows else None,
            "train_acc": rows[-1]["train_acc"] if rows else None,
            "test_acc": self.test_acc,
            "baseline_bits": self.baseline_bits,
        }
        # per step, averaged over the steps: the workers' uplink payloads, then every byte
        # each rank sent and received (mean and busiest rank), beside fp32 ring all-reduce
        for key in (
            "wire_bits",
            "paper_bits",
            "entropy_bits",
            "sent_bits",
            "sent_bits_max",
            "received_bits",
            "received_bits_max",
        ):
            values = [r[key] for r in rows if r.get(key) is not None]
            summary[key] = sum(values) / len(values) if values else None
        summary["fp32_ring_allreduce_bits"] = fp32_ring_allreduce_bits(
            self.baseline_bits // 32, self.config.workers
        )
        return summary
