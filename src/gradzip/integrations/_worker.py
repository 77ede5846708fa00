"""The hook's worker thread: runs the buckets' reductions in FIFO order, off the main thread."""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable
from itertools import count
from typing import Any

_STOP = object()
_names = count()


class BucketWorker:
    """One daemon thread that calls ``handle(owner, job)`` for each submitted job, in order.

    [CHOICE] The thread holds its owner only through a weak reference (between jobs it holds
    nothing), so an owner that is garbage collected stops its thread: ``weakref.finalize``
    queues the stop sign. :meth:`close` stops it explicitly and joins it. Jobs run in
    submission order, which is the order DDP hands over the buckets: the same on every rank,
    so the collectives of different buckets pair up.
    """

    def __init__(self, owner: object, handle: Callable[[Any, Any], None], name: str) -> None:
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread = threading.Thread(
            target=_loop,
            args=(self._queue, weakref.ref(owner), handle),
            name=f"{name}-{next(_names)}",
            daemon=True,
        )
        self._thread.start()
        self._finalizer = weakref.finalize(owner, self._queue.put, _STOP)

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def submit(self, job: object) -> None:
        self._queue.put(job)

    def drain(self) -> None:
        """Wait until every submitted job has run."""
        if threading.current_thread() is self._thread:
            return  # called from a job: nothing else can run meanwhile
        self._queue.join()

    def close(self) -> None:
        """Run what was submitted, then stop the thread and wait for it."""
        if self._finalizer.detach() is not None:
            self._queue.put(_STOP)
        if threading.current_thread() is not self._thread:
            self._thread.join()


def _loop(
    jobs: queue.Queue[Any], owner: weakref.ref[Any], handle: Callable[[Any, Any], None]
) -> None:
    while True:
        job = jobs.get()
        try:
            if job is _STOP:
                return
            target = owner()
            if target is None:
                return
            handle(target, job)
            del target
        finally:
            jobs.task_done()
