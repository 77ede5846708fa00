"""Counting the bytes a rank really sends and receives, per step and per collective."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum


@dataclass
class Traffic:
    """Bytes one rank sent and received (payload bytes plus the 8-byte length prefixes)."""

    sent: int = 0
    received: int = 0
    messages: int = 0

    def add(self, sent: int, received: int) -> None:
        self.sent += sent
        self.received += received
        self.messages += 1


class _AnyStep(Enum):
    ANY = "any"


#: ``ByteMeter.total``'s default: every step, and the traffic outside any step too
ANY_STEP = _AnyStep.ANY


class ByteMeter:
    """Per-rank traffic keyed by ``(step, collective)``; ``step`` is the communication round of
    the innermost :meth:`step_scope` open when the message went out, ``None`` for traffic
    outside any step.

    [CHOICE] A message sent outside every scope is counted under ``None``, not refused: set-up
    and bookkeeping traffic (barriers, checkpoints gathered to one rank, metrics, start-up
    checks) legitimately belongs to no step, and ``None`` is what every earlier caller set for
    it. A scope is entered and left by the one thread that uses the transport."""

    def __init__(self) -> None:
        self._traffic: dict[tuple[int | None, str], Traffic] = defaultdict(Traffic)
        # the collectives seen per step, so a per-step total does not scan the whole history
        self._by_step: dict[int | None, set[str]] = defaultdict(set)
        self._step: int | None = None

    @property
    def step(self) -> int | None:
        """The step messages are counted under now (``None``: outside any step)."""
        return self._step

    @contextmanager
    def step_scope(self, step: int | None) -> Iterator[None]:
        """Count the messages sent inside the ``with`` block under ``step`` (``None``: under no
        step, also inside an enclosing scope); the enclosing scope's step comes back on exit,
        also when the block raises. Scopes nest."""
        enclosing, self._step = self._step, step
        try:
            yield
        finally:
            self._step = enclosing

    def record(self, collective: str, sent: int, received: int) -> None:
        """Add one message's bytes to the current step's entry for ``collective``."""
        self._traffic[self._step, collective].add(sent, received)
        self._by_step[self._step].add(collective)

    def total(
        self, step: int | _AnyStep | None = ANY_STEP, collective: str | None = None
    ) -> Traffic:
        """Traffic summed over the entries of ``step`` (``None``: the traffic outside any step,
        as :meth:`record` counts it; :data:`ANY_STEP`, the default: every entry) and of
        ``collective`` (``None``: any)."""
        if step is ANY_STEP:
            keys = list(self._traffic)
        else:
            keys = [(step, c) for c in self._by_step.get(step, ())]
        out = Traffic()
        for s, c in keys:
            if collective is None or c == collective:
                t = self._traffic[s, c]
                out.sent += t.sent
                out.received += t.received
                out.messages += t.messages
        return out

    def entries(self) -> dict[tuple[int | None, str], Traffic]:
        """A copy of every ``(step, collective) -> Traffic`` entry."""
        return {k: Traffic(v.sent, v.received, v.messages) for k, v in self._traffic.items()}

    def reset(self) -> None:
        self._traffic.clear()
        self._by_step.clear()
