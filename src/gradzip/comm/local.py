"""P ranks simulated in one process: one thread per rank, queues as the wire.

The ranks run the same SPMD code as real processes (every collective is built on the same
primitive), so a simulated run is bit-identical to a ``torch.distributed`` one and counts the
same bytes. Threads give
real parallelism here because torch and NumPy release the GIL in their kernels.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar, cast

import torch

from gradzip.comm.transport import Payload, Send, Transport
from gradzip.errors import GradzipError

T = TypeVar("T")

#: Seconds a simulated rank waits for a peer's message before declaring it stalled. A rank that
#: raises wakes every waiting peer at once (``LocalGroup.fail``), so this bound only catches a
#: rank that is alive but never sends (a deadlock); it is generous because on a loaded machine
#: a large model's step between two messages can take minutes (60 s cut reproductions short
#: under a load of 20 on 2 cores).
DEFAULT_TIMEOUT = 600.0


class _Done:
    """A send into an unbounded queue is complete as soon as it is queued."""

    def wait(self) -> None:
        return None


class _FlagDown:
    """A payload whose sender's flag is down (the header bit of a real message)."""

    def __init__(self, payload: Payload) -> None:
        self.payload = payload if isinstance(payload, torch.Tensor) else bytes(payload)


def _unwrapped(item: Payload | _FlagDown) -> tuple[Payload, bool]:
    """A queued message as ``(payload, the sender's flag)``."""
    if isinstance(item, _FlagDown):
        return item.payload, False
    return item, True


class _Wake:
    """Queued into every box when a rank fails, so a blocked receiver wakes at once."""


_WAKE = _Wake()


class LocalGroup:
    """The shared wire of ``world_size`` simulated ranks: one FIFO queue per (src, dst)."""

    def __init__(self, world_size: int, timeout: float = DEFAULT_TIMEOUT) -> None:
        if world_size < 1:
            raise ValueError(f"a group needs at least one rank, got {world_size}")
        self.world_size = world_size
        self.timeout = timeout
        self.failed = threading.Event()  # set when any rank raised: the others stop waiting
        # ranks whose transport timed out: like a real process group's closed connections, any
        # later message to or from them fails, even one already queued
        self.broken: set[int] = set()
        self._queues = {
            (src, dst): queue.SimpleQueue[Payload | _FlagDown | _Wake]()
            for src in range(world_size)
            for dst in range(world_size)
        }

    def fail(self) -> None:
        """Mark the group failed and wake every rank blocked in a receive.

        Receivers block without polling (polling 64 threads every few ms costs the running
        ranks the GIL), so a failure has to reach them through their queues."""
        if self.failed.is_set():
            return
        self.failed.set()
        for box in self._queues.values():
            box.put(_WAKE)

    def endpoint(self, rank: int) -> LocalTransport:
        """Rank ``rank``'s transport."""
        return LocalTransport(self, rank)


class LocalTransport(Transport):
    """One simulated rank's endpoint in a :class:`LocalGroup`."""

    def __init__(self, group: LocalGroup, rank: int) -> None:
        super().__init__(rank, group.world_size)
        self._group = group

    def _transfer(
        self, sends: Sequence[Send], sources: Sequence[int]
    ) -> list[tuple[Payload, bool]]:
        # a send into an unbounded queue completes at once, so sending first cannot deadlock
        for dst, data, ok in sends:
            self._start_send(dst, data if ok else _FlagDown(data)).wait()
        received = [self._recv(src) for src in sources]
        return [_unwrapped(item) for item in received]

    def _start_send(self, dst: int, data: Payload | _FlagDown) -> _Done:
        """Queue one message for ``dst`` (the point a recording subclass may watch). A device
        payload travels as the tensor it is (the ranks share the process), host bytes as an
        immutable copy."""
        self._check_usable(dst)
        item = data if isinstance(data, _FlagDown | torch.Tensor) else bytes(data)
        self._group._queues[self.rank, dst].put(item)
        return _Done()

    def _check_usable(self, peer: int) -> None:
        if self.rank in self._group.broken:
            raise GradzipError(
                f"rank {self.rank}: this transport timed out earlier and its message stream is "
                "out of step"
            )
        if peer in self._group.broken:
            raise GradzipError(
                f"rank {self.rank}: rank {peer} timed out earlier waiting for a peer and left "
                "the group"
            )

    def _recv(self, src: int) -> Payload | _FlagDown:
        self._check_usable(src)
        box = self._group._queues[src, self.rank]
        try:
            item = box.get(timeout=self._group.timeout)
        except queue.Empty:
            self._group.broken.add(self.rank)
            raise GradzipError(
                f"rank {self.rank}: no message from rank {src} within "
                f"{self._group.timeout} s (the peer failed or stalled)"
            ) from None
        if isinstance(item, _Wake):
            raise GradzipError(
                f"rank {self.rank}: gave up waiting for rank {src}: another rank failed"
            )
        return item


def run_local(
    world_size: int, fn: Callable[[LocalTransport], T], timeout: float = DEFAULT_TIMEOUT
) -> list[T]:
    """Run ``fn(transport)`` on ``world_size`` simulated ranks at once; their results in rank
    order. An exception on any rank is re-raised here (the first, by rank)."""
    group = LocalGroup(world_size, timeout)
    results: list[T | None] = [None] * world_size
    errors: list[BaseException | None] = [None] * world_size

    def body(rank: int) -> None:
        try:
            results[rank] = fn(group.endpoint(rank))
        except BaseException as err:  # re-raised in the caller's thread
            errors[rank] = err
            group.fail()

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(world_size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    failed = [(rank, err) for rank, err in enumerate(errors) if err is not None]
    if failed:
        # the root cause first: ranks that only gave up waiting come last
        failed.sort(key=lambda item: "another rank failed" in str(item[1]))
        detail = "; ".join(f"rank {r}: {type(e).__name__}: {e}" for r, e in failed)
        raise GradzipError(f"simulated ranks failed: {detail}") from failed[0][1]
    return cast(list[T], results)
