"""How a training process learns that it should stop after the step it is in.

* In a rank started by :func:`~gradzip.comm.spawn.run_processes` (``--backend gloo``): the
  launcher caught SIGINT or SIGTERM and set the ranks' shared stop flag, or died.
* Anywhere else (``--backend local``, or a rank under ``torchrun``, which passes signals on to
  its workers): SIGINT or SIGTERM arrived in this process. A second one stops a process that
  may escalate (the local backend: it is the only process) at once, by raising
  :class:`~gradzip.comm.signals.Interrupted`; ranks leave escalation to their launcher.

The ranks of a process backend agree on when to stop through the statistics they all-gather
every step (:func:`gradzip.experiments.methods.base.gather_metrics`), so all of them stop after
the same step even when the request reaches them at different moments.
"""

from __future__ import annotations

import signal
import sys
from types import TracebackType

from gradzip.comm import spawn
from gradzip.comm.signals import Interrupted, SignalCatcher


class StopRequest:
    """``with StopRequest(escalate=..., notice=...) as stop:`` then ``stop.signum`` is the
    signal that asked this process to stop (None while none has). ``notice``: say on a
    terminal, once, that Ctrl-C was heard and the run stops after the current step."""

    def __init__(self, *, escalate: bool, notice: bool) -> None:
        self.escalate = escalate
        self.notice = notice
        self._catcher: SignalCatcher | None = None

    @property
    def signum(self) -> int | None:
        if self._catcher is None:
            return spawn.stop_requested()
        return self._catcher.signum

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _on_signal(self, signum: int, count: int) -> None:
        if count > 1 and self.escalate:
            raise Interrupted(signum)
        if count == 1 and self.notice and signum == signal.SIGINT and sys.stderr.isatty():
            again = "Ctrl-C again to stop at once" if self.escalate else "Ctrl-C again to kill it"
            sys.stderr.write(f"\ngradzip train: stopping after the current step ({again})\n")

    def __enter__(self) -> StopRequest:
        if not spawn.in_launched_rank():
            self._catcher = SignalCatcher(self._on_signal).__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._catcher is not None:
            self._catcher.__exit__(kind, error, traceback)
