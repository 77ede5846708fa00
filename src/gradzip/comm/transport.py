"""The transport interface: collectives on variable-size byte payloads, built on send/recv.

Every collective here is written on two point-to-point primitives, ``_start_send(dst, data)``
(returns a handle whose ``wait()`` completes the send) and ``_recv(src) -> data``, which the
concrete transports supply. Writing the collectives once keeps
a simulated run and a real one on the same code path (bit-identical results), lets payloads of
different sizes travel without padding, and makes the byte counts exact: a message of ``b``
payload bytes costs ``b + 8`` bytes (an 8-byte length prefix) to its sender and its receiver.

Deadlock freedom: in every round of a ring, each rank starts its send, receives, and only then
waits for its send to complete, so no cycle of ranks can block on each other.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol

from gradzip.comm.meter import ByteMeter

LENGTH_PREFIX_BYTES = 8


class SendHandle(Protocol):
    """A started send; ``wait()`` returns once the data has left this rank's hands."""

    def wait(self) -> object: ...


class Transport(ABC):
    """One rank's endpoint of a group of ``world_size`` ranks."""

    def __init__(self, rank: int, world_size: int) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in a group of {world_size}")
        self.rank = rank
        self.world_size = world_size
        self.meter = ByteMeter()

    # -- point to point (supplied by the concrete transports) -----------------------------------
    @abstractmethod
    def _start_send(self, dst: int, data: bytes) -> SendHandle: ...

    @abstractmethod
    def _recv(self, src: int) -> bytes: ...

    def send_bytes(self, dst: int, data: bytes, collective: str = "send") -> None:
        """Send ``data`` to rank ``dst`` (counted under ``collective``)."""
        self._check_peer(dst)
        self._start_send(dst, data).wait()
        self.meter.record(collective, len(data) + LENGTH_PREFIX_BYTES, 0)

    def recv_bytes(self, src: int, collective: str = "recv") -> bytes:
        """Receive the next message from rank ``src`` (counted under ``collective``)."""
        self._check_peer(src)
        data = self._recv(src)
        self.meter.record(collective, 0, len(data) + LENGTH_PREFIX_BYTES)
        return data

    def exchange_bytes(self, dst: int, data: bytes, src: int, collective: str) -> bytes:
        """Send ``data`` to ``dst`` while receiving one message from ``src`` (one ring round)."""
        self._check_peer(dst)
        self._check_peer(src)
        handle = self._start_send(dst, data)
        received = self._recv(src)
        handle.wait()
        self.meter.record(
            collective, len(data) + LENGTH_PREFIX_BYTES, len(received) + LENGTH_PREFIX_BYTES
        )
        return received

    # -- collectives --------------------------------------------------------------------------
    def all_gather_bytes(self, payload: bytes, collective: str = "all_gather") -> list[bytes]:
        """Every rank's payload, in rank order, on every rank (a ring: P - 1 rounds, each rank
        forwarding what it received last). Per rank: receives every payload but its own once,
        and sends every payload but its successor's once (plus 8 bytes per message); counted
        under ``collective``."""
        out: list[bytes | None] = [None] * self.world_size
        out[self.rank] = payload
        nxt, prv = (self.rank + 1) % self.world_size, (self.rank - 1) % self.world_size
        current = payload
        for step in range(self.world_size - 1):
            current = self.exchange_bytes(nxt, current, prv, collective)
            out[(self.rank - step - 1) % self.world_size] = current
        return [p for p in out if p is not None]

    def broadcast_bytes(self, payload: bytes | None, root: int) -> bytes:
        """``root``'s payload on every rank (the root sends it to each other rank)."""
        self._check_peer(root)
        if self.rank == root:
            if payload is None:
                raise ValueError("the broadcast root must supply a payload")
            for dst in range(self.world_size):
                if dst != root:
                    self.send_bytes(dst, payload, "broadcast")
            return payload
        return self.recv_bytes(root, "broadcast")

    def gather_bytes(self, payload: bytes, root: int) -> list[bytes] | None:
        """Every rank's payload, in rank order, on ``root`` (None elsewhere)."""
        self._check_peer(root)
        if self.rank != root:
            self.send_bytes(root, payload, "gather")
            return None
        return [
            payload if src == root else self.recv_bytes(src, "gather")
            for src in range(self.world_size)
        ]

    def _check_peer(self, peer: int) -> None:
        if not 0 <= peer < self.world_size:
            raise ValueError(f"rank {peer} is not in this group of {self.world_size}")
