"""Where the workers of ``gradzip train`` run: simulated in this process, spawned gloo
processes, or processes started by ``torchrun``."""

from __future__ import annotations

import json
from typing import Any

from gradzip.comm.pool import RankPool
from gradzip.comm.transport import Transport
from gradzip.experiments.config import TrainConfig
from gradzip.experiments.run_output import RunWriter
from gradzip.experiments.trainer import Exchanged, Trainer, make_scheme, make_sync, rank_bits
from gradzip.experiments.workers import WorkerStep
from gradzip.sync import GradientSync


def train(config: TrainConfig) -> dict[str, Any]:
    """Run ``config`` on its backend; the summary (on every backend, from rank 0's view)."""
    config.validate()
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


def train_rank(transport: Transport, config: TrainConfig) -> dict[str, Any]:
    """One process of a process backend: its own worker's gradient, the real exchange, and
    the step's statistics gathered from every rank (counted apart, as ``"metrics"``)."""
    trainer = Trainer(config)
    writer = RunWriter(config.resolved_out(), config.to_dict()) if transport.rank == 0 else None
    sync = make_sync(config, transport)

    def exchange(step: int, out: WorkerStep) -> Exchanged:
        means = sync.synchronize([g[0] for g in out.grads])
        assert means is not None
        mine = {"loss": float(out.loss[0]), "correct": int(out.correct[0])}
        mine["bits"] = rank_bits(sync, step)  # type: ignore[assignment]
        every = [
            json.loads(m) for m in transport.all_gather_bytes(json.dumps(mine).encode(), "metrics")
        ]
        return Exchanged(
            means,
            [e["bits"] for e in every],
            [e["loss"] for e in every],
            sum(e["correct"] for e in every),
        )

    summary = trainer.run(exchange, writer, shard=transport.rank)
    summary["rank"] = transport.rank
    if writer is not None:
        writer.finish(summary, config.to_dict())
    return summary
