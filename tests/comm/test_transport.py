"""Transports: collectives on variable-size payloads, exact byte counts, simulated ranks that
behave like real processes, and clear errors when a peer is missing."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np
import pytest
import torch

from gradzip.comm.local import run_local
from gradzip.comm.transport import LENGTH_PREFIX_BYTES, Transport
from gradzip.errors import GradzipError

if TYPE_CHECKING:
    from tests.conftest import RunSimulatedAndProcesses


def payload_of(rank: int, step: int = 0) -> bytes:
    """Deterministic payloads of different sizes per rank (including an empty one)."""
    return bytes((rank * 31 + step + i) % 256 for i in range(rank * 7 + step))


def collectives(transport: Transport) -> dict[str, object]:
    rank, size = transport.rank, transport.world_size
    gathered = transport.all_gather_bytes(payload_of(rank))
    root = size - 1
    broadcast = transport.broadcast_bytes(payload_of(rank, 5) if rank == root else None, root)
    at_root = transport.gather_bytes(payload_of(rank, 2), 0)
    total = transport.meter.total(collective="all_gather")
    return {
        "gathered": gathered,
        "broadcast": broadcast,
        "gather": at_root,
        "all_gather_sent": total.sent,
        "all_gather_received": total.received,
    }


def check_collectives(results: list[dict[str, object]]) -> None:
    size = len(results)
    expected = [payload_of(r) for r in range(size)]
    for rank, res in enumerate(results):
        assert res["gathered"] == expected
        assert res["broadcast"] == payload_of(size - 1, 5)
        assert res["gather"] == ([payload_of(r, 2) for r in range(size)] if rank == 0 else None)

        # a ring all-gather: each rank receives every payload but its own and sends (its own
        # and then forwards) every payload but its successor's
        def cost(skip: int) -> int:
            return sum(len(p) + LENGTH_PREFIX_BYTES for r, p in enumerate(expected) if r != skip)

        assert res["all_gather_received"] == (cost(rank) if size > 1 else 0)
        assert res["all_gather_sent"] == (cost((rank + 1) % size) if size > 1 else 0)


@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_local_collectives(world_size: int) -> None:
    check_collectives(run_local(world_size, collectives))


def test_local_rank_failure_is_reported_not_hung() -> None:
    def body(transport: Transport) -> bytes:
        if transport.rank == 1:
            raise RuntimeError("boom")
        return transport.recv_bytes(1)

    start = time.monotonic()
    with pytest.raises(GradzipError, match="failed: rank 1: RuntimeError: boom; rank 0"):
        run_local(2, body, timeout=30.0)
    assert time.monotonic() - start < 5.0  # the waiting rank gives up at once, not at 30 s


def test_local_missing_message_times_out_with_a_named_peer() -> None:
    with pytest.raises(GradzipError, match=r"no message from rank [01] within 0.5 s"):
        run_local(2, lambda t: t.recv_bytes(1 - t.rank), timeout=0.5)


def test_bad_peer_rank() -> None:
    with pytest.raises(GradzipError, match="not in this group"):
        run_local(2, lambda t: t.send_bytes(2, b"x"))


def exchange_tensors(transport: Transport, seed: int) -> np.ndarray:
    """A module-level function, so spawned processes can import it."""
    gen = torch.Generator().manual_seed(seed + transport.rank)
    mine = torch.randn(100, generator=gen).numpy().tobytes()
    parts = transport.all_gather_bytes(mine)
    return np.concatenate([np.frombuffer(p, dtype=np.float32) for p in parts])


@pytest.mark.distributed
@pytest.mark.parametrize("world_size", [2, 3])
def test_processes_match_simulation_bitwise(
    world_size: int, simulated_and_processes: RunSimulatedAndProcesses
) -> None:
    runs = simulated_and_processes(world_size, collectives)
    check_collectives(runs.processes)
    assert runs.processes == runs.simulated
    values = simulated_and_processes(world_size, exchange_tensors, 7)
    for a, b in zip(values.processes, values.simulated, strict=True):
        assert a.tobytes() == b.tobytes()


BIG = 70_000  # longer than a gloo message's first part (64 KiB): the tail path travels too


def every_pattern(transport: Transport) -> dict[str, object]:
    """Each collective with payloads short and long (and empty), the flag bit, and the meter's
    entries; module level, so spawned processes can import it."""
    rank, size = transport.rank, transport.world_size
    big = bytes((rank + i) % 251 for i in range(BIG + 13 * rank))
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    out: dict[str, object] = {
        "gathered": transport.all_gather_bytes(big),
        "flagged": transport.all_gather_flagged(payload_of(rank), rank != 1, "flags"),
        "ring": transport.exchange_bytes(nxt, big, prv, "ring"),
        "broadcast": transport.broadcast_bytes(big if rank == 0 else None, 0),
        "gather": transport.gather_bytes(big[: 100 * rank], size - 1),
    }
    out["meter"] = {
        k[1]: (t.sent, t.received, t.messages) for k, t in transport.meter.entries().items()
    }
    return out


def plain_flags_traffic(transport: Transport) -> tuple[int, int, int]:
    transport.all_gather_bytes(payload_of(transport.rank), "flags")
    total = transport.meter.total(collective="flags")
    return total.sent, total.received, total.messages


def test_the_flag_bit_reaches_every_rank_at_no_cost() -> None:
    plain = run_local(3, plain_flags_traffic)
    for rank, res in enumerate(run_local(3, every_pattern)):
        assert res["flagged"] == ([payload_of(r) for r in range(3)], [1])
        assert res["meter"]["flags"] == plain[rank]  # type: ignore[index]


@pytest.mark.distributed
@pytest.mark.parametrize("world_size", [2, 3])
def test_every_pattern_counts_the_same_bytes_on_processes_and_threads(
    world_size: int, simulated_and_processes: RunSimulatedAndProcesses
) -> None:
    runs = simulated_and_processes(world_size, every_pattern)
    real, simulated = runs.processes, runs.simulated
    assert real == simulated
    assert real[0]["meter"]["ring"][0] == BIG + LENGTH_PREFIX_BYTES  # type: ignore[index]
