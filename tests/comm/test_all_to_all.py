"""``all_to_all_bytes``: every rank's message to every rank, in ONE ``all_to_all_single`` of
equal slots on gloo processes and in ``P - 1`` pairwise rounds on simulated ranks, with the
same messages and the meter counting ``P - 1`` slots of ``8 + S`` bytes each way on both; a
message that does not fit its slot is refused by name on both sides, never truncated."""

from __future__ import annotations

from typing import Any

import pytest
import torch.distributed as dist

from gradzip.comm.distributed import DistributedTransport
from gradzip.comm.local import run_local
from gradzip.comm.transport import LENGTH_PREFIX_BYTES, Transport
from gradzip.errors import GradzipError
from tests.conftest import RunSimulatedAndProcesses

SLOT = 200


def message(src: int, dst: int) -> bytes:
    """Rank ``src``'s bytes for rank ``dst``: distinct per pair, of different lengths (padding
    travels), an empty one among them."""
    length = 0 if (src, dst) == (0, 1) else SLOT - 7 * src - dst
    return bytes((11 * src + 5 * dst + i) % 251 for i in range(length))


def exchange(transport: Transport) -> dict[str, Any]:
    """One all-to-all; the collectives run and the meter (module level: processes import it)."""
    calls = [0]
    if isinstance(transport, DistributedTransport):
        original = dist.all_to_all_single

        def counted(*args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            return original(*args, **kwargs)

        dist.all_to_all_single = counted  # type: ignore[assignment]
    size, rank = transport.world_size, transport.rank
    got = transport.all_to_all_bytes(
        [message(rank, dst) for dst in range(size)], "a2a", expected_size=SLOT
    )
    totals = transport.meter.total()
    return {
        "got": [bytes(p) for p in got],
        "calls": calls[0],
        "meter": (totals.sent, totals.received, totals.messages),
    }


def oversize(transport: Transport) -> str:
    """The last rank's message to rank 0 exceeds the slot (its message to rank 1 fits)."""
    size, rank = transport.world_size, transport.rank
    messages = [message(rank, dst) for dst in range(size)]
    if rank == size - 1:
        messages[0] = bytes(SLOT + 7)
    try:
        transport.all_to_all_bytes(messages, "a2a", expected_size=SLOT)
    except (ValueError, GradzipError) as err:
        return f"{type(err).__name__}: {err}"
    return "no error"


@pytest.mark.slow  # two process groups' start-up: ~40 s on the development machine
@pytest.mark.distributed
@pytest.mark.parametrize("world_size", [2, 3])
def test_one_collective_gives_every_message_and_the_rounds_counts(
    world_size: int, simulated_and_processes: RunSimulatedAndProcesses
) -> None:
    runs = simulated_and_processes(world_size, exchange)
    slot_bytes = LENGTH_PREFIX_BYTES + SLOT
    for rank, (real, simulated) in enumerate(zip(runs.processes, runs.simulated, strict=True)):
        expected = [message(src, rank) for src in range(world_size)]
        assert real["got"] == simulated["got"] == expected
        assert real["calls"] == 1 and simulated["calls"] == 0
        counted = (world_size - 1) * slot_bytes
        assert real["meter"] == simulated["meter"] == (counted, counted, world_size - 1)


@pytest.mark.slow  # a process group's start-up: ~30 s on the development machine
@pytest.mark.distributed
def test_a_message_larger_than_its_slot_is_refused_by_sender_and_receiver() -> None:
    from gradzip.comm.spawn import run_processes

    errors = run_processes(3, oversize, timeout=60.0)
    assert errors[2].startswith("ValueError") and f"{SLOT + 7} bytes" in errors[2]
    assert f"expected_size of {SLOT} bytes" in errors[2]
    assert errors[0].startswith("GradzipError") and "corrupt payload frame from rank 2" in errors[0]
    assert f"{SLOT + 7} bytes" in errors[0] and f"{SLOT} bytes of the slot" in errors[0]
    assert errors[1] == "no error"  # its message from rank 2 fitted


def test_simulated_ranks_exchange_in_pairwise_rounds() -> None:
    results = run_local(4, exchange)
    for rank, result in enumerate(results):
        assert result["got"] == [message(src, rank) for src in range(4)]
        counted = 3 * (LENGTH_PREFIX_BYTES + SLOT)
        assert result["meter"] == (counted, counted, 3)


def test_simulated_ranks_refuse_an_oversize_message_naming_both_sizes() -> None:
    def body(transport: Transport) -> None:
        messages = [message(transport.rank, dst) for dst in range(2)]
        if transport.rank == 1:
            messages[0] = bytes(SLOT + 1)
        transport.all_to_all_bytes(messages, "a2a", expected_size=SLOT)

    with pytest.raises(GradzipError, match=f"{SLOT + 1} bytes exceeds the expected_size"):
        run_local(2, body, timeout=30.0)


def test_the_message_count_and_the_slot_are_checked() -> None:
    def body(transport: Transport) -> str:
        errors = []
        for messages, slot in (([b""], SLOT), ([b"", b""], -1)):
            try:
                transport.all_to_all_bytes(messages, "a2a", expected_size=slot)
            except ValueError as err:
                errors.append(str(err))
        return " | ".join(errors)

    for text in run_local(2, body):
        assert "needs 2 messages, got 1" in text
        assert "expected_size must be at least 0 bytes, got -1" in text
