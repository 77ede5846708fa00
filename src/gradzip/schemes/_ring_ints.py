"""Ring allreduce of non-negative integer vectors (code sums), bit-packed on the wire.

Reduce-scatter then allgather around the ring ``r -> r + 1`` (P - 1 rounds each), as in
Patarasuk & Yuan's bandwidth-optimal allreduce: per rank about ``2 (P-1)/P`` times the packed
vector crosses the wire, independently of ``P`` apart from the width. A partial sum of ``k``
ranks' values is packed at ``bits_for(k * max_value)`` bits, so the width grows by at most
``ceil(log2 P)`` bits over a single rank's (the "bits overflow" of spec 3.3 (b)). Sums are
exact integers, so every rank ends with the same vector whatever the order of additions.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gradzip.comm.transport import Transport, host_bytes
from gradzip.keys import StreamKey
from gradzip.schemes._messages import bits_for, pack_ints, unpack_ints
from gradzip.schemes._slices import slice_bounds


def ring_allreduce_ints(
    transport: Transport,
    values: torch.Tensor,
    max_value: int,
    key: Callable[[int, int], StreamKey],
) -> torch.Tensor:
    """The element-wise sum over ranks of ``values`` (int32, each in ``[0, max_value]``).

    ``key(rank, chunk)`` names each message: reduce-scatter messages carry the sender and the
    slice, allgather messages the slice's owner and ``P + slice`` (they are forwarded as
    received, without repacking).
    """
    size, rank = transport.world_size, transport.rank
    acc = values.to(torch.int32, copy=True)
    if size == 1:
        return acc
    bounds = slice_bounds(acc.numel(), size)
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    for k in range(size - 1):
        send, recv = (rank - k) % size, (rank - k - 1) % size
        bits = bits_for((k + 1) * max_value)
        lo, hi = bounds[send]
        got = transport.exchange_bytes(
            nxt, pack_ints(acc[lo:hi], bits, key(rank, send)), prv, "allreduce"
        )
        lo, hi = bounds[recv]
        acc[lo:hi] += unpack_ints(host_bytes(got), hi - lo, bits, key(prv, recv))
    bits = bits_for(size * max_value)
    owned = (rank + 1) % size  # the slice whose sum this rank completed
    lo, hi = bounds[owned]
    message = pack_ints(acc[lo:hi], bits, key(rank, size + owned))
    for k in range(size - 1):
        message = host_bytes(transport.exchange_bytes(nxt, message, prv, "allreduce"))
        piece = (rank - k) % size
        lo, hi = bounds[piece]
        acc[lo:hi] = unpack_ints(message, hi - lo, bits, key((piece - 1) % size, size + piece))
    return acc
