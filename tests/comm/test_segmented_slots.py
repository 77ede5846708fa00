"""``DistributedTransport(segment_from=B)``: slot exchanges of slots of at least ``B`` bytes go
as 64 KiB messages to and from every peer, all posted at once, instead of one
``all_to_all_single``; on gloo processes every rank gets the same bytes, flags and counts as
with the one collective, for slots of one segment and of several, below and above ``B``."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from gradzip.comm.distributed import SEGMENT_BYTES, DistributedTransport
from gradzip.comm.spawn import run_processes
from gradzip.comm.transport import LENGTH_PREFIX_BYTES
from gradzip.errors import GradzipError
from gradzip.schemes.spec import ExchangeSpec

#: payload bounds: under one segment, exactly filling two with the header, and several with a
#: short last segment
SLOTS = (300, 2 * SEGMENT_BYTES - LENGTH_PREFIX_BYTES, 3 * SEGMENT_BYTES + 1234)


def _payload(rank: int, to: int, size: int) -> bytes:
    """Rank- and destination-specific bytes, shorter for later ranks (padding travels)."""
    length = size - 7 * rank - to
    return bytes((11 * rank + 5 * to + 3 * i) % 251 for i in range(length))


def _exchanges(transport: DistributedTransport) -> dict[str, Any]:
    """Every slot exchange at every size, the meter's counts and the collectives run."""
    runs = {"all_to_all_single": 0}
    original = dist.all_to_all_single

    def counted(*args: Any, **kwargs: Any) -> Any:
        runs["all_to_all_single"] += 1
        return original(*args, **kwargs)

    dist.all_to_all_single = counted  # type: ignore[assignment]  # a process of its own
    try:
        out: dict[str, Any] = {}
        rank, size = transport.rank, transport.world_size
        for slot in SLOTS:
            mine = _payload(rank, rank, slot)
            got, down = transport.all_gather_flagged(mine, rank != 1, "g", expected_size=slot)
            out[f"gather {slot}"] = ([bytes(p) for p in got], down)
            messages = [_payload(rank, to, slot) for to in range(size)]
            received = transport.all_to_all_bytes(messages, "a", expected_size=slot)
            out[f"all-to-all {slot}"] = [bytes(p) for p in received]
        # a scheme built on the all-to-all: the integer all-reduce of one tensor
        scheme = ExchangeSpec.parse("gradzip:qsgd:allreduce[chunk_values=null]").build(run_seed=3)
        grad = torch.randn(200_000, generator=torch.Generator().manual_seed(rank))
        means, down_ranks = scheme.reduce_many_if_all_finite(transport, [grad], [0], 0, True)
        assert down_ranks == [] and len(means) == 1
        out["allreduce"] = means[0].numpy().tobytes()
        out["meter"] = {
            f"{step}:{name}": (t.sent, t.received, t.messages)
            for (step, name), t in transport.meter.entries().items()
        }
        out["collectives"] = runs["all_to_all_single"]
        return out
    finally:
        dist.all_to_all_single = original  # type: ignore[assignment]


def _one_collective(transport: Any) -> dict[str, Any]:
    return _exchanges(DistributedTransport(timeout=60.0))


def _segmented(transport: Any) -> dict[str, Any]:
    # from the middle slot on: the smallest slots keep the one collective
    return _exchanges(DistributedTransport(timeout=60.0, segment_from=SEGMENT_BYTES))


@pytest.mark.distributed
def test_segmented_exchanges_give_every_rank_the_bytes_of_the_one_collective() -> None:
    plain = run_processes(3, _one_collective, timeout=120.0)
    segmented = run_processes(3, _segmented, timeout=120.0)
    for rank in range(3):
        ours, theirs = segmented[rank], plain[rank]
        for key in theirs:
            if key != "collectives":
                assert ours[key] == theirs[key], (rank, key)
        for slot in SLOTS:  # every rank's own message at its place, the others received
            expected = [_payload(src, rank, slot) for src in range(3)]
            assert ours[f"all-to-all {slot}"] == expected
        gathered, down = ours[f"gather {SLOTS[-1]}"]
        assert gathered[0] == _payload(0, 0, SLOTS[-1]) and down == [1]
    # the smallest slot's gather and all-to-all, and the all-reduce's small scale agreement,
    # keep the collective; the larger slots do not
    assert all(r["collectives"] < p["collectives"] for r, p in zip(segmented, plain, strict=True))
    assert segmented[0]["collectives"] >= 2


def test_a_bad_segment_threshold_is_refused_by_name() -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        for bad in (0, -5, True, 1.5, "65536"):
            with pytest.raises(ValueError, match="segment_from must be None or a number"):
                DistributedTransport(segment_from=bad)  # type: ignore[arg-type]
        assert DistributedTransport(segment_from=1).segment_from == 1
    finally:
        dist.destroy_process_group()


def _dies_mid_exchange(transport: Any) -> str:
    segmented = DistributedTransport(timeout=5.0, segment_from=1)
    if segmented.rank == 2:
        return "left"  # never joins: its peers' segments wait for it
    try:
        segmented.all_to_all_bytes([b"x" * 200_000] * 3, "a", expected_size=200_000)
    except GradzipError as err:
        return str(err)
    return "no error"


@pytest.mark.distributed
def test_a_peer_that_never_sends_its_segments_is_named_within_the_timeout() -> None:
    results = run_processes(3, _dies_mid_exchange, timeout=120.0)
    assert results[2] == "left"
    for message in results[:2]:
        assert "rank 2" in message or "within 5.0 s" in message, message
