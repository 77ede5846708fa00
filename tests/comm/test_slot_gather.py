"""The all-gather of equal-sized slots (``all_gather_flagged(..., expected_size=S)``): on gloo
processes one collective carries every rank's payload (an ``all_to_all_single`` of this rank's
slot to every rank by default on the CPU, the backend's all-gather where
``gather_as_all_to_all`` is off, or for slots of at least ``ring_gather_from`` bytes), with the ring's bytes and flags, the meter counting ``P - 1`` slots of ``8 + S`` bytes each way, simulated ranks
counting the same, and payloads that do not fit, or frames that lie, refused by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist

from gradzip.comm.distributed import DistributedTransport
from gradzip.comm.local import run_local
from gradzip.comm.slots import DEVICE_PAYLOAD_BIT, frame_slot, header_word, read_slots, write_slot
from gradzip.comm.transport import LENGTH_PREFIX_BYTES, Transport
from gradzip.compressors import registry
from gradzip.device.host_reads import HostReads, count_host_reads
from gradzip.device.mode import forced_device_payloads
from gradzip.errors import GradzipError
from gradzip.schemes.allgather_decode import AllGatherDecode
from gradzip.sync import GradientSync
from tests.conftest import RunSimulatedAndProcesses

SLOT = 300  # the agreed payload bound of the transport-level checks


def payload_of(rank: int) -> bytes:
    """Rank-specific bytes of up to SLOT bytes (shorter for later ranks: padding travels)."""
    return bytes((7 * rank + 3 * i) % 251 for i in range(SLOT - 5 * rank))


def _as_bytes(payloads: list[Any]) -> list[bytes]:
    return [bytes(p.tolist()) if isinstance(p, torch.Tensor) else bytes(p) for p in payloads]


def _count_collectives(
    transport: Transport, patch: Callable[[Any, str, Any], None] = setattr
) -> dict[str, int]:
    """Count the equal-slot collectives this process runs, by kind (none on simulated ranks);
    ``patch`` replaces the collectives (a test's ``monkeypatch.setattr`` undoes it after)."""
    calls = {"all_gather": 0, "all_to_all": 0}
    if not isinstance(transport, DistributedTransport):
        return calls
    gather = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
    for kind, name in (("all_gather", gather), ("all_to_all", "all_to_all_single")):
        original = getattr(dist, name)

        def counted(*args: Any, _kind: str = kind, _original: Any = original, **kwargs: Any) -> Any:
            calls[_kind] += 1
            return _original(*args, **kwargs)

        patch(dist, name, counted)
    return calls


def _means(transport: Transport, device: bool) -> list[bytes]:
    """Two steps of the all-gather scheme (dqsg, error feedback) on three tensors."""
    scheme = AllGatherDecode(registry.get("dqsg")(M=2), run_seed=5, error_feedback=True)
    sync = GradientSync(transport, scheme=scheme)
    out = []
    for step in range(2):
        g = torch.Generator().manual_seed(100 * step + transport.rank)
        grads = [torch.randn(s, generator=g) * 0.01 for s in [(300,), (17, 9), (1,)]]
        if device:
            with forced_device_payloads():
                means = sync.synchronize(grads)
        else:
            means = sync.synchronize(grads)
        assert means is not None
        out += [m.numpy().tobytes() for m in means]
    return out


def every_path(transport: Transport) -> dict[str, Any]:
    """The slot path, the ring and the host path on the same bytes, a flag-down rank, the
    meter, the collectives run and the host reads; module level, so processes import it."""
    rank = transport.rank
    out: dict[str, Any] = {"by": getattr(transport, "gather_as_all_to_all", None)}
    calls = _count_collectives(transport)
    mine = torch.frombuffer(bytearray(payload_of(rank)), dtype=torch.uint8)
    reads: HostReads
    with forced_device_payloads():
        if isinstance(transport, DistributedTransport):
            with count_host_reads() as reads:  # one process: the counter is not shared
                slots, down = transport.all_gather_flagged(mine, True, "slots", expected_size=SLOT)
            out["slot_reads"] = reads.count
        else:
            slots, down = transport.all_gather_flagged(mine, True, "slots", expected_size=SLOT)
        out["slot_types"] = [type(p).__name__ for p in slots]
        out["slots"] = (_as_bytes(slots), down)
        out["slot_calls"] = dict(calls)
        ring, ring_down = transport.all_gather_flagged(mine, True, "ring")
        out["ring"] = (_as_bytes(ring), ring_down)
        # rank 1's flag is down: it sends an empty host payload, in its slot all the same
        flagged = b"" if rank == 1 else mine
        _, out["flag_down"] = transport.all_gather_flagged(
            flagged, rank != 1, "flagged", expected_size=SLOT
        )
    out["host"] = (_as_bytes(transport.all_gather_flagged(payload_of(rank), True, "host")[0]), [])
    out["means_device"] = _means(transport, device=True)
    out["means_host"] = _means(transport, device=False)
    out["calls"] = sum(calls.values())
    out["meter"] = {
        k[1]: (t.sent, t.received, t.messages) for k, t in transport.meter.entries().items()
    }
    return out


def every_path_by_all_gather(transport: Transport) -> dict[str, Any]:
    """:func:`every_path` with the backend's all-gather in place of the all-to-all."""
    if isinstance(transport, DistributedTransport):
        transport.gather_as_all_to_all = False
    return every_path(transport)


def every_path_by_ring_from_the_slot(transport: Transport) -> dict[str, Any]:
    """:func:`every_path` with ``ring_gather_from`` at the slot's size: its slots (and none
    smaller) take the backend's all-gather."""
    if isinstance(transport, DistributedTransport):
        transport.ring_gather_from = LENGTH_PREFIX_BYTES + SLOT
    return every_path(transport)


def oversize_on_processes(transport: Transport) -> str:
    """The last rank's payload exceeds the slot: every rank raises, none waits."""
    big = transport.rank == transport.world_size - 1
    mine = torch.zeros(SLOT + (7 if big else 0), dtype=torch.uint8)
    try:
        transport.all_gather_flagged(mine, True, expected_size=SLOT)
    except (ValueError, GradzipError) as err:
        return f"{type(err).__name__}: {err}"
    return "no error"


@pytest.mark.slow  # four process groups' start-up: ~90 s on the development machine
@pytest.mark.distributed
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("by", ["all_to_all", "all_gather", "ring_from_the_slot"])
def test_one_collective_gives_the_rings_bytes_flags_and_counts(
    world_size: int, by: str, simulated_and_processes: RunSimulatedAndProcesses
) -> None:
    body = {
        "all_to_all": every_path,
        "all_gather": every_path_by_all_gather,
        "ring_from_the_slot": every_path_by_ring_from_the_slot,
    }[by]
    runs = simulated_and_processes(world_size, body)
    expected = [payload_of(r) for r in range(world_size)]
    slot_bytes = LENGTH_PREFIX_BYTES + SLOT
    for rank, (real, simulated) in enumerate(zip(runs.processes, runs.simulated, strict=True)):
        # (b) the same bytes on every path, the same means as the host path
        assert real["slots"] == real["ring"] == real["host"] == (expected, [])
        assert real["means_device"] == real["means_host"] == simulated["means_host"]
        assert simulated["means_device"] == real["means_device"]
        # (a) one collective of the chosen kind carried the gather (gloo: the all-to-all by
        # default); the scheme's device steps took it too
        assert real["by"] is (by != "all_gather")
        kind = "all_to_all" if by == "all_to_all" else "all_gather"
        other = "all_gather" if kind == "all_to_all" else "all_to_all"
        assert real["slot_calls"] == {kind: 1, other: 0} and simulated["calls"] == 0
        assert real["calls"] > 2  # the scheme's device path: one per tensor and step
        assert real["slot_types"] == [
            "Tensor" for _ in range(world_size)
        ]  # device payloads stay tensors
        # the host-read bound: one read of the P header words
        assert real["slot_reads"] == 1
        # (c) the meter: P - 1 slots each way, counted alike by processes and threads
        assert real["meter"]["slots"] == ((world_size - 1) * slot_bytes,) * 2 + (world_size - 1,)
        assert real["meter"]["flagged"] == real["meter"]["slots"]
        assert real["meter"] == simulated["meter"], rank
        # (d) the flag-down rank is reported to every rank
        assert real["flag_down"] == simulated["flag_down"] == [1]


@pytest.mark.slow  # a process group's start-up: ~30 s on the development machine
@pytest.mark.distributed
def test_a_payload_larger_than_its_slot_is_refused_on_every_rank() -> None:
    from gradzip.comm.spawn import run_processes

    errors = run_processes(3, oversize_on_processes, timeout=60.0)
    assert errors[2].startswith("ValueError") and f"{SLOT + 7} bytes" in errors[2]
    assert f"expected_size of {SLOT} bytes" in errors[2]
    for message in errors[:2]:
        assert message.startswith("GradzipError") and "corrupt payload frame from rank 2" in message
        assert f"{SLOT + 7} bytes" in message and f"{SLOT} bytes of the slot" in message


def test_simulated_ranks_refuse_an_oversize_payload_naming_both_sizes() -> None:
    def body(transport: Transport) -> None:
        size = SLOT + (1 if transport.rank == 0 else 0)
        transport.all_gather_flagged(torch.zeros(size, dtype=torch.uint8), True, expected_size=SLOT)

    with pytest.raises(
        GradzipError, match=f"payload of {SLOT + 1} bytes exceeds the expected_size"
    ):
        run_local(2, body, timeout=30.0)


def _gathered(frames: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(frames)


def test_a_frame_whose_length_word_exceeds_its_slot_is_corrupt() -> None:
    good = frame_slot(torch.arange(5, dtype=torch.uint8), True, 8 + 16, torch.device("cpu"))
    bad = good.clone()
    bad[:8] = torch.frombuffer(
        bytearray((17 | DEVICE_PAYLOAD_BIT).to_bytes(8, "little")), dtype=torch.uint8
    )
    with pytest.raises(
        GradzipError, match=r"corrupt payload frame from rank 1.*17 bytes.*16 bytes"
    ):
        read_slots(_gathered([good, bad]), 2, 0, b"")
    bad[:8] = torch.frombuffer(bytearray((1 << 63).to_bytes(8, "little")), dtype=torch.uint8)
    with pytest.raises(GradzipError, match=r"corrupt payload frame from rank 1.*bit 63"):
        read_slots(_gathered([good, bad]), 2, 0, b"")


def test_slots_keep_lengths_flags_and_kinds() -> None:
    cpu = torch.device("cpu")
    tensor = torch.arange(5, dtype=torch.uint8)
    frames = [frame_slot(tensor, True, 24, cpu), frame_slot(b"", False, 24, cpu)]
    assert all(f.numel() == 24 for f in frames)
    assert int.from_bytes(bytes(frames[1][:8].tolist()), "little") == header_word(0, False, False)
    payloads, down = read_slots(_gathered(frames), 2, 1, b"")
    assert isinstance(payloads[0], torch.Tensor) and payloads[0].tolist() == list(range(5))
    assert payloads[1] == b"" and down == [1]


def test_no_slot_size_below_zero() -> None:
    def body(transport: Transport) -> None:
        transport.all_gather_flagged(b"", True, expected_size=-1)

    with pytest.raises(GradzipError, match="expected_size must be at least 0"):
        run_local(1, body, timeout=10.0)


@pytest.mark.parametrize(
    "payload",
    [b"", b"abc", bytearray(b"\x01\x02\x03\x04"), memoryview(b"xyz" * 5), b"\x07" * 16],
    ids=["empty", "bytes", "bytearray", "memoryview", "full"],
)
def test_a_slot_written_in_place_is_header_payload_zeros(payload: Any) -> None:
    """``write_slot`` into a dirty slot of an all-to-all's outgoing buffer: the header word,
    the payload's bytes, zeros to the end, and nothing outside its slot touched."""
    buffer = torch.full((3 * 24,), 0xAB, dtype=torch.uint8)
    write_slot(buffer.narrow(0, 24, 24), payload, True)
    raw = bytes(payload)
    expected = header_word(len(raw), True, False).to_bytes(8, "little") + raw
    assert bytes(buffer[24:48].tolist()) == expected + bytes(16 - len(raw))
    assert set(buffer[:24].tolist()) == {0xAB} and set(buffer[48:].tolist()) == {0xAB}
    tensor = torch.arange(5, dtype=torch.uint8)
    write_slot(buffer.narrow(0, 0, 24), tensor, False)
    assert bytes(buffer[:24].tolist()) == header_word(5, False, True).to_bytes(8, "little") + bytes(
        range(5)
    ) + bytes(11)


def test_an_oversize_payload_writes_its_length_and_zeros() -> None:
    slot = torch.full((24,), 0xAB, dtype=torch.uint8)
    write_slot(slot, b"\x01" * 17, True)
    assert bytes(slot.tolist()) == header_word(17, True, False).to_bytes(8, "little") + bytes(16)


def test_a_slot_off_the_cpu_is_written_with_tensor_operations_only() -> None:
    """Off the CPU the slot is framed with copies and fills on its device (meta tensors: no
    values exist, so a numpy view or a host read would raise)."""
    meta = torch.device("meta")
    slot = torch.empty(3 * 24, dtype=torch.uint8, device=meta)
    write_slot(slot.narrow(0, 0, 24), b"abc", True)
    write_slot(slot.narrow(0, 24, 24), torch.zeros(5, dtype=torch.uint8, device=meta), True)
    write_slot(slot.narrow(0, 48, 24), b"\x01" * 17, True)
    assert frame_slot(b"abc", True, 24, meta).shape == (24,)
