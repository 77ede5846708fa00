"""Progress on standard error (no dependency): step, loss, accuracy, bits.

On a terminal, one line redrawn in place at most ten times a second. Anywhere else (a log
file, a pipe, CI) carriage-return redraws would pile up into one huge line, so it prints plain
lines instead: one per tenth of the run, at most one every ``interval`` seconds apart from the
first and the last step, which bounds a log to about a dozen lines whatever the run's length.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


class Progress:
    """``[#####.....] step/total loss acc Kbit/worker it/s`` (see the module docstring)."""

    def __init__(
        self,
        total: int,
        enabled: bool = True,
        width: int = 24,
        stream: TextIO | None = None,
        interval: float = 30.0,
        first_step: int = 0,
    ) -> None:
        self.total, self.enabled, self.width = total, enabled, width
        self.stream = stream if stream is not None else sys.stderr
        self.terminal = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = interval
        self._last = 0.0
        self._last_tenth = -1
        self._start = time.perf_counter()
        self._first = first_step  # a resumed run: its rate counts this session's steps only

    def update(self, step: int, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        last_step = step >= self.total
        if self.terminal:
            if now - self._last < 0.1 and not last_step:
                return
        else:
            tenth = 10 * step // max(self.total, 1)
            due = tenth > self._last_tenth and now - self._last >= min(self.interval, 1e9)
            if not (step == 1 or last_step or due):
                return
            self._last_tenth = tenth
        self._last = now
        line = self.describe(step, row, now)
        if self.terminal:
            self.stream.write("\r" + line + "\033[K")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def describe(self, step: int, row: dict[str, Any], now: float) -> str:
        done = int(self.width * step / max(self.total, 1))
        bits = row.get("wire_bits") or row.get("sent_bits")
        test = row.get("test_acc")
        parts = [
            f"[{'#' * done}{'.' * (self.width - done)}] {step}/{self.total}",
            f"loss {row['loss']:.4f}",
            f"train acc {row['train_acc']:.3f}" if "train_acc" in row else "",
            f"test acc {test:.4f}" if test is not None else "",
            f"{bits / 1000:,.1f} Kbit/worker" if bits is not None else "",
            f"{(step - self._first) / max(now - self._start, 1e-9):.1f} it/s",
        ]
        return "  ".join(p for p in parts if p)

    def close(self) -> None:
        if self.enabled and self.terminal:
            self.stream.write("\n")
            self.stream.flush()
