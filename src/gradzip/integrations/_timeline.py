"""When the DDP hook's stages worked on which piece of which bucket: a record for profiling how
well the codec's CPU time hides behind the wire."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class StageSpan:
    """One stage's work on one piece: ``stage`` is ``"encode"``, ``"transfer"`` or
    ``"decode"``; ``bucket`` DDP's bucket index in the step; ``chunk`` the piece's chunk number
    (None: the whole bucket); ``start`` and ``end`` in seconds of ``time.perf_counter()``."""

    step: int
    stage: str
    bucket: int
    chunk: int | None
    start: float
    end: float


class Timeline:
    """The spans of every stage, in the order they ended (thread-safe; cleared by the caller).

    [CHOICE] Off unless asked for (``GradzipHookState(..., record_timeline=True)``): it costs
    two clock reads and an append per piece and stage, and it grows with every step until
    :meth:`clear`."""

    def __init__(self) -> None:
        self.spans: list[StageSpan] = []
        self._lock = threading.Lock()

    @contextmanager
    def span(self, step: int, stage: str, bucket: int, chunk: int | None) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            end = time.perf_counter()
            with self._lock:
                self.spans.append(StageSpan(step, stage, bucket, chunk, start, end))

    def clear(self) -> None:
        with self._lock:
            self.spans = []
