"""``gradzip train --algorithm qesgd``: Algorithm 3 (:mod:`gradzip.algorithms.qesgd_server`)
inside the training loop of :mod:`gradzip.experiments.trainer`, on every backend.

The workers' gradients come from the trainer's vectorized
:class:`~gradzip.experiments.workers.WorkerGradients` (all P shards at once in the simulation,
one shard per process otherwise); each rank turns its shard's *mean* gradient into the sum
``g_j`` that Algorithm 3 sends (times the shard's ``B/P`` samples). Before the first step every
rank computes its share of the full gradient at ``w_0`` over the first
``qesgd_norm_samples`` training samples (default: all of them, as the paper; a smaller number
is a [CHOICE] for quick runs), and :meth:`DistributedQESGD.calibrate` turns the shares into the
schedule's float32 norm(s) at the server. The learning rate ``eta_t`` is the trainer's SGD rate
after its per-epoch decay, the same schedule as the SGD baseline (spec 2.3). An epoch ends
after every ``steps_per_epoch`` steps and at the run's last step (so a run cut by
``--max-steps`` ends on the average of its partial epoch).

Bits reported per step (``metrics.jsonl``): ``wire_bits`` is the codes payload the server sent
each worker (``b d`` plus its header), ``paper_bits`` ``b d``, ``sent_bits`` what the rank's
transport counted (mean over ranks: the server sends ``P - 1`` codes payloads, a worker one fp32
gradient; in the epoch's last step the server also sends ``w_{t+1}``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from gradzip.algorithms.qesgd_schedule import flatten, unflatten
from gradzip.algorithms.qesgd_server import DistributedQESGD
from gradzip.comm.transport import Transport

__all__ = [
    "calibration_sums",
    "flatten",
    "make_qesgd",
    "rank_bits",
    "unflatten_like",
    "worker_sum",
]

if TYPE_CHECKING:  # the trainer imports this module lazily; no import cycle at run time
    from gradzip.experiments.config import TrainConfig
    from gradzip.experiments.trainer import Trainer
    from gradzip.experiments.workers import WorkerStep


def make_qesgd(config: TrainConfig, transport: Transport, w0: torch.Tensor) -> DistributedQESGD:
    """One rank's Algorithm 3 for ``config`` (sends or receives ``w_0``)."""
    return DistributedQESGD(
        transport,
        w0,
        batch_size=config.batch_size,
        bits=config.qesgd_bits,
        c=config.qesgd_c,
        bucket_size=config.qesgd_bucket_size,
        weight_decay=config.weight_decay,
        output=config.qesgd_output,
        run_seed=config.seed,
    )


def calibration_sums(trainer: Trainer, shard: int | None) -> tuple[torch.Tensor, int]:
    """Each worker's sum of per-sample gradients at ``w_0`` over its share of the first
    ``qesgd_norm_samples`` training samples (rounded down to whole batches; chunk ``c`` of ``B``
    samples gives worker ``w`` rows ``w*B/P .. (w+1)*B/P``), as ``(workers or 1, d)`` float32,
    and the number of samples. The model's buffers (batch-norm statistics) are restored after."""
    config = trainer.config
    total, per = config.batch_size, config.batch_size // config.workers
    wanted = config.qesgd_norm_samples or len(trainer.data.train_y)
    n = max(total, (min(wanted, len(trainer.data.train_y)) // total) * total)
    saved = {name: b.detach().clone() for name, b in trainer.model.named_buffers()}
    sums: torch.Tensor | None = None
    for chunk, start in enumerate(range(0, n, total)):
        index = torch.arange(start, start + total).view(config.workers, per)
        # crops of CifarNet-style inputs come from their own keyed stream ("step" -1, -2, ...)
        images = trainer.inputs.train_batch(trainer.data.train_x[index], -(chunk + 1))
        labels = trainer.data.train_y[index]
        if shard is not None:
            images, labels = images[shard : shard + 1], labels[shard : shard + 1]
        out = trainer.gradients(images, labels)
        flat = torch.stack([worker_sum(out, w, per) for w in range(out.workers)]).double()
        sums = flat if sums is None else sums + flat
    with torch.no_grad():
        for name, b in trainer.model.named_buffers():
            b.copy_(saved[name])
    assert sums is not None
    return sums.to(torch.float32), n


def worker_sum(out: WorkerStep, worker: int, count: int) -> torch.Tensor:
    """Worker ``worker``'s ``g_j = count * (mean gradient over its shard)``, flat float32."""
    return flatten([g[worker] for g in out.grads]) * count


def rank_bits(q: DistributedQESGD, transport: Transport, step: int) -> dict[str, float | None]:
    """This rank's bits for ``step``: the codes payload (wire and paper) and what it sent and
    received (:func:`gradzip.experiments.traffic.step_traffic`)."""
    from gradzip.experiments.traffic import step_traffic

    return {
        "wire_bits": float(q.last_codes_bits),
        "paper_bits": float(q.codec.bits * q.numel),
        "entropy_bits": None,
        **step_traffic(transport.meter, step),
    }


def unflatten_like(model: torch.nn.Module, flat: torch.Tensor) -> list[torch.Tensor]:
    """``flat`` cut into tensors shaped like ``model.parameters()`` (the trainer steps every
    parameter, as :func:`flatten` of them lays them out)."""
    return unflatten(flat, list(model.parameters()))
