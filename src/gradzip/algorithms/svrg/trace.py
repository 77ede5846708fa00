"""What a run records: the objective and the bits this rank really sent, per round."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from gradzip.algorithms.svrg.channel import Channel
from gradzip.algorithms.svrg.problems import FiniteSum
from gradzip.algorithms.svrg.prox import Prox


@dataclass
class Trace:
    """One rank's record of a run, one entry per recorded round.

    ``steps[k]`` rounds done; ``losses[k]`` is ``F = f + h`` at the algorithm's current point
    (``None`` on ranks that do not evaluate it); ``bits[k]`` and ``full_bits[k]`` are the
    cumulative bits this rank sent for the averaged messages and for the full gradients, read
    from its transport's meter (payload bytes, headers and 8-byte length prefixes);
    ``seconds[k]`` the wall time since the run started.
    """

    steps: list[int] = field(default_factory=list)
    losses: list[float | None] = field(default_factory=list)
    bits: list[int] = field(default_factory=list)
    full_bits: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "losses": self.losses,
            "bits": self.bits,
            "full_bits": self.full_bits,
            "seconds": self.seconds,
        }


class Recorder:
    """Keeps the running bit totals of a rank and appends to its :class:`Trace`.

    ``record_every`` rounds (0: only when :meth:`record` is forced, at epoch ends and at the
    end); the objective is evaluated on ``record_rank`` only (``None``: on every rank), since
    all ranks hold the same point and a full pass over the data is the costliest thing here.
    """

    def __init__(
        self,
        channel: Channel,
        problem: FiniteSum,
        prox: Prox,
        record_every: int,
        record_rank: int | None,
    ) -> None:
        if record_every < 0:
            raise ValueError(f"record_every must be >= 0, got {record_every}")
        self.channel = channel
        self.problem = problem
        self.prox = prox
        self.record_every = record_every
        self.evaluates = record_rank is None or record_rank == channel.transport.rank
        self.trace = Trace()
        self.bits = 0
        self.full_bits = 0
        self._started = time.perf_counter()
        self._last: int | None = None

    def objective(self, x: torch.Tensor) -> float:
        """``F(x) = f(x) + h(x)``."""
        value = self.problem.loss(x) + self.prox.value(x)
        return value if math.isfinite(value) else math.inf

    def state_dict(self) -> dict[str, Any]:
        """The trace so far, the running totals and the elapsed time (plain data, copies)."""
        return {
            "trace": {k: list(v) for k, v in self.trace.to_dict().items()},
            "bits": self.bits,
            "full_bits": self.full_bits,
            "last": self._last,
            "elapsed": time.perf_counter() - self._started,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict`; ``ValueError`` (nothing changed) if it is malformed.
        The clock resumes at the saved elapsed time."""
        if not isinstance(state, Mapping):
            raise ValueError(f"recorder state must be a mapping, got {type(state).__name__}")
        trace = state.get("trace")
        names = list(Trace().to_dict())
        if not isinstance(trace, Mapping) or sorted(trace) != sorted(names):
            raise ValueError(f"recorder state: 'trace' must hold the lists {names}")
        lengths = {len(trace[k]) for k in names}
        if len(lengths) != 1:
            raise ValueError(f"recorder state: trace lists of different lengths {sorted(lengths)}")
        counts = (state.get("bits"), state.get("full_bits"))
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in counts):
            raise ValueError(f"recorder state: bit totals must be ints >= 0, got {counts}")
        last, elapsed = state.get("last"), state.get("elapsed")
        if last is not None and not isinstance(last, int):
            raise ValueError(f"recorder state: 'last' must be an int or None, got {last!r}")
        if not isinstance(elapsed, float) or not elapsed >= 0:
            raise ValueError(f"recorder state: 'elapsed' must be seconds >= 0, got {elapsed!r}")
        self.trace = Trace(**{k: list(trace[k]) for k in names})
        self.bits, self.full_bits = counts[0], counts[1]  # type: ignore[assignment]
        self._last = last
        self._started = time.perf_counter() - elapsed

    def count(self, step: int) -> None:
        """Add round ``step``'s measured bits to the running totals."""
        self.bits += self.channel.inner_bits(step)
        self.full_bits += self.channel.full_gradient_bits(step)

    def maybe_record(
        self, steps_done: int, point: Callable[[], torch.Tensor], force: bool = False
    ) -> None:
        """Record after ``steps_done`` rounds if it is due (or ``force``), once per count."""
        due = force or (self.record_every > 0 and steps_done % self.record_every == 0)
        if not due or self._last == steps_done:
            return
        self._last = steps_done
        t = self.trace
        t.steps.append(steps_done)
        t.losses.append(self.objective(point()) if self.evaluates else None)
        t.bits.append(self.bits)
        t.full_bits.append(self.full_bits)
        t.seconds.append(time.perf_counter() - self._started)
