"""The transport interface: collectives on variable-size byte payloads, built on one primitive.

Every collective here is written on one primitive, ``_transfer(sends, sources)``: send each
``(dst, data, ok)`` and receive one message from each rank of ``sources``, all at once, with
every receive posted before any send (a receive that is not yet posted when the data arrives
halves the rate of a rate-limited link with gloo). The concrete transports supply it. Writing
the collectives once keeps a simulated run and a real one on the same code path
(bit-identical results), lets payloads of different sizes travel without padding, and makes
the byte counts exact: a message of ``b`` payload bytes costs ``b + 8`` bytes (an 8-byte
header: the length, and one flag bit) to its sender and its receiver.

The flag bit lets a rank say "my gradients are not finite" on a message it sends anyway
(:meth:`Transport.all_gather_flagged`), so agreeing on it costs no round of its own.

An all-gather whose payloads every rank knows to be at most ``expected_size`` bytes (device
payloads of a size the shape fixes) may travel as one collective of equal slots instead of the
ring, where the transport has one (:meth:`Transport.all_gather_flagged`).

Deadlock freedom: a transfer posts its receives, starts its sends and only then waits, and in
every round of a ring each rank sends to its successor and receives from its predecessor, so no
cycle of ranks can block on each other.
"""

from __future__ import annotations

import functools
import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import ParamSpec, TypeVar, cast

import torch

from gradzip.comm.meter import ByteMeter

#: bytes of the header every message carries: its length (and the sender's flag bit)
LENGTH_PREFIX_BYTES = 8
#: the bit of the header word that says the sender's flag is down (lengths stay below bit 61,
#: which marks a device payload: see DistributedTransport)
FLAG_DOWN_BIT = 1 << 62

#: a message's payload: host bytes, or a device payload (a 1-D ``uint8`` tensor on the device
#: where it was encoded, see :mod:`gradzip.device`), which travels as it is
Payload = bytes | bytearray | memoryview | torch.Tensor


def host_bytes(payload: Payload) -> bytes:
    """A message's bytes in host memory, for the schemes whose messages are built and parsed on
    the host (the integer sums, the ring, the parameter server): a device payload is read back
    here (:func:`~gradzip.device.host_reads.host_read`, counted)."""
    if isinstance(payload, torch.Tensor):
        from gradzip.device.host_reads import host_read

        return host_read(payload).tobytes()
    return bytes(payload)


def oversize_error(rank: int, size: int, expected_size: int) -> ValueError:
    """The error of a rank whose payload does not fit the slot every rank agreed on."""
    return ValueError(
        f"rank {rank}: a payload of {size} bytes exceeds the expected_size of {expected_size} "
        "bytes every rank announced for this all-gather (it is never truncated)"
    )


#: one message to send: ``(destination rank, payload, the sender's flag)``
Send = tuple[int, Payload, bool]

P = ParamSpec("P")
R = TypeVar("R")


class Transport(ABC):
    """One rank's endpoint of a group of ``world_size`` ranks."""

    def __init__(self, rank: int, world_size: int) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in a group of {world_size}")
        self.rank = rank
        self.world_size = world_size
        self.meter = ByteMeter()

    def step_scope(self, step: int | None) -> AbstractContextManager[None]:
        """``with transport.step_scope(step):`` counts the messages this rank sends and
        receives inside the block under ``step`` (``None``: under no step); the enclosing
        scope's step comes back on exit, also on an exception
        (:meth:`~gradzip.comm.meter.ByteMeter.step_scope`)."""
        return self.meter.step_scope(step)

    # -- the primitive (supplied by the concrete transports) ------------------------------------
    @abstractmethod
    def _transfer(
        self, sends: Sequence[Send], sources: Sequence[int]
    ) -> list[tuple[Payload, bool]]:
        """Send every message of ``sends`` and receive the next message from each rank of
        ``sources`` (in that order): ``(payload, flag)`` per source. Receives are posted
        before the sends start; returns once every send has completed. A device payload
        arrives as a device payload (a tensor), host bytes as bytes."""

    # -- point to point -------------------------------------------------------------------------
    def send_bytes(self, dst: int, data: Payload, collective: str = "send") -> None:
        """Send ``data`` to rank ``dst`` (counted under ``collective``)."""
        self._check_peer(dst)
        self._transfer([(dst, data, True)], ())
        self.meter.record(collective, len(data) + LENGTH_PREFIX_BYTES, 0)

    def recv_bytes(self, src: int, collective: str = "recv") -> Payload:
        """Receive the next message from rank ``src`` (counted under ``collective``)."""
        self._check_peer(src)
        [(data, _)] = self._transfer((), [src])
        self.meter.record(collective, 0, len(data) + LENGTH_PREFIX_BYTES)
        return data

    def exchange_bytes(self, dst: int, data: Payload, src: int, collective: str) -> Payload:
        """Send ``data`` to ``dst`` while receiving one message from ``src`` (one ring round)."""
        return self._exchange(dst, data, True, src, collective)[0]

    def _exchange(
        self,
        dst: int,
        data: Payload,
        ok: bool,
        src: int,
        collective: str,
        counted: int | None = None,
    ) -> tuple[Payload, bool]:
        self._check_peer(dst)
        self._check_peer(src)
        [(received, flag)] = self._transfer([(dst, data, ok)], [src])
        if counted is None:
            sent, got = len(data) + LENGTH_PREFIX_BYTES, len(received) + LENGTH_PREFIX_BYTES
            self.meter.record(collective, sent, got)
        else:
            self.meter.record(collective, counted, counted)
        return received, flag

    # -- collectives --------------------------------------------------------------------------
    def all_gather_bytes(
        self,
        payload: Payload,
        collective: str = "all_gather",
        *,
        expected_size: int | None = None,
    ) -> list[Payload]:
        """Every rank's payload, in rank order, on every rank (a ring: P - 1 rounds, each rank
        forwarding what it received last). Per rank: receives every payload but its own once,
        and sends every payload but its successor's once (plus 8 bytes per message); counted
        under ``collective``. ``expected_size``: see :meth:`all_gather_flagged`."""
        return self.all_gather_flagged(payload, True, collective, expected_size=expected_size)[0]

    def all_gather_flagged(
        self,
        payload: Payload,
        ok: bool,
        collective: str = "all_gather",
        *,
        expected_size: int | None = None,
    ) -> tuple[list[Payload], list[int]]:
        """:meth:`all_gather_bytes` that also tells every rank which ranks' ``ok`` was False
        (ascending): the flag rides in each payload's header, forwarded with it, so it costs
        no byte and no round of its own.

        ``expected_size``: the most bytes any rank's payload has, passed alike by every rank
        (computed from shapes and parameters, e.g.
        :meth:`~gradzip.compressors.base.Compressor.fixed_payload_size`), or None on every
        rank. With it, a transport that has an all-gather of equal-sized tensors moves every
        payload in one collective, each rank's in a slot of ``8 + expected_size`` bytes (the
        header word, then the payload, then zeros): :class:`~gradzip.comm.distributed.
        DistributedTransport` does; others run the ring. Meant for device payloads (a flag-down
        rank's empty host payload travels in its slot too: the choice of path must not depend
        on one rank's flag).

        [CHOICE] Counted as what the collective moves in a ring implementation, whichever path
        runs (so a simulated run counts a real one's bytes): ``P - 1`` messages of ``8 +
        expected_size`` bytes sent and as many received, padding included, since the wire
        carries it. For payloads of exactly ``expected_size`` bytes that is the ring's count.

        Raises ValueError naming both sizes when this rank's payload exceeds
        ``expected_size`` (never truncated), and :class:`~gradzip.errors.GradzipError` when a
        received slot's header word announces more than its slot holds (a corrupt frame, or
        a peer whose payload was too large)."""
        if expected_size is None:
            return self._ring_gather(payload, ok, collective, None)
        if expected_size < 0:
            raise ValueError(f"expected_size must be at least 0 bytes, got {expected_size}")
        gathered = self._gather_slots(payload, ok, expected_size, collective)
        if gathered is not None:
            return gathered
        if len(payload) > expected_size:
            raise oversize_error(self.rank, len(payload), expected_size)
        return self._ring_gather(payload, ok, collective, LENGTH_PREFIX_BYTES + expected_size)

    def _ring_gather(
        self, payload: Payload, ok: bool, collective: str, counted: int | None
    ) -> tuple[list[Payload], list[int]]:
        """The ring of :meth:`all_gather_flagged`; ``counted``: the bytes each message is
        counted as, sent and received (None: its own size, header included)."""
        size = self.world_size
        out: list[Payload | None] = [None] * size
        down = [False] * size
        out[self.rank], down[self.rank] = payload, not ok
        nxt, prv = (self.rank + 1) % size, (self.rank - 1) % size
        current, flag = payload, ok
        for step in range(size - 1):
            current, flag = self._exchange(nxt, current, flag, prv, collective, counted)
            owner = (self.rank - step - 1) % size
            out[owner], down[owner] = current, not flag
        return [p for p in out if p is not None], [r for r in range(size) if down[r]]

    def _gather_slots(
        self, payload: Payload, ok: bool, expected_size: int, collective: str
    ) -> tuple[list[Payload], list[int]] | None:
        """Every rank's payload and the ranks whose flag is down from one collective of
        equal-sized slots (see :meth:`all_gather_flagged`, which has checked nothing yet), or
        None where this transport has none: the default, so the ring runs."""
        return None

    def all_to_all_bytes(
        self, messages: Sequence[Payload], collective: str, *, expected_size: int
    ) -> list[Payload]:
        """Send ``messages[j]`` to rank ``j`` and receive one message from every rank: the
        returned list holds rank ``i``'s message to this rank at ``i`` (this rank's own
        ``messages[rank]`` at its own place, never sent).

        ``expected_size``: the most bytes any rank's message to any rank has, passed alike by
        every rank (computed from shapes and keys). A transport with an all-to-all of
        equal-sized tensors moves every message in ONE collective, each in a slot of ``8 +
        expected_size`` bytes (:class:`~gradzip.comm.distributed.DistributedTransport`);
        others run ``P - 1`` pairwise rounds (round ``k``: to ``rank + k``, from ``rank -
        k``). [CHOICE] Counted as ``P - 1`` messages of ``8 + expected_size`` bytes sent and as
        many received, whichever path runs (a simulated run counts a real one's bytes).

        Raises ValueError naming both sizes when one of this rank's messages exceeds
        ``expected_size`` (never truncated), and :class:`~gradzip.errors.GradzipError` when a
        received slot's header announces more than its slot holds."""
        size = self.world_size
        if len(messages) != size:
            raise ValueError(f"all_to_all_bytes needs {size} messages, got {len(messages)}")
        if expected_size < 0:
            raise ValueError(f"expected_size must be at least 0 bytes, got {expected_size}")
        gathered = self._all_to_all_slots(messages, expected_size, collective)
        if gathered is not None:
            return gathered
        self._check_messages_fit(messages, expected_size)
        out = list(messages)
        counted = LENGTH_PREFIX_BYTES + expected_size
        for k in range(1, size):
            dst, src = (self.rank + k) % size, (self.rank - k) % size
            out[src] = self._exchange(dst, messages[dst], True, src, collective, counted)[0]
        return out

    def _check_messages_fit(self, messages: Sequence[Payload], expected_size: int) -> None:
        """The ValueError of :meth:`all_to_all_bytes` for a message of this rank to another
        that exceeds ``expected_size`` (its own message is never sent)."""
        for dst, message in enumerate(messages):
            if dst != self.rank and len(message) > expected_size:
                raise oversize_error(self.rank, len(message), expected_size)

    def _all_to_all_slots(
        self, messages: Sequence[Payload], expected_size: int, collective: str
    ) -> list[Payload] | None:
        """Every rank's message to this rank from one all-to-all of equal-sized slots (see
        :meth:`all_to_all_bytes`, which has checked only the count), or None where this
        transport has none: the default, so the pairwise rounds run."""
        return None

    def broadcast_bytes(self, payload: Payload | None, root: int) -> Payload:
        """``root``'s payload on every rank (the root sends it to each other rank, all at
        once)."""
        self._check_peer(root)
        if self.rank == root:
            if payload is None:
                raise ValueError("the broadcast root must supply a payload")
            others = [dst for dst in range(self.world_size) if dst != root]
            self._transfer([(dst, payload, True) for dst in others], ())
            for _ in others:
                self.meter.record("broadcast", len(payload) + LENGTH_PREFIX_BYTES, 0)
            return payload
        return self.recv_bytes(root, "broadcast")

    def gather_bytes(self, payload: Payload, root: int) -> list[Payload] | None:
        """Every rank's payload, in rank order, on ``root`` (None elsewhere); the root posts
        every receive at once."""
        self._check_peer(root)
        if self.rank != root:
            self.send_bytes(root, payload, "gather")
            return None
        others = [src for src in range(self.world_size) if src != root]
        received = iter(self._transfer((), others))
        out = []
        for src in range(self.world_size):
            if src == root:
                out.append(payload)
                continue
            data = next(received)[0]
            self.meter.record("gather", 0, len(data) + LENGTH_PREFIX_BYTES)
            out.append(data)
        return out

    def _check_peer(self, peer: int) -> None:
        if not 0 <= peer < self.world_size:
            raise ValueError(f"rank {peer} is not in this group of {self.world_size}")


def in_step_scope(method: Callable[P, R]) -> Callable[P, R]:
    """Run ``method`` inside ``transport.step_scope(step)`` of its own ``transport`` and
    ``step`` arguments: for a method all of whose messages belong to the step it is given (a
    scheme's ``reduce``), declared once at its ``def``."""
    names = list(inspect.signature(method).parameters)
    if "transport" not in names or "step" not in names:
        raise TypeError(f"in_step_scope: {method.__qualname__} needs parameters transport and step")
    transport_at, step_at = names.index("transport"), names.index("step")

    @functools.wraps(method)
    def scoped(*args: P.args, **kwargs: P.kwargs) -> R:
        transport = kwargs["transport"] if "transport" in kwargs else args[transport_at]
        step = kwargs["step"] if "step" in kwargs else args[step_at]
        with cast(Transport, transport).step_scope(cast("int | None", step)):
            return method(*args, **kwargs)

    return scoped
