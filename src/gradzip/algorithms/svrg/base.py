"""The skeleton every algorithm of this package shares: rounds, recording, checkpoints, the
result.

An algorithm is SPMD code: every rank builds it with its own transport and the same problem,
settings and starting point, and calls :meth:`DistributedAlgorithm.run`. A round either
completes on every rank (and then every rank holds bitwise the same iterates) or raises; the
iterates and counters are replaced only once a round has completed, so a round that fails
(NaN on some rank, a peer that died, an update that overflowed) leaves the algorithm as it was,
the scheme's error-feedback buffers included. :meth:`DistributedAlgorithm.state_dict` and
:meth:`DistributedAlgorithm.load_state_dict` checkpoint it (:mod:`.state`).
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch

from gradzip.algorithms.svrg.channel import Channel
from gradzip.algorithms.svrg.problems import FiniteSum
from gradzip.algorithms.svrg.prox import NoProx, Prox
from gradzip.algorithms.svrg.state import (
    STATE_VERSION,
    check_counter,
    check_tensors,
    copy_tensors,
    describe_difference,
)
from gradzip.algorithms.svrg.trace import Recorder, Trace
from gradzip.comm.transport import Transport
from gradzip.errors import NonFiniteInputError
from gradzip.schemes import Scheme

#: a tensor of the checkpoint: its shape, dtype and whether it may be None
TensorSpec = tuple[tuple[int, ...], torch.dtype, bool]


@dataclass
class RunResult:
    """What :meth:`DistributedAlgorithm.run` returns on one rank.

    ``x``: the output point; ``trace``: the recorded objective and bits; ``steps``: rounds
    done; ``bits``/``full_bits``: what this rank sent for the averaged messages / the full
    gradients (measured, headers and length prefixes included); ``rank``: this rank.
    """

    x: torch.Tensor
    trace: Trace
    steps: int
    bits: int
    full_bits: int
    rank: int


class DistributedAlgorithm(ABC):
    """Rounds of an SPMD optimisation method over a :class:`~gradzip.comm.transport.Transport`."""

    def __init__(
        self,
        transport: Transport,
        problem: FiniteSum,
        scheme: Scheme,
        prox: Prox | None,
        record_every: int,
        record_rank: int | None,
    ) -> None:
        self.transport = transport
        self.problem = problem
        self.prox = prox if prox is not None else NoProx()
        self.channel = Channel(transport, scheme)
        self.recorder = Recorder(self.channel, problem, self.prox, record_every, record_rank)
        #: communication rounds completed (the keys' ``step``)
        self.step = 0

    @property
    def run_seed(self) -> int:
        return self.channel.run_seed

    @abstractmethod
    def point(self) -> torch.Tensor:
        """The current iterate whose objective is recorded."""

    @abstractmethod
    def finished(self) -> bool:
        """Whether every round has been done."""

    @abstractmethod
    def _round(self) -> bool:
        """Do one round (starting an epoch first if one is due) and commit it; True when the
        round ended an epoch. It changes nothing before its commit, which cannot fail."""

    def advance(self) -> bool:
        """One round; True when it ended an epoch. A round that raises leaves the algorithm as
        it was: iterates, counters and the scheme's buffers (ECQ-SGD's residuals)."""
        saved = self.channel.scheme.snapshot()
        try:
            return self._round()
        except BaseException:
            self.channel.scheme.restore(saved)
            raise

    def check_finite(self, what: str, *tensors: torch.Tensor) -> None:
        """Raise :class:`~gradzip.errors.NonFiniteInputError` before a commit that would store
        NaN or Inf (a step that overflowed). Every rank holds the same bits here, so every rank
        raises alike."""
        if not all(bool(torch.isfinite(t).all()) for t in tensors):
            raise NonFiniteInputError(
                f"round {self.step}: the new {what} holds NaN or Inf (the step size is probably "
                "too large); no rank applied anything"
            )

    # -- checkpoints ---------------------------------------------------------------------------
    @abstractmethod
    def _state_tensors(self) -> dict[str, torch.Tensor | None]:
        """The method's tensors to checkpoint (iterates, anchors, the epoch's gradient)."""

    @abstractmethod
    def _tensor_specs(self) -> dict[str, TensorSpec]:
        """``name -> (shape, dtype, may_be_none)`` of :meth:`_state_tensors`."""

    def _state_scalars(self) -> dict[str, Any]:
        """The method's counters and sums besides ``step`` (default: none)."""
        return {}

    def _check_scalars(self, scalars: Mapping[str, Any], step: int) -> dict[str, Any]:
        """Validated copies of saved :meth:`_state_scalars`, consistent with ``step``
        (``ValueError`` otherwise)."""
        if dict(scalars) != {}:
            raise ValueError(f"unexpected scalars {sorted(scalars)}")
        return {}

    @abstractmethod
    def _load(self, tensors: Mapping[str, torch.Tensor | None], scalars: Mapping[str, Any]) -> None:
        """Install validated state (cannot fail)."""

    def _resolved(self) -> dict[str, Any]:
        """Parameters resolved from the config and the data (step sizes, epoch length)."""
        return {}

    def fingerprint(self) -> dict[str, Any]:
        """What a checkpoint must share with the object that loads it."""
        config = getattr(self, "config", None)
        fields = asdict(config) if config is not None else {}
        t = self.transport
        return {
            **{f"config.{k}": v for k, v in fields.items()},
            **{f"resolved.{k}": v for k, v in self._resolved().items()},
            "problem": f"{type(self.problem).__name__}(n={self.problem.n}, dim="
            f"{self.problem.dim}, dtype={self.problem.dtype})",
            "prox": repr(self.prox),
            "rank": t.rank,
            "world_size": t.world_size,
        }

    def state_dict(self) -> dict[str, Any]:
        """A checkpoint: plain, ``torch.save``-able data (copies); see :mod:`.state`."""
        return {
            "version": STATE_VERSION,
            "algorithm": type(self).__name__,
            "fingerprint": self.fingerprint(),
            "step": self.step,
            "tensors": copy_tensors(self._state_tensors()),
            "scalars": dict(self._state_scalars()),
            "scheme": self.channel.scheme.state_dict(),
            "recorder": self.recorder.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict` of the same algorithm, settings, problem size, prox,
        rank and group size. Everything is validated first: a mismatch or a malformed state
        raises ``ValueError`` naming it, and nothing changes."""
        name = type(self).__name__
        what = f"{name} state"
        if not isinstance(state, Mapping):
            raise ValueError(f"{what} must be a mapping, got {type(state).__name__}")
        if state.get("version") != STATE_VERSION:
            raise ValueError(
                f"{what} has version {state.get('version')!r}, expected {STATE_VERSION}"
            )
        if state.get("algorithm") != name:
            raise ValueError(f"the state is of {state.get('algorithm')!r}, not {name}")
        saved = state.get("fingerprint")
        if not isinstance(saved, Mapping):
            raise ValueError(f"{what} has no fingerprint")
        difference = describe_difference(saved, self.fingerprint())
        if difference is not None:
            raise ValueError(f"{what} does not match this run: {difference}")
        step = check_counter(state.get("step"), f"{what}: step")
        tensors = check_tensors(state.get("tensors", {}), self._tensor_specs(), what)
        scalars = state.get("scalars")
        if not isinstance(scalars, Mapping):
            raise ValueError(f"{what}: 'scalars' must be a mapping")
        try:
            checked = self._check_scalars(scalars, step)
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{what}: {err}") from err
        recorder = copy.copy(self.recorder)  # loads into a copy: the original stays on error
        saved_recorder = state.get("recorder")
        if not isinstance(saved_recorder, Mapping):
            raise ValueError(f"{what}: recorder state must be a mapping")
        recorder.load_state_dict(saved_recorder)
        try:
            self.channel.scheme.load_state_dict(state.get("scheme", {}))  # atomic
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{what} does not fit this scheme: {err}") from err
        # commit: nothing below can fail
        self.recorder = recorder
        self.step = step
        self._load(tensors, checked)

    @abstractmethod
    def output(self) -> torch.Tensor:
        """The method's output point."""

    def run(self, on_step: Callable[[DistributedAlgorithm], None] | None = None) -> RunResult:
        """All remaining rounds; ``on_step(self)`` after each (e.g. to check the iterates)."""
        # the starting point, unless this run resumes a checkpoint whose trace has it already
        self.recorder.maybe_record(self.step, self.point, force=not self.recorder.trace.steps)
        while not self.finished():
            ended_epoch = self.advance()
            self.recorder.count(self.step - 1)
            if on_step is not None:
                on_step(self)
            self.recorder.maybe_record(self.step, self.point, force=ended_epoch or self.finished())
        return RunResult(
            x=self.output(),
            trace=self.recorder.trace,
            steps=self.step,
            bits=self.recorder.bits,
            full_bits=self.recorder.full_bits,
            rank=self.transport.rank,
        )
