"""What a training method of ``gradzip train`` is: what the ranks exchange every step and how
the parameters follow from it, on simulated ranks and on process ranks.

The trainer (:class:`~gradzip.experiments.trainer.Trainer`) owns everything a method shares
with the others: data, model, optimizer, the per-worker gradients, evaluation, run directory
and checkpoints. A method gets the trainer after it is built (and, to resume, restored) and
returns a :class:`RankSetup`: the step's exchange (gradients in, averaged gradients or new
parameters out, with every rank's bits) and the state each rank checkpoints. Its options are a
frozen dataclass (``options``) whose fields carry defaults and a ``help`` in their metadata;
``gradzip train --method NAME --method-param KEY=VALUE`` fills them in. Registering an
instance in :data:`gradzip.experiments.methods.METHODS` is all a new method needs.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar

from gradzip.comm.transport import Transport, host_bytes
from gradzip.errors import ConfigError

if TYPE_CHECKING:  # the trainer imports torch-heavy modules; only its types are needed here
    from gradzip.comm.pool import RankPool
    from gradzip.experiments.config import TrainConfig
    from gradzip.experiments.exchange import Exchange
    from gradzip.experiments.stopping import StopRequest
    from gradzip.experiments.trainer import Trainer
    from gradzip.simulation.workers import WorkerStep


@dataclass(frozen=True)
class NoOptions:
    """The options of a method that has none."""


@dataclass
class RankSetup:
    """A method's part of a run: ``exchange(step, worker_step)`` for the trainer's loop, and
    ``state()``, what goes into a checkpoint (simulated: every rank's, in rank order; a process
    rank: its own)."""

    exchange: Exchange
    state: Callable[[], Any]


class TrainingMethod(ABC):
    """One training method; subclasses set ``name``, ``summary`` and ``options`` and build the
    exchange of simulated and of process ranks."""

    #: the name ``--method`` takes and ``config.json`` records
    name: ClassVar[str]
    #: one line for ``gradzip train --help``
    summary: ClassVar[str]
    #: its options: a frozen dataclass whose every field has a default
    options: ClassVar[type] = NoOptions

    def options_of(self, config: TrainConfig) -> Any:
        """``config.method_options`` as this method's options (defaults filled in)."""
        known = [f.name for f in fields(self.options)]
        unknown = sorted(set(config.method_options) - set(known))
        if unknown:
            raise ConfigError(
                f"method {self.name!r} has no parameter {', '.join(map(repr, unknown))}; "
                f"its parameters (--method-param): {', '.join(known) or 'none'}"
            )
        return self.options(**config.method_options)

    def resolved_options(self, config: TrainConfig) -> dict[str, Any]:
        """Every option of the method for ``config``, defaults included (the run record)."""
        return asdict(self.options_of(config))

    def validate(self, config: TrainConfig, options: Any) -> None:
        """Refuse (:class:`ConfigError`, naming the option) options this method cannot run
        with, its own and the trainer's (by default: any)."""
        return None

    def preflight(self, config: TrainConfig) -> None:
        """Build, in the caller, what every rank will build, so that option errors surface
        there and not inside a rank (by default: nothing to build)."""
        return None

    def run_label(self, config: TrainConfig) -> str:
        """The ``<method>`` part of the default run directory's name."""
        return self.name

    def record(self, config: TrainConfig) -> dict[str, Any]:
        """Entries the method sets in ``config.json`` (e.g. the scheme it runs, or None)."""
        return {}

    @abstractmethod
    def simulated(
        self, trainer: Trainer, pool: RankPool, states: list[Any] | None, stop: StopRequest
    ) -> RankSetup:
        """The exchange of P ranks on the threads of ``pool``, the gradients of all workers
        computed in this process; ``states``: every rank's state from a checkpoint, or None."""

    @abstractmethod
    def process(
        self, trainer: Trainer, transport: Transport, state: Any | None, stop: StopRequest
    ) -> RankSetup:
        """The exchange of this process's rank, its own shard's gradient computed here, with
        :func:`gather_metrics` for the statistics of every rank; ``state``: this rank's state
        from a checkpoint, or None."""


def gather_metrics(
    transport: Transport, out: WorkerStep, bits: dict[str, float | None], stop: StopRequest
) -> dict[str, Any]:
    """Every rank's bits and loss, the total of correct predictions, and whether any rank was
    asked to stop (so that all stop after this step), all-gathered (counted apart, as
    ``"metrics"``); the fields of :class:`~gradzip.experiments.exchange.Exchanged` but the
    gradients."""
    mine = {
        "loss": float(out.loss[0]),
        "correct": int(out.correct[0]),
        "bits": bits,
        "stop": stop.requested,
    }
    every = [
        json.loads(host_bytes(m))
        for m in transport.all_gather_bytes(json.dumps(mine).encode(), "metrics")
    ]
    return {
        "bits": [e["bits"] for e in every],
        "losses": [e["loss"] for e in every],
        "correct": sum(e["correct"] for e in every),
        "stop": any(e["stop"] for e in every),
    }
