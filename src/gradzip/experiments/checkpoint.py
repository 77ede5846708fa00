"""Checkpoints of ``gradzip train`` and resuming from them, bit for bit.

``<run>/checkpoint.pt`` is written after every epoch, after the last step, and when a signal
stops the run. It is a :mod:`gradzip.state_file`: a header with the SHA-256 digest of the
payload (one ``torch.save``), written to a temporary name and renamed over the old one, so a
crash never leaves half a checkpoint. :func:`load` checks the digest before unpickling
anything and refuses (:class:`~gradzip.errors.CheckpointError`) a file that is corrupted,
truncated or has no digest, so ``--resume`` stops before it changes a file of the run. It
holds:

* the options the run was started with (``config``: the :class:`TrainConfig` fields);
* where the run stands: ``step``, the ``rows`` of ``metrics.jsonl`` so far (so the final
  summary and plots cover the whole run), the training seconds so far, the last test accuracy;
* the state shared by every replica: model (parameters and buffers), optimizer, learning-rate
  schedule;
* ``ranks``: one entry per worker rank, since ranks differ: its training method's state
  (:meth:`GradientSync.state_dict <gradzip.sync.GradientSync.state_dict>` with its
  error-feedback residuals, or the QESGD rank's state), its torch RNG state (dropout) and its
  model buffers (a rank's batch-norm statistics come from its own shard). Process ranks send
  theirs to rank 0, which writes the file.

The data order and the input crops are functions of ``(seed, epoch, step)``, so they need no
state. ``gradzip train --resume DIR`` rebuilds everything from the options in the checkpoint and
goes on from its step; the resumed run's rows and parameters equal those of a run that was
never stopped. Only options that do not change the computation may differ on resume
(:data:`RESUMABLE_CHANGES`: the length of the run, ``--timeout``, ``--no-progress``).

One exception, for ``--method qesgd``: the last step of a run closes its epoch (the anchor
becomes the epoch's average), so continuing a *finished* qesgd run with more steps continues
from that closed epoch, not as the longer run would have. A run stopped by a signal resumes
exactly.
"""

from __future__ import annotations

import io
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from gradzip import state_file
from gradzip.comm.transport import Transport, host_bytes
from gradzip.errors import CheckpointError
from gradzip.experiments.config import RUN_NEUTRAL, ConfigError, TrainConfig
from gradzip.experiments.resolved_config import run_record, validate

if TYPE_CHECKING:  # the trainer imports torch-heavy modules; only its type is needed here
    from gradzip.experiments.trainer import Trainer

CHECKPOINT = "checkpoint.pt"
_FORMAT = "gradzip-train-checkpoint"
_VERSION = 1

#: options a resumed run may change: how long it runs, and nothing that changes a step
RESUMABLE_CHANGES = ("epochs", "max_steps", *RUN_NEUTRAL)

# the command-line option of each TrainConfig field whose name differs from the field's
_OPTION = {
    "compressor_params": "--param",
    "scheme_params": "--scheme-param",
    "progress": "--no-progress",
    "method_options": "--method-param",
}


def option(field: str) -> str:
    """The ``gradzip train`` option that sets the :class:`TrainConfig` field ``field``."""
    return _OPTION.get(field, "--" + field.replace("_", "-"))


def rank_state(trainer: Trainer, algorithm: Any) -> dict[str, Any]:
    """One rank's part of a checkpoint: its algorithm state, RNG state and model buffers."""
    return {
        "algorithm": algorithm,
        "rng": torch.get_rng_state(),
        "buffers": {name: b.detach().clone() for name, b in trainer.model.named_buffers()},
    }


def _run_state(trainer: Trainer, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "format": _FORMAT,
        "version": _VERSION,
        "config": asdict(trainer.config),
        "step": trainer.step,
        "elapsed": trainer.elapsed,
        "test_acc": trainer.test_acc,
        "rows": list(trainer.rows),
        "model": trainer.model.state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
        "scheduler": trainer.scheduler.state_dict(),
        "ranks": ranks,
    }


def _write(directory: str | Path, state: dict[str, Any]) -> None:
    """``state`` as ``directory/checkpoint.pt`` with its digest, atomically (temporary file,
    then rename: :func:`gradzip.state_file.write`)."""
    state_file.write(Path(directory) / CHECKPOINT, state)


def save(trainer: Trainer, directory: str | Path, algorithm_states: list[Any]) -> None:
    """Checkpoint a run whose P ranks all live in this process (one algorithm state each)."""
    _write(directory, _run_state(trainer, [rank_state(trainer, s) for s in algorithm_states]))


def save_rank(
    trainer: Trainer, transport: Transport, directory: str | Path | None, algorithm: Any
) -> None:
    """Checkpoint a run of process ranks: every rank calls this at the same step with its own
    algorithm state; rank 0 gathers them and writes the file into ``directory``. The gather is
    counted by the transport outside any step (it is not a training step's traffic)."""
    buffer = io.BytesIO()
    torch.save(rank_state(trainer, algorithm), buffer)
    with transport.step_scope(None):
        blobs = transport.gather_bytes(buffer.getvalue(), root=0)
    if blobs is not None:
        assert directory is not None, "rank 0 writes the checkpoint"
        ranks = [torch.load(io.BytesIO(host_bytes(blob)), weights_only=True) for blob in blobs]
        _write(directory, _run_state(trainer, ranks))


def load(directory: str | Path) -> dict[str, Any]:
    """The checkpoint in ``directory``, verified against its digest and checked to be a train
    checkpoint of this version: :class:`CheckpointError` (naming the file) if it is corrupted,
    truncated, has no digest or is another kind of file; :class:`ConfigError` if there is
    none. Reads only: nothing in ``directory`` changes."""
    path = Path(directory) / CHECKPOINT
    if not path.is_file():
        raise ConfigError(
            f"{directory} has no {CHECKPOINT} to resume from (not a run directory, or the run "
            "stopped before its first checkpoint)"
        )
    try:
        state = state_file.read(path)
    except OSError as err:  # unreadable (permissions, I/O): say which file, not errno alone
        raise CheckpointError(f"{path} cannot be read: {err}") from err
    if not isinstance(state, dict) or state.get("format") != _FORMAT:
        raise CheckpointError(f"{path} is not a gradzip train checkpoint")
    if state.get("version") != _VERSION:
        raise CheckpointError(
            f"{path} has checkpoint version {state.get('version')!r}, not {_VERSION}"
        )
    return state


def differences(saved: TrainConfig, config: TrainConfig) -> list[str]:
    """The options in which ``config`` differs from ``saved`` and that a resumed run may not
    change, each as ``--option (checkpoint: A, now: B)``."""
    before, after = run_record(saved), run_record(config)
    return [
        f"{option(key)} (checkpoint: {before.get(key)!r}, now: {after.get(key)!r})"
        for key in sorted(set(before) | set(after))
        if key not in RESUMABLE_CHANGES and before.get(key) != after.get(key)
    ]


def check_resumable(directory: str | Path, state: dict[str, Any], config: TrainConfig) -> None:
    """Refuse (:class:`ConfigError`, listing every difference) to resume ``state`` with
    ``config`` unless they differ only in :data:`RESUMABLE_CHANGES`."""
    changed = differences(TrainConfig.from_dict(state["config"]), config)
    if changed:
        *others, last = [option(name) for name in RESUMABLE_CHANGES if name != "out"]
        allowed = f"{', '.join(others)} and {last}"
        raise ConfigError(
            f"cannot resume {directory} with other options: {'; '.join(changed)}. Only "
            f"{allowed} may change on resume"
        )


def resumed_config(directory: str | Path, overrides: dict[str, Any]) -> TrainConfig:
    """The options of the run in ``directory`` with ``overrides`` (field name: value) applied,
    its ``out`` set to ``directory``; refused if an override changes the computation."""
    state = load(directory)
    saved = TrainConfig.from_dict(state["config"])
    config = validate(replace(saved, **{**overrides, "out": str(directory)}))
    check_resumable(directory, state, config)
    return config


def restore(trainer: Trainer, state: dict[str, Any], rank: int | None) -> list[Any]:
    """Put ``trainer`` where the checkpoint ``state`` stands and return the algorithm states
    to load: every rank's (``rank`` None: all ranks live in this process) or ``[rank's]``."""
    config = trainer.config
    ranks = state["ranks"]
    if len(ranks) != config.workers:
        raise ConfigError(f"the checkpoint has {len(ranks)} ranks, this run {config.workers}")
    total = trainer.total_steps()
    if state["step"] > total:
        raise ConfigError(
            f"{config.out} is at step {state['step']}, past the {total} steps asked; give a "
            "larger --max-steps or --epochs"
        )
    mine = ranks[rank or 0]
    trainer.model.load_state_dict(state["model"])
    with torch.no_grad():  # this rank's own buffers (batch-norm statistics of its shard)
        for name, b in trainer.model.named_buffers():
            b.copy_(mine["buffers"][name])
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(mine["rng"])
    trainer.step, trainer.rows = int(state["step"]), list(state["rows"])
    trainer.elapsed, trainer.test_acc = float(state["elapsed"]), state["test_acc"]
    return [r["algorithm"] for r in ranks] if rank is None else [mine["algorithm"]]
