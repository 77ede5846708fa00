"""The hook's worker thread: runs the buckets' reductions in FIFO order, off the main thread."""

from __future__ import annotations

import atexit
import queue
import threading
import weakref
from collections.abc import Callable
from itertools import count
from typing import Any

_STOP = object()
_names = count()
#: how long interpreter exit waits for one worker still busy with a job
EXIT_JOIN_SECONDS = 10.0
_live: weakref.WeakSet[BucketWorker] = weakref.WeakSet()


class BucketWorker:
    """One daemon thread that calls ``handle(owner, job)`` for each submitted job, in order.

    [CHOICE] The thread holds its owner only through a weak reference (between jobs it holds
    nothing), so an owner that is garbage collected stops its thread: ``weakref.finalize``
    queues the stop sign. :meth:`close` stops it explicitly and joins it; at interpreter exit
    the workers still running are closed too (each joined for at most
    :data:`EXIT_JOIN_SECONDS`), because a daemon thread that wakes while the interpreter is
    being torn down is killed inside whatever native code it is in, which can abort the
    process after the program has finished. Jobs run in
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
        self._finalizer.atexit = False  # _close_live_workers stops and joins it instead
        _live.add(self)

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

    def close(self, timeout: float | None = None) -> None:
        """Run what was submitted, then stop the thread and wait for it (at most ``timeout``
        seconds when given)."""
        if self._finalizer.detach() is not None:
            self._queue.put(_STOP)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)


@atexit.register
def _close_live_workers() -> None:
    for worker in list(_live):
        worker.close(timeout=EXIT_JOIN_SECONDS)


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
