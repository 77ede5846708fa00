"""Where the workers of ``gradzip train`` run: simulated in this process, spawned gloo
processes, or processes started by ``torchrun``."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from gradzip.comm.pool import RankPool
from gradzip.comm.signals import Interrupted, signal_name
from gradzip.comm.transport import Transport, host_bytes
from gradzip.errors import CheckpointError
from gradzip.experiments import checkpoint
from gradzip.experiments.config import ConfigError, TrainConfig
from gradzip.experiments.resolved_config import run_record, training_method, validate
from gradzip.experiments.result import TrainResult
from gradzip.experiments.run_dir import RESULT_FILES, claim_run_dir, drop_if_empty, remove
from gradzip.experiments.run_output import RunWriter
from gradzip.experiments.stopping import StopRequest
from gradzip.experiments.trainer import Trainer


def train(config: TrainConfig, *, force: bool = False, resume: bool = False) -> TrainResult:
    """Run ``config`` on its backend; the summary (on every backend, from rank 0's view; under
    ``torchrun``, each rank's own, ``rank`` set).

    The run directory: ``config.out`` or a fresh default one (:func:`claim_run_dir`; ``force``
    replaces a run held by an explicit ``out``), or with ``resume`` the directory ``config.out``
    whose checkpoint the run continues from. A run stopped by SIGINT or SIGTERM returns the
    summary of the steps it took (``complete`` false, ``interrupted_by`` the signal), having
    written its checkpoint, summary, plots and report. The summary also names the run
    directory (``run_dir``)."""
    validate(config)
    training_method(config).preflight(config)  # option errors here, not inside the ranks
    if config.backend == "env":
        return TrainResult.from_summary(train_env(config, force, resume))
    config = prepare_resume(config) if resume else claim_run_dir(config, force)
    try:
        return TrainResult.from_summary(train_here(config, resume))
    except Exception:
        assert config.out is not None
        drop_if_empty(config.out)  # a default directory claimed for a run that never started
        raise


def train_here(config: TrainConfig, resume: bool) -> dict[str, Any]:
    """Run ``config`` (its directory settled) on the local or the gloo backend."""
    if config.backend == "local":
        try:
            return train_simulated(config, resume)
        except KeyboardInterrupt as stop:  # a second signal: stopped mid-step
            return finish_stopped(config, getattr(stop, "signum", 2))
    from gradzip.comm.spawn import run_processes

    try:
        summaries = run_processes(
            config.workers, train_rank, config, resume, timeout=config.timeout
        )
    except Interrupted as stop:
        first = stop.results[0] if stop.results else None
        if first is not None:  # rank 0 stopped cleanly and wrote the run directory
            return dict(first)
        return killed_summary(config, stop.signum)
    return dict(summaries[0])


def killed_summary(config: TrainConfig, signum: int) -> dict[str, Any]:
    """What a run whose ranks were killed (a second signal, or a signal while they were still
    starting) left, read at once from its directory: the steps in ``metrics.jsonl`` and
    whether it has a checkpoint to resume from. Nothing else is written: a second Ctrl-C
    means now, and building the model, loading the data and drawing the plots would take
    seconds (``gradzip train --resume`` writes them when the run goes on)."""
    assert config.out is not None
    rows = read_rows(Path(config.out) / "metrics.jsonl")
    return {
        "complete": False,
        "killed": True,
        "interrupted_by": signal_name(signum),
        "steps": int(rows[-1]["step"]) if rows else 0,
        "resumable": (Path(config.out) / checkpoint.CHECKPOINT).is_file(),
        "run_dir": config.out,
    }


def prepare_resume(config: TrainConfig) -> TrainConfig:
    """Check that the run in ``config.out`` can go on with ``config``, and delete its old
    summary, plots and report (they describe where it stopped, and are written anew)."""
    if config.out is None:
        raise ConfigError("resuming needs the run directory (--resume DIR)")
    checkpoint.check_resumable(config.out, checkpoint.load(config.out), config)
    remove(config.out, RESULT_FILES)
    return config


def finish_stopped(config: TrainConfig, signum: int) -> dict[str, Any]:
    """Summary, plots and report of a run stopped before it could write them (a second
    signal, or ranks that had to be killed), from the rows in its ``metrics.jsonl``."""
    assert config.out is not None
    trainer = Trainer(config)
    trainer.rows = read_rows(Path(config.out) / "metrics.jsonl")
    trainer.step = int(trainer.rows[-1]["step"]) if trainer.rows else 0
    evaluated = [r["test_acc"] for r in trainer.rows if r.get("test_acc") is not None]
    trainer.test_acc = evaluated[-1] if evaluated else None
    summary = trainer.summary(float(trainer.rows[-1]["seconds"]) if trainer.rows else 0.0)
    summary["interrupted_by"] = signal_name(signum)
    RunWriter(config.out, run_record(config), trainer.rows).finish(summary, run_record(config))
    summary["run_dir"] = config.out
    return summary


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl`` (a last line cut short by a kill is left out)."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return rows


def _finish(
    writer: RunWriter | None, summary: dict[str, Any], config: TrainConfig, stop: StopRequest
) -> dict[str, Any]:
    """Mark a run that stopped early with its signal, and write its results (rank 0)."""
    summary["interrupted_by"] = (
        None if summary["complete"] or stop.signum is None else signal_name(stop.signum)
    )
    if writer is not None:
        writer.finish(summary, run_record(config))
    summary["run_dir"] = config.out  # for the caller; not part of summary.json
    return summary


def train_simulated(config: TrainConfig, resume: bool = False) -> dict[str, Any]:
    """P simulated ranks: the workers' gradients computed here, the method's real exchange
    on threads."""
    assert config.out is not None
    with StopRequest(escalate=True, notice=config.progress) as stop:
        trainer = Trainer(config)
        states = checkpoint.restore(trainer, checkpoint.load(config.out), None) if resume else None
        with RankPool(config.workers, timeout=config.timeout) as pool:
            ranks = training_method(config).simulated(trainer, pool, states, stop)
            writer = RunWriter(config.out, run_record(config), trainer.rows)

            def save() -> None:
                assert config.out is not None
                checkpoint.save(trainer, config.out, ranks.state())

            summary = trainer.run(ranks.exchange, writer, checkpoint=save)
        return _finish(writer, summary, config, stop)


def train_env(config: TrainConfig, force: bool, resume: bool) -> dict[str, Any]:
    """``--backend env``: this process is one rank under ``torchrun``. Rank 0 claims (or
    checks, to resume) the run directory and tells the others; to resume, every rank reads
    the checkpoint, so the run directory must be on a file system they share."""
    from gradzip.comm.distributed import init_from_environment

    transport = init_from_environment(config.workers, timeout=config.timeout)
    verdict: dict[str, Any] = {}
    if transport.rank == 0:
        try:
            claimed = prepare_resume(config) if resume else claim_run_dir(config, force)
            verdict = {"out": claimed.out}
        except (ConfigError, CheckpointError) as err:  # every rank stops with rank 0's error
            verdict = {"error": str(err), "checkpoint": isinstance(err, CheckpointError)}
    shared = json.loads(host_bytes(transport.broadcast_bytes(json.dumps(verdict).encode(), root=0)))
    if "error" in shared:
        raise (CheckpointError if shared["checkpoint"] else ConfigError)(shared["error"])
    config = replace(config, out=shared["out"])
    return train_rank(transport, config, resume)


def train_rank(transport: Transport, config: TrainConfig, resume: bool = False) -> dict[str, Any]:
    """One process of a process backend: its own worker's gradient, the real exchange, and
    the step's statistics gathered from every rank (counted apart, as ``"metrics"``). Rank 0
    writes the run directory; every rank's state goes into rank 0's checkpoints."""
    assert config.out is not None
    rank = transport.rank
    with StopRequest(escalate=False, notice=rank == 0 and config.progress) as stop:
        trainer = Trainer(config)
        mine = None
        if resume:
            mine = checkpoint.restore(trainer, checkpoint.load(config.out), rank)[0]
        ranks = training_method(config).process(trainer, transport, mine, stop)
        writer = RunWriter(config.out, run_record(config), trainer.rows) if rank == 0 else None

        def save() -> None:
            checkpoint.save_rank(
                trainer, transport, config.out if rank == 0 else None, ranks.state()
            )

        summary = trainer.run(ranks.exchange, writer, shard=rank, checkpoint=save)
    summary["rank"] = rank
    return _finish(writer, summary, config, stop)
