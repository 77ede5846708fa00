"""The link probe of ``gradzip bench cluster``: the same bytes as a ring and as an all-to-all.

Before the first launch's variants at each world size and rate, its ranks time gloo's ring
all-gather (``all_gather_into_tensor``: ``P - 1`` rounds, one flow out of and into each rank)
and an ``all_to_all_single`` (one round, ``P - 1`` flows at once) of the same bytes,
``bytes_per_peer`` to each other rank, the forms alternating, each the slowest rank's best of
``repeat`` after a barrier. Their ratio, ``alltoall_efficiency = ring seconds / all-to-all
seconds``, is what the scaling model's :class:`~gradzip_lab.bench.project_links.Link` needs to
price the all-to-alls of the integer all-reduce and of the transport's gathers: a link property
measured beside the rows, not a figure fitted to them. Then the latency of one collective:
``LATENCY_REPEAT`` all-to-alls of ``LATENCY_BYTES_PER_PEER`` bytes to each peer, the median of
the slowest rank's times, ``alltoall_latency_s``. [CHOICE] The median, not the best: a step
pays the typical wait of each of its collectives (with P ranks on fewer cores, the wait for
every rank to be scheduled), not the luckiest. The validation of the scaling model takes
``alltoall_latency_s / (P - 1)`` as the row's alpha, since the model counts ``P - 1`` messages
(rounds) for every all-to-all or all-gather.

[CHOICE] 1 MiB to each peer: at P = 8 and 100 Mbit/s each form moves 7 MiB a rank (about 0.6 s),
long enough for TCP to reach its rate and the queues to fill, short beside a launch. One
untimed round of each form first (connections and buffers). Why the forms differ on the
emulated cluster: docs/performance.md ("At 100 Mbit/s the ring all-gather is the faster form").
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from gradzip_lab.tune_link import slowest_seconds

#: bytes each rank sends to each other rank in one form of the probe
PROBE_BYTES_PER_PEER = 1 << 20
PROBE_REPEAT = 3
#: the latency probe: all-to-alls of this many bytes to each peer, timed this many times
LATENCY_BYTES_PER_PEER = 64
LATENCY_REPEAT = 11


def probe_link(
    bytes_per_peer: int = PROBE_BYTES_PER_PEER, repeat: int = PROBE_REPEAT
) -> dict[str, Any]:
    """Time both forms on the default group (see the module docstring); their seconds, the
    payload Mbit/s a rank sent in each, and ``alltoall_efficiency``."""
    if bytes_per_peer < 1 or repeat < 1:
        raise ValueError(
            f"the probe needs bytes_per_peer >= 1 and repeat >= 1, got {bytes_per_peer}, {repeat}"
        )
    world = dist.get_world_size()
    mine = torch.zeros(bytes_per_peer, dtype=torch.uint8)
    gathered = torch.empty(world * bytes_per_peer, dtype=torch.uint8)
    outgoing = torch.zeros(world * bytes_per_peer, dtype=torch.uint8)
    incoming = torch.empty_like(outgoing)

    def ring() -> None:
        dist.all_gather_into_tensor(gathered, mine)

    def alltoall() -> None:
        dist.all_to_all_single(incoming, outgoing)

    ring()
    alltoall()
    ring_s, alltoall_s = float("inf"), float("inf")
    for _ in range(repeat):
        ring_s = min(ring_s, slowest_seconds(ring))
        alltoall_s = min(alltoall_s, slowest_seconds(alltoall))
    small_in = torch.zeros(world * LATENCY_BYTES_PER_PEER, dtype=torch.uint8)
    small_out = torch.empty_like(small_in)
    latencies = sorted(
        slowest_seconds(lambda: dist.all_to_all_single(small_out, small_in))
        for _ in range(LATENCY_REPEAT)
    )
    sent_bits = 8 * (world - 1) * bytes_per_peer
    return {
        "alltoall_latency_s": latencies[len(latencies) // 2],
        "bytes_per_peer": bytes_per_peer,
        "repeat": repeat,
        "ring_s": ring_s,
        "alltoall_s": alltoall_s,
        "ring_mbit_per_s": sent_bits / ring_s / 1e6,
        "alltoall_mbit_per_s": sent_bits / alltoall_s / 1e6,
        "alltoall_efficiency": ring_s / alltoall_s,
    }


def probe_summary(probe: dict[str, Any]) -> str:
    """One line of a probe's figures."""
    return (
        f"link probe, {probe['bytes_per_peer'] / 2**20:g} MiB to each peer: ring all-gather "
        f"{probe['ring_mbit_per_s']:.1f} Mbit/s, all-to-all {probe['alltoall_mbit_per_s']:.1f} "
        f"Mbit/s (all-to-all efficiency {probe['alltoall_efficiency']:.2f}); a "
        f"{LATENCY_BYTES_PER_PEER}-byte all-to-all {1e3 * probe['alltoall_latency_s']:.2f} ms"
    )
