"""SIGINT and SIGTERM as requests to stop: caught, counted, and restored afterwards.

A long run must stop cleanly when asked: finish the step it is in, save what it has and exit,
and never leave processes behind. :class:`SignalCatcher` replaces the handlers of both signals
for the duration of a ``with`` block (in the main thread only: Python runs signal handlers
there, and only there can they be installed), records the first signal and how many arrived,
and calls a callback on each; the previous handlers come back on exit. What a signal means is
the caller's decision: a training loop stops at the next step boundary, a process launcher
forwards the signal to its children and kills them on the second one.

:class:`Interrupted` is what a stopped run raises or reports: a ``KeyboardInterrupt`` (code that
only knows Ctrl-C still treats it as one) carrying the signal's number.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

#: the signals that ask a run to stop: Ctrl-C and a polite kill (``kill``, a job scheduler)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def signal_name(signum: int) -> str:
    """``SIGINT`` for 2, and so on (``signal 99`` for a number without a name)."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def exit_status(signum: int) -> int:
    """The shell's exit status of a program stopped by ``signum``: 128 + its number
    (130 for SIGINT, 143 for SIGTERM)."""
    return 128 + signum


class Interrupted(KeyboardInterrupt):
    """A run stopped by a signal. ``results`` (where a launcher collected any) holds what each
    process returned, ``None`` for those that returned nothing; ``failures`` says what happened
    to those."""

    def __init__(
        self,
        signum: int,
        results: list[Any] | None = None,
        failures: dict[int, str] | None = None,
    ) -> None:
        self.signum = signum
        self.results = results
        self.failures = dict(failures or {})
        super().__init__(f"interrupted by {signal_name(signum)}")


class SignalCatcher:
    """``with SignalCatcher(callback) as caught:`` SIGINT and SIGTERM call
    ``callback(signum, count)`` (``count``: how many have arrived, this one included) instead
    of their usual handlers; ``caught.signum`` is the first one (None until one arrives).

    Outside the main thread (where handlers cannot be installed) it installs nothing and
    catches nothing. A callback may raise: the exception surfaces in the main thread at the
    point the signal interrupted.
    """

    def __init__(self, callback: Callable[[int, int], None] | None = None) -> None:
        self.callback = callback
        self.signum: int | None = None
        self.count = 0
        self._previous: dict[int, Any] = {}

    @property
    def caught(self) -> bool:
        return self.signum is not None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.signum is None:
            self.signum = signum
        if self.callback is not None:
            self.callback(signum, self.count)

    def __enter__(self) -> SignalCatcher:
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
