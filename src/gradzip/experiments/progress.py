"""A one-line progress bar on standard error (no dependency): step, loss, accuracy, bits."""

from __future__ import annotations

import sys
import time
from typing import Any


class Progress:
    """Redraws ``[#####.....] step/total loss acc Kbit/worker`` at most ten times a second."""

    def __init__(self, total: int, enabled: bool = True, width: int = 24) -> None:
        self.total, self.enabled, self.width = total, enabled, width
        self._last = 0.0
        self._start = time.perf_counter()

    def update(self, step: int, row: dict[str, Any]) -> None:
        now = time.perf_counter()
        if not self.enabled or (now - self._last < 0.1 and step < self.total):
            return
        self._last = now
        done = int(self.width * step / max(self.total, 1))
        bits = row.get("wire_bits") or row.get("sent_bits")
        test = row.get("test_acc")
        parts = [
            f"[{'#' * done}{'.' * (self.width - done)}] {step}/{self.total}",
            f"loss {row['loss']:.4f}",
            f"train acc {row['train_acc']:.3f}" if "train_acc" in row else "",
            f"test acc {test:.4f}" if test is not None else "",
            f"{bits / 1000:,.1f} Kbit/worker" if bits is not None else "",
            f"{step / (now - self._start):.1f} it/s",
        ]
        sys.stderr.write("\r" + "  ".join(p for p in parts if p) + "\033[K")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()
