"""The 8-byte header of every message: counted exactly once on each side by every operation of
the transport (point to point, broadcast, gather, a ring round), and refused with a
:class:`~gradzip.errors.GradzipError` when a peer's header word has bit 63 set."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from gradzip.comm.distributed import DistributedTransport
from gradzip.comm.local import run_local
from gradzip.comm.spawn import run_processes
from gradzip.comm.transport import LENGTH_PREFIX_BYTES, Transport
from gradzip.errors import GradzipError

H = LENGTH_PREFIX_BYTES


def every_operation(transport: Transport) -> dict[str, tuple[int, int, int]]:
    """Three ranks: a send of 10 bytes (0 to 1) and of none (2 to 0), a broadcast of 5 bytes
    from rank 2, a gather of ``3 * rank`` bytes to rank 0 and one ring round of ``4 + rank``
    bytes; the meter's ``(sent, received, messages)`` per collective (module level, so that
    spawned processes can import it)."""
    rank = transport.rank
    if rank == 0:
        transport.send_bytes(1, bytes(10))
        assert transport.recv_bytes(2) == b""
    elif rank == 1:
        assert transport.recv_bytes(0) == bytes(10)
    else:
        transport.send_bytes(0, b"")
    assert transport.broadcast_bytes(b"abcde" if rank == 2 else None, 2) == b"abcde"
    transport.gather_bytes(bytes(3 * rank), 0)
    transport.exchange_bytes((rank + 1) % 3, bytes(4 + rank), (rank - 1) % 3, "ring")
    return {c: (t.sent, t.received, t.messages) for (_, c), t in transport.meter.entries().items()}


#: payload bytes plus one header a message, on each side: by hand from the payload sizes
EXPECTED = [
    {
        "send": (10 + H, 0, 1),
        "recv": (0, 0 + H, 1),
        "broadcast": (0, 5 + H, 1),
        "gather": (0, (3 + H) + (6 + H), 2),
        "ring": (4 + H, 6 + H, 1),
    },
    {
        "recv": (0, 10 + H, 1),
        "broadcast": (0, 5 + H, 1),
        "gather": (3 + H, 0, 1),
        "ring": (5 + H, 4 + H, 1),
    },
    {
        "send": (0 + H, 0, 1),
        "broadcast": (2 * (5 + H), 0, 2),
        "gather": (6 + H, 0, 1),
        "ring": (6 + H, 5 + H, 1),
    },
]


def test_every_operation_counts_one_eight_byte_header_a_message_on_each_side() -> None:
    assert H == 8
    assert run_local(3, every_operation, timeout=30.0) == EXPECTED


@pytest.mark.distributed
def test_processes_count_the_same_headers() -> None:
    assert run_processes(3, every_operation, timeout=30.0) == EXPECTED


#: header words with bit 63 set: alone, with the flag bit and a length, every bit
MALFORMED = [1 << 63, (1 << 63) | (1 << 62) | 7, 2**64 - 1]
#: well-formed header words announcing more bytes than any machine holds (2 EiB, 4 EiB - 1)
ABSURD = [1 << 60, (1 << 61) - 1]  # lengths stay below bit 61 (the device-payload mark)


def malformed_headers(
    transport: DistributedTransport, words: list[int] = MALFORMED
) -> list[tuple[str, str]] | None:
    """Rank 0 sends rank 1 each bare header word of ``words`` (bypassing the transport); rank
    1's receive must fail, and so must every later operation of that transport (a fresh
    transport on the same group takes the next word)."""
    if transport.rank == 0:
        for word in words:
            dist.send(torch.frombuffer(bytearray(word.to_bytes(8, "little")), dtype=torch.uint8), 1)
        return None
    out = []
    for _ in words:
        messages = []
        for _ in range(2):
            try:
                transport.recv_bytes(0)
            except GradzipError as err:
                messages.append(str(err))
        assert len(messages) == 2, messages
        out.append((messages[0], messages[1]))
        transport = DistributedTransport(timeout=transport.timeout)
    return out


@pytest.mark.distributed
def test_a_header_word_with_bit_63_set_is_refused_by_name() -> None:
    """A length beyond 2**62 is no header gradzip writes; without the check the receiver would
    try to allocate it and fail with a bare RuntimeError."""
    results = run_processes(2, malformed_headers, timeout=30.0)[1]
    for word, (first, later) in zip(MALFORMED, results, strict=True):
        assert first == (
            f"rank 1: rank 0 sent a malformed message header {word:#x}: bit 63 is set (a header "
            "is a length below 2**62 and the flag bit 62)"
        )
        assert "failed earlier" in later and "malformed message header" in later


def absurd_headers(transport: DistributedTransport) -> list[tuple[str, str]] | None:
    return malformed_headers(transport, ABSURD)


@pytest.mark.distributed
def test_a_header_announcing_more_bytes_than_can_be_allocated_is_refused_by_name() -> None:
    results = run_processes(2, absurd_headers, timeout=30.0)[1]
    for word, (first, later) in zip(ABSURD, results, strict=True):
        assert f"rank 0 announced a message of {word} bytes, which cannot be allocated" in first
        assert "failed earlier" in later
