"""A persistent pool of simulated ranks: :func:`~gradzip.comm.local.run_local` without starting
P threads every step.

A training loop calls :meth:`RankPool.run` once per step. The pool keeps one
:class:`~gradzip.comm.local.LocalGroup` and one long-lived thread per rank, and hands every call
the same :class:`~gradzip.comm.local.LocalTransport` objects, so their byte meters and anything
a rank keeps between steps persist.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar, cast

from gradzip.comm.local import DEFAULT_TIMEOUT, LocalGroup, LocalTransport
from gradzip.errors import GradzipError

T = TypeVar("T")

_STOP = object()  # sent to a rank's inbox: the thread ends

_Outcome = tuple[int, bool, Any]  # (rank, succeeded, result or exception)


def _serve(transport: LocalTransport, inbox: queue.SimpleQueue[Any], outbox: Any) -> None:
    """One rank's thread: run each job from ``inbox`` on ``transport`` until told to stop.

    It holds no reference to the pool, so an unreferenced pool can be collected (and its
    finalizer then stops the threads)."""
    group = transport._group
    while True:
        job = inbox.get()
        if job is _STOP:
            return
        try:
            outcome: _Outcome = (transport.rank, True, job(transport))
        except BaseException as err:  # handed to the caller's thread
            group.fail()
            outcome = (transport.rank, False, err)
        outbox.put(outcome)
        del job, outcome


def _stop_threads(inboxes: list[queue.SimpleQueue[Any]], threads: list[threading.Thread]) -> None:
    for inbox in inboxes:
        inbox.put(_STOP)
    current = threading.current_thread()
    for thread in threads:
        if thread is not current:
            thread.join()


class RankPool:
    """``world_size`` simulated ranks on long-lived daemon threads.

    ``pool.run(fn)`` runs ``fn(transport)`` on every rank at once, each on its own
    :class:`~gradzip.comm.local.LocalTransport` (the same objects on every call:
    :attr:`transports`), and returns the results in rank order.

    If a rank raises, the other ranks stop waiting for it, and once every rank has returned the
    call raises :class:`~gradzip.errors.GradzipError` naming every failed rank, the root cause
    first, chained to the first failure (as ``run_local`` does). The messages still in flight
    are then discarded and the pool stays usable, the ranks' own state being whatever their
    code left (:class:`~gradzip.sync.GradientSync` undoes a failed step). A rank whose transport
    timed out breaks its group for good, as a real process group's closed connections would:
    the pool is then marked :attr:`broken` and every later call raises at once, as does a call
    after :meth:`close`.

    Use it as a context manager, or call :meth:`close`; the threads are daemons, and a pool
    that is garbage-collected unclosed stops them too.
    """

    def __init__(self, world_size: int, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.group = LocalGroup(world_size, timeout)
        self.world_size = world_size
        #: rank ``r``'s transport, the same object on every call
        self.transports: list[LocalTransport] = [self.group.endpoint(r) for r in range(world_size)]
        #: why the pool can no longer run (``None`` while it can)
        self.broken: str | None = None
        self._lock = threading.Lock()
        self._outbox: queue.SimpleQueue[_Outcome] = queue.SimpleQueue()
        self._inboxes: list[queue.SimpleQueue[Any]] = [
            queue.SimpleQueue() for _ in range(world_size)
        ]
        self._threads = [
            threading.Thread(
                target=_serve,
                args=(transport, inbox, self._outbox),
                name=f"gradzip-rank-{transport.rank}",
                daemon=True,
            )
            for transport, inbox in zip(self.transports, self._inboxes, strict=True)
        ]
        for thread in self._threads:
            thread.start()
        self._finalizer = weakref.finalize(self, _stop_threads, self._inboxes, self._threads)
        # at interpreter exit the daemon threads just end: joining one stuck in a job would hang
        self._finalizer.atexit = False

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def run(self, fn: Callable[[LocalTransport], T]) -> list[T]:
        """``fn(transport)`` on every rank at once; the results in rank order."""
        if threading.current_thread() in self._threads:
            raise GradzipError("RankPool.run called from one of the pool's own ranks")
        with self._lock:
            if self.closed:
                raise GradzipError("this RankPool is closed")
            if self.broken is not None:
                raise GradzipError(f"this RankPool is broken: {self.broken}")
            results: list[Any] = [None] * self.world_size
            errors: list[BaseException | None] = [None] * self.world_size
            pending = 0
            try:
                for inbox in self._inboxes:
                    inbox.put(fn)
                    pending += 1
                while pending:
                    rank, ok, value = self._outbox.get()
                    pending -= 1
                    if ok:
                        results[rank] = value
                    else:
                        errors[rank] = value
            except BaseException:  # interrupted while ranks may still be running fn
                self.group.fail()
                self.broken = "a call was interrupted before every rank had finished"
                raise
            failed = [(rank, err) for rank, err in enumerate(errors) if err is not None]
            if failed:
                self._recover()
                # the root cause first: ranks that only gave up waiting come last
                failed.sort(key=lambda item: "another rank failed" in str(item[1]))
                detail = "; ".join(f"rank {r}: {type(e).__name__}: {e}" for r, e in failed)
                raise GradzipError(f"simulated ranks failed: {detail}") from failed[0][1]
            return cast(list[T], results)

    def _recover(self) -> None:
        """After a failed call (every rank has returned): drop the undelivered messages so the
        next call starts on an empty wire, unless a timeout broke the group."""
        group = self.group
        if group.broken:
            self.broken = f"rank(s) {sorted(group.broken)} timed out and left the group"
            return
        for box in group._queues.values():
            while True:
                try:
                    box.get_nowait()
                except queue.Empty:
                    break
        group.failed.clear()

    def close(self) -> None:
        """Stop and join the rank threads (after any call in progress); idempotent."""
        if threading.current_thread() in self._threads:
            raise GradzipError("RankPool.close called from one of the pool's own ranks")
        with self._lock:
            self._finalizer()

    def __enter__(self) -> RankPool:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
