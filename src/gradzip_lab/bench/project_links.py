"""The alpha-beta cost of one collective: ``rounds x alpha + bytes / beta``.

A message of ``b`` bytes on a link costs ``alpha + b / beta`` seconds (Hockney's model): alpha is
the per-message latency, beta the link's byte rate after the wire's framing. A collective is
reduced to the rounds and bytes one rank sends in it (every rank sends as much in this model),
so its cost is ``rounds * alpha + bytes / beta``:

* ring all-reduce of ``n`` float32 values over ``P`` ranks: ``2(P-1)`` rounds of ``n/P`` values,
  ``2(P-1)/P x 4n`` bytes (Patarasuk & Yuan, 2009);
* all-gather of one payload of ``b`` bytes a rank: ``P-1`` rounds, ``(P-1) b`` bytes (the ring
  all-gather; gloo's and the transport's send each rank's payload to every other rank);
* an all-to-all (gloo's form of the integer all-reduce's reduce-scatter, and of the transport's
  all-gathers of equal slots): one round, the same bytes as the ring's collective, but every rank
  sends to every peer at once; its bytes move at ``alltoall_efficiency`` of beta (see
  :class:`Link`);
* hierarchical (``K`` ranks per node): a reduce-scatter and an all-gather among the ``K`` ranks
  of a node at the intra-node link, and between them one collective among the ``P/K`` nodes at
  the inter-node link (ZeRO++-style: each rank of a node carries ``1/K`` of the gradient).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: [CHOICE] TCP/IPv4 over Ethernet at MTU 1500 carries 1448 payload bytes in a 1514-byte frame
#: (timestamps on): a link of R bit/s moves R/8 x 1448/1514 payload bytes a second. The
#: measured fp32 rows of ``gradzip bench cluster`` sent 3% more than the payload.
WIRE_EFFICIENCY = 1448 / 1514


@dataclass(frozen=True)
class Link:
    """One link: ``alpha_s`` seconds a message, ``gbit_per_s`` its raw rate.

    ``alltoall_efficiency``: the byte rate of an all-to-all (``P - 1`` flows out of and into
    every rank at once) as a fraction of a ring's single flow on the same link. [CHOICE] 1 by
    default (a switch that serves every flow at line rate); measured, not assumed, where it is
    known: ``gradzip bench cluster`` times both forms on its links before the variants (its
    rows' ``link_probe``) and ``gradzip tune`` on the user's. On the emulated cluster at P = 8
    the flows lose packets to each other in the links' queues and the all-to-all moved its
    bytes at 0.7-0.85 of the ring's rate (docs/performance.md)."""

    alpha_s: float
    gbit_per_s: float
    efficiency: float = WIRE_EFFICIENCY
    alltoall_efficiency: float = 1.0

    def __post_init__(self) -> None:
        if not (self.alpha_s >= 0 and math.isfinite(self.alpha_s)):
            raise ValueError(f"alpha must be a finite number of seconds >= 0, got {self.alpha_s}")
        if not (self.gbit_per_s > 0 and math.isfinite(self.gbit_per_s)):
            raise ValueError(f"the link rate must be finite and > 0 Gbit/s, got {self.gbit_per_s}")
        if not 0 < self.efficiency <= 1:
            raise ValueError(f"the wire efficiency must be in (0, 1], got {self.efficiency}")
        if not 0 < self.alltoall_efficiency <= 1:
            raise ValueError(
                f"the all-to-all efficiency must be in (0, 1], got {self.alltoall_efficiency}"
            )

    @property
    def bytes_per_s(self) -> float:
        """beta: payload bytes a second."""
        return self.gbit_per_s * 1e9 / 8 * self.efficiency

    def latency_seconds(self, rounds: float) -> float:
        """``rounds * alpha``: the part of :meth:`seconds` no byte rate changes."""
        return rounds * self.alpha_s

    def seconds(self, rounds: float, nbytes: float, alltoall_bytes: float = 0.0) -> float:
        """``rounds * alpha + nbytes / beta``, the ``alltoall_bytes`` of ``nbytes`` (those sent
        in all-to-alls) at ``alltoall_efficiency x beta``."""
        ring_bytes = nbytes - alltoall_bytes
        return (
            self.latency_seconds(rounds)
            + ring_bytes / self.bytes_per_s
            + alltoall_bytes / (self.bytes_per_s * self.alltoall_efficiency)
        )

    def traffic_seconds(self, traffic: Traffic) -> float:
        """:meth:`seconds` of one :class:`Traffic`."""
        return self.seconds(traffic.rounds, traffic.nbytes, traffic.alltoall_bytes)


@dataclass(frozen=True)
class Traffic:
    """What one rank sends in a collective (or a sum of them): rounds and bytes, and how many
    of those bytes went in all-to-alls."""

    rounds: float
    nbytes: float
    alltoall_bytes: float = 0.0

    def __add__(self, other: Traffic) -> Traffic:
        return Traffic(
            self.rounds + other.rounds,
            self.nbytes + other.nbytes,
            self.alltoall_bytes + other.alltoall_bytes,
        )

    def times(self, k: float) -> Traffic:
        return Traffic(self.rounds * k, self.nbytes * k, self.alltoall_bytes * k)


NO_TRAFFIC = Traffic(0, 0)


def ring_allreduce(nbytes: float, world_size: int) -> Traffic:
    """A ring all-reduce of ``nbytes`` (float32: ``4n``): ``2(P-1)`` rounds, ``2(P-1)/P`` of the
    bytes."""
    _check_world(world_size)
    p = world_size
    return Traffic(2 * (p - 1), 2 * (p - 1) / p * nbytes)


def ring_reduce_scatter(nbytes: float, world_size: int) -> Traffic:
    """Half of the ring all-reduce: ``P-1`` rounds of ``nbytes / P``."""
    _check_world(world_size)
    p = world_size
    return Traffic(p - 1, (p - 1) / p * nbytes)


def allgather(payload_bytes: float, world_size: int) -> Traffic:
    """Every rank's payload of ``payload_bytes`` to every other rank: ``P-1`` rounds and
    payloads."""
    _check_world(world_size)
    return Traffic(world_size - 1, (world_size - 1) * payload_bytes)


def _check_world(world_size: int) -> None:
    if world_size < 1:
        raise ValueError(f"the world size must be >= 1, got {world_size}")
