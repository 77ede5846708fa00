"""Ring allreduce of non-negative integer vectors (code sums), bit-packed on the wire.

Reduce-scatter then allgather around the ring ``r -> r + 1`` (P - 1 rounds each), as in
Patarasuk & Yuan's bandwidth-optimal allreduce: per rank about ``2 (P-1)/P`` times the packed
vector crosses the wire, independently of ``P`` apart from the width. A partial sum of ``k``
ranks' values is packed at ``bits_for(k * max_value)`` bits, so the width grows by at most
``ceil(log2 P)`` bits over a single rank's (the "bits overflow" of spec 3.3 (b)). Sums are
exact integers, so every rank ends with the same vector whatever the order of additions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from gradzip.buffers import fresh_array
from gradzip.comm.transport import Payload, Transport, host_bytes
from gradzip.kernels.ring_hops import add_packed_ints, pack_int_sums
from gradzip.keys import StreamKey
from gradzip.schemes._messages import bits_for, frame_ints, ints_message_size, open_ints
from gradzip.schemes._slices import slice_bounds


def ring_allreduce_ints(
    transport: Transport,
    values: torch.Tensor,
    max_value: int,
    key: Callable[[int, int], StreamKey],
    *,
    consume: bool = False,
) -> torch.Tensor:
    """The element-wise sum over ranks of ``values`` (int32, each in ``[0, max_value]``).
    ``consume``: ``values`` is the caller's to give away (e.g. a fresh concatenation) and, when
    already a contiguous int32 vector, holds the sums on return instead of a copy.

    ``key(rank, chunk)`` names each message: reduce-scatter messages carry the sender and the
    slice, allgather messages the rank that completed the slice and ``P + slice`` (every rank
    receives each of them as its sender packed it: forwarded unchanged by a ring transport, or
    all in one collective of equal slots where the transport has one).
    """
    size, rank = transport.world_size, transport.rank
    in_place = (
        consume and values.dtype == torch.int32 and values.dim() == 1 and values.is_contiguous()
    )
    acc = values if in_place else summable([values])
    if size == 1:
        return acc
    bounds = slice_bounds(acc.numel(), size)
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    for k in range(size - 1):
        send, recv = (rank - k) % size, (rank - k - 1) % size
        bits = bits_for((k + 1) * max_value)
        lo, hi = bounds[send]
        got = transport.exchange_bytes(
            nxt, _message(acc[lo:hi], bits, key(rank, send)), prv, "allreduce"
        )
        lo, hi = bounds[recv]
        # unpacked straight into the sums (the checks of unpack_ints, no int32 temporary)
        body = open_ints(host_bytes(got), hi - lo, bits, key(prv, recv))
        add_packed_ints(acc[lo:hi], body, bits, replace=False)
    bits = bits_for(size * max_value)
    owned = (rank + 1) % size  # the slice whose sum this rank completed
    lo, hi = bounds[owned]
    message = _message(acc[lo:hi], bits, key(rank, size + owned))
    # [CHOICE] the all-gather half as ONE collective of equal slots where the transport has
    # one (gloo, NCCL: a ring in C++), not P - 1 rounds each through Python and a thread
    # hand-off: on two shared cores each such round cost milliseconds of a ResNet-20 step.
    # The slot is the largest completed slice's message, which every rank computes alike
    # from n, P and the keys; the ring of the in-process transport sends the same messages.
    slot = max(
        ints_message_size(b - a, bits, key(owner, size + (owner + 1) % size))
        for owner, (a, b) in ((r, bounds[(r + 1) % size]) for r in range(size))
    )
    gathered = transport.all_gather_bytes(message, "allreduce", expected_size=slot)
    for owner, received in enumerate(gathered):
        if owner == rank:
            continue
        piece = (owner + 1) % size
        lo, hi = bounds[piece]
        body = open_ints(host_bytes(received), hi - lo, bits, key(owner, size + piece))
        add_packed_ints(acc[lo:hi], body, bits, replace=True)
    return acc


def summable(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """``parts`` (integers of any dtype) flattened and concatenated into a recycled int32 vector
    (:func:`~gradzip.buffers.fresh_array`) for :func:`ring_allreduce_ints` to sum into: one
    conversion pass [CHOICE: a fresh vector of tens of MB a step costs more in page faults,
    with several ranks on a core, than the pass itself]."""
    total = sum(part.numel() for part in parts)
    acc = torch.from_numpy(fresh_array(total, np.int32))
    start = 0
    for part in parts:
        acc[start : start + part.numel()].copy_(part.reshape(-1))
        start += part.numel()
    return acc


def _message(values: torch.Tensor, bits: int, key: StreamKey) -> Payload:
    """The :func:`~gradzip.schemes._messages.pack_ints` message of ``values`` (a contiguous
    int32 slice), packed by a numba kernel straight into the payload (the same bytes)."""
    return frame_ints(values.numel(), bits, key, lambda out: pack_int_sums(values, bits, out))
