"""``gradzip train --method qesgd``: Algorithm 3 of the QESGD paper
(:mod:`gradzip.algorithms.qesgd.server`) inside the training loop of
:mod:`gradzip.experiments.trainer`, on every backend: fp32 gradients to a parameter server,
b-bit parameter offsets back.

The workers' gradients come from the trainer's per-worker pass (all P shards at once in the
simulation, one shard per process otherwise); each rank turns its shard's *mean* gradient into
the sum ``g_j`` that Algorithm 3 sends (times the shard's ``B/P`` samples). Before the first
step every rank computes its share of the full gradient at ``w_0`` over the first
``norm_samples`` training samples (default: all of them, as the paper; a smaller number is a
[CHOICE] for quick runs), and :meth:`DistributedQESGD.calibrate` turns the shares into the
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

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from gradzip.algorithms.qesgd.schedule import DeltaSchedule, check_bits, flatten, unflatten
from gradzip.algorithms.qesgd.server import DistributedQESGD
from gradzip.algorithms.qesgd.state import QesgdOutput, check_output
from gradzip.comm.pool import RankPool
from gradzip.comm.transport import Transport
from gradzip.compressors.buckets import check_bucket_size
from gradzip.errors import ConfigError
from gradzip.experiments.exchange import Exchanged
from gradzip.experiments.methods.base import RankSetup, TrainingMethod, gather_metrics
from gradzip.experiments.stopping import StopRequest
from gradzip.simulation.workers import WorkerStep

if TYPE_CHECKING:  # types only: the configuration names the methods, the trainer runs them
    from gradzip.experiments.config import TrainConfig
    from gradzip.experiments.trainer import Trainer

__all__ = ["QESGD", "QESGDOptions"]


@dataclass(frozen=True)
class QESGDOptions:
    """The options of ``--method qesgd`` (``--method-param KEY=VALUE``)."""

    bits: int = field(default=8, metadata={"help": "b, bits per coordinate of the offset codes"})
    c: float = field(
        default=1.0,
        metadata={"help": "delta_t = |grad F(w0)| / (c sqrt(t+1) 2^(b-1)); the paper tries 1-10"},
    )
    output: QesgdOutput = field(
        default="average", metadata={"help": "w_{t+1}: the epoch's iterate average or last"}
    )
    bucket_size: int = field(
        default=0, metadata={"help": "0: one delta for the whole vector (the paper)"}
    )
    norm_samples: int | None = field(
        default=None,
        metadata={"help": "training samples of the full gradient at w0 (None: all)"},
    )


def make_qesgd(
    config: TrainConfig, options: QESGDOptions, transport: Transport, w0: torch.Tensor
) -> DistributedQESGD:
    """One rank's Algorithm 3 for ``config`` (sends or receives ``w_0``)."""
    return DistributedQESGD(
        transport,
        w0,
        batch_size=config.batch_size,
        bits=options.bits,
        c=options.c,
        bucket_size=options.bucket_size,
        weight_decay=config.weight_decay,
        output=options.output,
        run_seed=config.seed,
    )


def calibration_sums(
    trainer: Trainer, options: QESGDOptions, shard: int | None
) -> tuple[torch.Tensor, int]:
    """Each worker's sum of per-sample gradients at ``w_0`` over its share of the first
    ``norm_samples`` training samples (rounded down to whole batches; chunk ``c`` of ``B``
    samples gives worker ``w`` rows ``w*B/P .. (w+1)*B/P``), as ``(workers or 1, d)`` float32,
    and the number of samples. The model's buffers (batch-norm statistics) are restored after."""
    config = trainer.config
    total, per = config.batch_size, config.batch_size // config.workers
    wanted = options.norm_samples or len(trainer.data.train_y)
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


def _rank_bits(q: DistributedQESGD, transport: Transport, step: int) -> dict[str, float | None]:
    """This rank's bits for ``step``: the codes payload (wire and paper) and what it sent and
    received (:func:`gradzip.experiments.traffic.step_traffic`)."""
    from gradzip.experiments.traffic import step_traffic

    return {
        "wire_bits": float(q.last_codes_bits),
        "paper_bits": float(q.codec.bits * q.numel),
        "entropy_bits": None,
        **step_traffic(transport.meter, step),
    }


def _method_param(check: Callable[[Any], object], value: Any) -> None:
    """Run the algorithm's own check of an option; its ``ValueError`` becomes the
    :class:`ConfigError` of ``--method-param`` (the same message, less its ``qesgd:``)."""
    try:
        check(value)
    except ValueError as err:
        raise ConfigError(f"--method-param {str(err).removeprefix('qesgd: ')}") from None


class QESGD(TrainingMethod):
    name = "qesgd"
    summary = (
        "Algorithm 3 of the QESGD paper: fp32 gradients to a parameter server, b-bit parameter "
        "offsets back (needs --optimizer sgd; no --scheme, --error-feedback or --entropy)"
    )
    options = QESGDOptions

    def validate(self, config: TrainConfig, options: Any) -> None:
        """QESGD's own options, and the compressed-gradient options it cannot take."""
        if config.optimizer != "sgd" or config.momentum != 0:
            raise ConfigError(
                "--method qesgd takes plain SGD steps on the quantized offset (spec 2.2): "
                "pass --optimizer sgd and no --momentum"
            )
        if config.error_feedback or config.scheme is not None or config.entropy:
            raise ConfigError(
                "--method qesgd has its own parameter-server exchange: leave out --scheme, "
                "--error-feedback and --entropy"
            )
        _method_param(check_bits, options.bits)
        if isinstance(options.c, bool):  # DeltaSchedule's check takes True as 1
            raise ConfigError(f"--method-param c must be a positive number, got {options.c!r}")
        _method_param(lambda c: DeltaSchedule((1.0,), c=c), options.c)
        _method_param(check_output, options.output)
        try:  # the whole vector is 0 here (check_bucket_size also takes None for it)
            if options.bucket_size is None:
                raise ValueError(options.bucket_size)
            check_bucket_size(options.bucket_size)
        except ValueError:
            raise ConfigError(
                "--method-param bucket_size must be an int >= 0 (0: the whole vector), got "
                f"{options.bucket_size!r}"
            ) from None
        samples = options.norm_samples
        if samples is not None and (
            isinstance(samples, bool) or not isinstance(samples, int) or samples < config.batch_size
        ):
            raise ConfigError(
                f"--method-param norm_samples must be an int of at least --batch-size "
                f"({config.batch_size}), got {samples!r}"
            )

    def run_label(self, config: TrainConfig) -> str:
        return f"qesgd{self.options_of(config).bits}"

    def record(self, config: TrainConfig) -> dict[str, Any]:
        return {"scheme": None}  # its own exchange, not a gradzip scheme

    def simulated(
        self, trainer: Trainer, pool: RankPool, states: list[Any] | None, stop: StopRequest
    ) -> RankSetup:
        config, options = trainer.config, self.options_of(trainer.config)
        w0 = flatten(list(trainer.model.parameters()))
        if states is None:  # a resumed rank's state replaces the calibration (done at w_0)
            sums, count = calibration_sums(trainer, options, None)
        per = config.batch_size // config.workers

        def set_up(transport: Transport) -> DistributedQESGD:
            q = make_qesgd(config, options, transport, w0)
            if states is not None:
                q.load_state_dict(states[transport.rank])
            else:
                q.calibrate(sums[transport.rank], count)
            return q

        ranks = pool.run(set_up)

        def exchange(step: int, out: WorkerStep) -> Exchanged:
            lr, end = trainer.lr(), trainer.is_epoch_end(step)

            def on_rank(transport: Transport) -> tuple[torch.Tensor, dict[str, float | None]]:
                q = ranks[transport.rank]
                u = q.step(worker_sum(out, transport.rank, per), lr, end)
                return u, _rank_bits(q, transport, step)

            results = pool.run(on_rank)
            return Exchanged(
                None,
                [r[1] for r in results],
                [float(v) for v in out.loss],
                int(out.correct.sum()),
                params=unflatten(results[0][0], list(trainer.model.parameters())),
                stop=stop.requested,
            )

        return RankSetup(exchange, lambda: [q.state_dict() for q in ranks])

    def process(
        self, trainer: Trainer, transport: Transport, state: Any | None, stop: StopRequest
    ) -> RankSetup:
        config, options = trainer.config, self.options_of(trainer.config)
        q = make_qesgd(config, options, transport, flatten(list(trainer.model.parameters())))
        if state is not None:
            q.load_state_dict(state)
        else:
            sums, count = calibration_sums(trainer, options, transport.rank)
            q.calibrate(sums[0], count)
        per = config.batch_size // config.workers

        def exchange(step: int, out: WorkerStep) -> Exchanged:
            u = q.step(worker_sum(out, 0, per), trainer.lr(), trainer.is_epoch_end(step))
            return Exchanged(
                None,
                **gather_metrics(transport, out, _rank_bits(q, transport, step), stop),
                params=unflatten(u, list(trainer.model.parameters())),
            )

        return RankSetup(exchange, q.state_dict)
