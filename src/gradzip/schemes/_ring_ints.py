"""All-reduce of non-negative integer vectors (code sums), bit-packed on the wire.

Reduce-scatter then all-gather of ``P`` slices, as in Patarasuk & Yuan's bandwidth-optimal
ring all-reduce: per rank about ``2 (P-1)/P`` times the packed vector crosses the wire,
independently of ``P`` apart from the width. The reduce-scatter sends each rank's slice ``j``
of its own codes to rank ``j`` at one rank's width ``bits_for(max_value)`` (one all-to-all, or
``P - 1`` pairwise rounds where the transport has no such collective); the completed slices,
packed at ``bits_for(P * max_value)`` bits, travel in one all-gather. The width grows by at most
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
    slice, all-gather messages the rank that completed the slice (rank ``j`` completes slice
    ``j``) and ``P + slice`` (every rank receives each of them as its sender packed it:
    forwarded unchanged by a ring transport, or all in one collective of equal slots where the
    transport has one).
    """
    size, rank = transport.world_size, transport.rank
    in_place = (
        consume and values.dtype == torch.int32 and values.dim() == 1 and values.is_contiguous()
    )
    acc = values if in_place else summable([values])
    if size == 1:
        return acc
    bounds = slice_bounds(acc.numel(), size)
    # [CHOICE] the reduce-scatter as ONE all-to-all where the transport has one (gloo, NCCL),
    # not P - 1 ring rounds each through Python and a thread hand-off: every rank sends slice
    # j of its own codes to rank j, at the width of one rank's codes, and adds the P - 1
    # slices it receives into its own. The same bytes as the ring's first round per message,
    # fewer than its later rounds (a partial sum of k ranks needs more bits), and one round
    # of latency instead of P - 1.
    width = bits_for(max_value)
    messages: list[Payload] = [
        b"" if j == rank else _message(acc[lo:hi], width, key(rank, j))
        for j, (lo, hi) in enumerate(bounds)
    ]
    received = transport.all_to_all_bytes(
        messages, "allreduce", expected_size=_largest(bounds, width, key, size, lambda j: j)
    )
    lo, hi = bounds[rank]
    for src, got in enumerate(received):
        if src != rank:
            # unpacked straight into the sums (the checks of unpack_ints, no int32 temporary)
            body = open_ints(host_bytes(got), hi - lo, width, key(src, rank))
            add_packed_ints(acc[lo:hi], body, width, replace=False)
    bits = bits_for(size * max_value)
    message = _message(acc[lo:hi], bits, key(rank, size + rank))
    # [CHOICE] the all-gather half as ONE collective of equal slots where the transport has
    # one (gloo, NCCL: a ring in C++), not P - 1 rounds each through Python and a thread
    # hand-off: on two shared cores each such round cost milliseconds of a ResNet-20 step.
    # The slot is the largest completed slice's message, which every rank computes alike
    # from n, P and the keys; the ring of the in-process transport sends the same messages.
    slot = _largest(bounds, bits, key, size, lambda owner: size + owner)
    gathered = transport.all_gather_bytes(message, "allreduce", expected_size=slot)
    for owner, got in enumerate(gathered):
        if owner != rank:
            lo, hi = bounds[owner]
            body = open_ints(host_bytes(got), hi - lo, bits, key(owner, size + owner))
            add_packed_ints(acc[lo:hi], body, bits, replace=True)
    return acc


def _largest(
    bounds: list[tuple[int, int]],
    bits: int,
    key: Callable[[int, int], StreamKey],
    size: int,
    chunk_of: Callable[[int], int],
) -> int:
    """The largest message any rank sends of any slice at ``bits`` bits, rank ``r``'s message
    of slice ``j`` keyed ``key(r, chunk_of(j))``: the slot every rank computes alike from
    ``n``, ``P`` and the keys. Keyed by the last rank for every slice: a key's rank varint is a
    byte longer from rank 128 on, and no larger rank has a shorter one."""
    return max(
        ints_message_size(hi - lo, bits, key(size - 1, chunk_of(j)))
        for j, (lo, hi) in enumerate(bounds)
    )


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
