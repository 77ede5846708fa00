"""Where the workers of ``gradzip train`` run: simulated in this process, spawned gloo
processes, or processes started by ``torchrun``."""

from __future__ import annotations

import json
from typing import Any

from gradzip.comm.pool import RankPool
from gradzip.comm.transport import Transport
from gradzip.experiments.config import TrainConfig
from gradzip.experiments.run_output import RunWriter
from gradzip.experiments.trainer import (
    Exchange,
    Exchanged,
    Trainer,
    make_scheme,
    make_sync,
    rank_bits,
)
from gradzip.experiments.workers import WorkerStep
from gradzip.sync import GradientSync


def train(config: TrainConfig) -> dict[str, Any]:
    """Run ``config`` on its backend; the summary (on every backend, from rank 0's view)."""
    config.validate()
    if config.algorithm == "sgd":
        make_scheme(config)  # option errors here, not inside the ranks
    if config.backend == "local":
        return train_simulated(config)
    if config.backend == "gloo":
        from gradzip.comm.spawn import run_processes

        summaries = run_processes(config.workers, train_rank, config, timeout=120.0)
        return dict(summaries[0])
    from gradzip.comm.distributed import init_from_environment

    transport = init_from_environment(config.workers)
    return train_rank(transport, config)


def train_simulated(config: TrainConfig) -> dict[str, Any]:
    """P simulated ranks: one vectorized gradient pass, real synchronisation on threads."""
    if config.algorithm == "qesgd":
        return train_simulated_qesgd(config)
    trainer = Trainer(config)
    writer = RunWriter(config.resolved_out(), config.to_dict())
    syncs: list[GradientSync | None] = [None] * config.workers
    with RankPool(config.workers) as pool:

        def exchange(step: int, out: WorkerStep) -> Exchanged:
            def on_rank(transport: Transport) -> tuple[list[Any], dict[str, float | None]]:
                sync = syncs[transport.rank]
                if sync is None:
                    sync = syncs[transport.rank] = make_sync(config, transport)
                means = sync.synchronize([g[transport.rank] for g in out.grads])
                assert means is not None  # non-finite gradients raise (the default)
                return means, rank_bits(sync, step)

            results = pool.run(on_rank)
            losses = [float(v) for v in out.loss]
            return Exchanged(results[0][0], [r[1] for r in results], losses, int(out.correct.sum()))

        summary = trainer.run(exchange, writer)
    writer.finish(summary, config.to_dict())
    return summary


def train_simulated_qesgd(config: TrainConfig) -> dict[str, Any]:
    """``--algorithm qesgd`` on P simulated ranks: Algorithm 3 of the QESGD paper
    (:mod:`gradzip.algorithms.qesgd_train`), the gradients from one vectorized pass."""
    from gradzip.algorithms import qesgd_train

    trainer = Trainer(config)
    writer = RunWriter(config.resolved_out(), config.to_dict())
    w0 = qesgd_train.flatten(list(trainer.model.parameters()))
    sums, count = qesgd_train.calibration_sums(trainer, None)
    per = config.batch_size // config.workers
    with RankPool(config.workers) as pool:

        def set_up(transport: Transport) -> Any:
            q = qesgd_train.make_qesgd(config, transport, w0)
            q.calibrate(sums[transport.rank], count)
            return q

        ranks = pool.run(set_up)

        def exchange(step: int, out: WorkerStep) -> Exchanged:
            lr, end = trainer.lr(), trainer.is_epoch_end(step)

            def on_rank(transport: Transport) -> tuple[Any, dict[str, float | None]]:
                q = ranks[transport.rank]
                u = q.step(qesgd_train.worker_sum(out, transport.rank, per), lr, end)
                return u, qesgd_train.rank_bits(q, transport, step)

            results = pool.run(on_rank)
            return Exchanged(
                None,
                [r[1] for r in results],
                [float(v) for v in out.loss],
                int(out.correct.sum()),
                params=qesgd_train.unflatten_like(trainer.model, results[0][0]),
            )

        summary = trainer.run(exchange, writer)
    writer.finish(summary, config.to_dict())
    return summary


def gather_metrics(
    transport: Transport, out: WorkerStep, bits: dict[str, float | None]
) -> tuple[list[dict[str, float | None]], list[float], int]:
    """Every rank's bits and loss and the total of correct predictions, all-gathered (counted
    apart, as ``"metrics"``)."""
    mine = {"loss": float(out.loss[0]), "correct": int(out.correct[0]), "bits": bits}
    every = [
        json.loads(m) for m in transport.all_gather_bytes(json.dumps(mine).encode(), "metrics")
    ]
    return [e["bits"] for e in every], [e["loss"] for e in every], sum(e["correct"] for e in every)


def train_rank(transport: Transport, config: TrainConfig) -> dict[str, Any]:
    """One process of a process backend: its own worker's gradient, the real exchange, and
    the step's statistics gathered from every rank (counted apart, as ``"metrics"``)."""
    trainer = Trainer(config)
    writer = RunWriter(config.resolved_out(), config.to_dict()) if transport.rank == 0 else None
    if config.algorithm == "qesgd":
        exchange = qesgd_exchange(transport, trainer)
    else:
        sync = make_sync(config, transport)

        def exchange(step: int, out: WorkerStep) -> Exchanged:
            means = sync.synchronize([g[0] for g in out.grads])
            assert means is not None
            return Exchanged(means, *gather_metrics(transport, out, rank_bits(sync, step)))

    summary = trainer.run(exchange, writer, shard=transport.rank)
    summary["rank"] = transport.rank
    if writer is not None:
        writer.finish(summary, config.to_dict())
    return summary


def qesgd_exchange(transport: Transport, trainer: Trainer) -> Exchange:
    """One process's ``--algorithm qesgd`` exchange: its shard's gradient through Algorithm 3,
    the new parameters written into its own model copy."""
    from gradzip.algorithms import qesgd_train

    config = trainer.config
    q = qesgd_train.make_qesgd(
        config, transport, qesgd_train.flatten(list(trainer.model.parameters()))
    )
    sums, count = qesgd_train.calibration_sums(trainer, transport.rank)
    q.calibrate(sums[0], count)
    per = config.batch_size // config.workers

    def exchange(step: int, out: WorkerStep) -> Exchanged:
        u = q.step(qesgd_train.worker_sum(out, 0, per), trainer.lr(), trainer.is_epoch_end(step))
        bits = qesgd_train.rank_bits(q, transport, step)
        return Exchanged(
            None,
            *gather_metrics(transport, out, bits),
            params=qesgd_train.unflatten_like(trainer.model, u),
        )

    return exchange
