"""``DistributedTransport(ring_gather_from=B)``: all-gathers of equal slots of at least ``B``
bytes take the backend's all-gather (gloo: a ring), smaller ones the all-to-all; the setting is
checked when the transport is built. The same bytes either way are checked on gloo processes
by ``tests/comm/test_slot_gather.py``; here the choice itself, on a one-rank gloo group."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

from gradzip.comm.distributed import DistributedTransport
from gradzip.comm.transport import LENGTH_PREFIX_BYTES
from tests.comm.test_slot_gather import _count_collectives


@pytest.fixture
def one_rank_group() -> Iterator[None]:
    """A gloo group of this process alone (an in-memory store: no socket, no process)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _kinds_run(
    transport: DistributedTransport, slot: int, monkeypatch: pytest.MonkeyPatch
) -> list[str]:
    """The collectives one all-gather of ``slot``-byte payloads runs."""
    calls = _count_collectives(transport, monkeypatch.setattr)
    payload = torch.arange(slot, dtype=torch.int64).remainder(251).to(torch.uint8)
    got, down = transport.all_gather_flagged(payload, True, "test", expected_size=slot)
    assert down == [] and bytes(got[0].tolist()) == bytes(payload.tolist())
    monkeypatch.undo()
    return [kind for kind, count in calls.items() for _ in range(count)]


@pytest.mark.usefixtures("one_rank_group")
@pytest.mark.parametrize("bad", [-1, True, 1.5, "65536"])
def test_a_bad_threshold_is_refused_by_name(bad: Any) -> None:
    with pytest.raises(ValueError, match="ring_gather_from must be None or a number of bytes"):
        DistributedTransport(ring_gather_from=bad)


@pytest.mark.usefixtures("one_rank_group")
def test_slots_from_the_threshold_on_take_the_ring(monkeypatch: pytest.MonkeyPatch) -> None:
    slot = 300
    framed = LENGTH_PREFIX_BYTES + slot  # the threshold counts the slot's header word
    default = DistributedTransport()
    assert default.ring_gather_from is None and default.gather_as_all_to_all
    assert _kinds_run(default, slot, monkeypatch) == ["all_to_all"]
    for threshold, kind in ((0, "all_gather"), (framed, "all_gather"), (framed + 1, "all_to_all")):
        transport = DistributedTransport(ring_gather_from=threshold)
        assert _kinds_run(transport, slot, monkeypatch) == [kind], threshold
    # without the all-to-all (NCCL's setting) every size takes the backend's all-gather
    transport = DistributedTransport(ring_gather_from=framed + 1)
    transport.gather_as_all_to_all = False
    assert _kinds_run(transport, slot, monkeypatch) == ["all_gather"]
