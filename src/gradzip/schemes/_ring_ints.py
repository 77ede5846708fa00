"""All-reduce of non-negative integer vectors (code sums), bit-packed on the wire.

Reduce-scatter then all-gather of ``P`` slices, as in Patarasuk & Yuan's bandwidth-optimal
ring all-reduce: per rank about ``2 (P-1)/P`` times the packed vector crosses the wire,
independently of ``P`` apart from the width. The reduce-scatter sends each rank's slice ``j``
of its own codes to rank ``j`` at one rank's width ``bits_for(max_value)`` (one all-to-all, or
``P - 1`` pairwise rounds where the transport has no such collective); the completed slices,
packed at ``bits_for(P * max_value)`` bits, travel in one all-gather. The width grows by at most
``ceil(log2 P)`` bits over a single rank's (the "bits overflow" of spec 3.3 (b)). Sums are
exact integers, so every rank ends with the same vector whatever the order of additions, and
whatever the chunks below.

**Chunks in a pipeline.** A long vector is cut into chunks of ``chunk_values`` values, each
summed by its own reduce-scatter and all-gather (the same bytes apart from a header and slot
length per message). One worker thread runs the transfers in the same order on every rank
while the calling thread packs the next chunk, adds the received codes into the current one and
unpacks the previous one's completed slices [CHOICE: as NCCL's chunked rings and
:mod:`gradzip.schemes._pipelined_ring`]: on a limited link the codec's passes overlap the
transfers instead of adding to them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from gradzip.buffers import fresh_array
from gradzip.comm.transport import Payload, Transport, host_bytes
from gradzip.kernels.ring_hops import add_packed_ints, pack_int_sums
from gradzip.keys import StreamKey
from gradzip.schemes._messages import bits_for, frame_ints, ints_message_size, open_ints
from gradzip.schemes._slices import slice_bounds

#: the default number of values per chunk [CHOICE]: 1 Mi values (a quarter MB a rank at 2
#: bits), as the re-quantizing ring's; measured on mlp-4096 at P = 2 it steps 1.40x faster
#: than one chunk at 100 Mbit/s and as fast at 1 Gbit/s (docs/performance.md)
DEFAULT_CHUNK_VALUES = 1 << 20


def ring_allreduce_ints(
    transport: Transport,
    values: torch.Tensor,
    max_value: int,
    key: Callable[[int, int], StreamKey],
    *,
    consume: bool = False,
    chunk_values: int | None = None,
) -> torch.Tensor:
    """The element-wise sum over ranks of ``values`` (int32, each in ``[0, max_value]``).
    ``consume``: ``values`` is the caller's to give away (e.g. a fresh concatenation) and, when
    already a contiguous int32 vector, holds the sums on return instead of a copy.

    ``chunk_values``: None sums the vector as one chunk; else it is cut into ``C = ceil(n /
    chunk_values)`` chunks, each summed by its own reduce-scatter and all-gather, in a
    pipeline when ``C > 1`` (see the module docstring).
    ``key(rank, number)`` names each message: chunk ``c``'s reduce-scatter messages carry the
    sender and ``2 P c + j`` (its slice ``j``), its all-gather messages the rank that completed
    the slice (rank ``j`` completes slice ``j`` of every chunk) and ``2 P c + P + j`` (every
    rank receives each of them as its sender packed it: forwarded unchanged by a ring
    transport, or all in one collective of equal slots where the transport has one). With one
    chunk the numbers are ``j`` and ``P + j``.
    """
    check_chunk_values(chunk_values)
    in_place = (
        consume and values.dtype == torch.int32 and values.dim() == 1 and values.is_contiguous()
    )
    acc = values if in_place else summable([values])
    if transport.world_size == 1:
        return acc
    count = 1 if chunk_values is None else max(1, -(-acc.numel() // chunk_values))
    chunks = [
        _ChunkSum(transport, acc, max_value, key, number, lo, hi)
        for number, (lo, hi) in enumerate(slice_bounds(acc.numel(), count))
    ]
    if count == 1:
        (chunk,) = chunks
        chunk.land(chunk.completed(chunk.scatter()())())
    else:
        _pipeline(chunks)
    return acc


def check_chunk_values(chunk_values: int | None, name: str = "chunk_values") -> None:
    """``ValueError`` unless ``chunk_values`` is None or a positive int."""
    if chunk_values is not None and (
        isinstance(chunk_values, bool) or not isinstance(chunk_values, int) or chunk_values < 1
    ):
        raise ValueError(f"{name} must be a positive int or None, got {chunk_values!r}")


class _ChunkSum:
    """Chunk ``number`` (``acc[lo:hi]``) of a summed vector: its ``P`` slices, the reduce-scatter
    that completes this rank's slice and the all-gather that brings the others'."""

    def __init__(
        self,
        transport: Transport,
        acc: torch.Tensor,
        max_value: int,
        key: Callable[[int, int], StreamKey],
        number: int,
        lo: int,
        hi: int,
    ) -> None:
        size = transport.world_size
        self.transport, self.acc, self.size, self.rank = transport, acc, size, transport.rank
        self.bounds = [(lo + a, lo + b) for a, b in slice_bounds(hi - lo, size)]
        self.key, self.base = key, 2 * size * number
        self.width = bits_for(max_value)
        self.bits = bits_for(size * max_value)

    def scatter(self) -> Callable[[], list[Payload]]:
        """This rank's slice ``j`` of its own codes for rank ``j``, packed now; the transfer
        that sends them (to run where the transfers run).

        [CHOICE] the reduce-scatter as ONE all-to-all where the transport has one (gloo, NCCL),
        not P - 1 ring rounds each through Python and a thread hand-off: every rank sends
        slice j of its own codes to rank j, at the width of one rank's codes, and adds the
        P - 1 slices it receives into its own. The same bytes as the ring's first round per
        message, fewer than its later rounds (a partial sum of k ranks needs more bits), and
        one round of latency instead of P - 1."""
        rank, acc = self.rank, self.acc
        messages: list[Payload] = [
            b"" if j == rank else _message(acc[lo:hi], self.width, self._scatter_key(rank, j))
            for j, (lo, hi) in enumerate(self.bounds)
        ]
        slot = self._largest(self.width, self._scatter_key)
        return lambda: self.transport.all_to_all_bytes(messages, "allreduce", expected_size=slot)

    def completed(self, received: Sequence[Payload]) -> Callable[[], list[Payload]]:
        """The other ranks' codes of this rank's slice added into it, the sum packed; the
        all-gather that sends it.

        [CHOICE] the all-gather as ONE collective of equal slots where the transport has one
        (gloo: an all-to-all of the slot to every rank; NCCL: its all-gather), not P - 1
        rounds each through Python and a thread hand-off: on two shared cores each such round
        cost milliseconds of a ResNet-20 step.
        The slot is the largest completed slice's message, which every rank computes alike
        from n, P and the keys; the ring of the in-process transport sends the same messages."""
        rank = self.rank
        lo, hi = self.bounds[rank]
        for src, got in enumerate(received):
            if src != rank:
                # unpacked straight into the sums (the checks of unpack_ints, no temporary)
                body = open_ints(host_bytes(got), hi - lo, self.width, self._scatter_key(src, rank))
                add_packed_ints(self.acc[lo:hi], body, self.width, replace=False)
        message = _message(self.acc[lo:hi], self.bits, self._gather_key(rank, rank))
        slot = self._largest(self.bits, self._gather_key)
        return lambda: self.transport.all_gather_bytes(message, "allreduce", expected_size=slot)

    def land(self, gathered: Sequence[Payload]) -> None:
        """The other ranks' completed slices unpacked into their places."""
        for owner, got in enumerate(gathered):
            if owner != self.rank:
                lo, hi = self.bounds[owner]
                body = open_ints(
                    host_bytes(got), hi - lo, self.bits, self._gather_key(owner, owner)
                )
                add_packed_ints(self.acc[lo:hi], body, self.bits, replace=True)

    def _scatter_key(self, sender: int, j: int) -> StreamKey:
        """A reduce-scatter message: its sender and slice."""
        return self.key(sender, self.base + j)

    def _gather_key(self, sender: int, j: int) -> StreamKey:
        """An all-gather message: its sender (slice ``j``'s owner, ``j`` itself) and ``P + j``."""
        return self.key(sender, self.base + self.size + j)

    def _largest(self, bits: int, key_of: Callable[[int, int], StreamKey]) -> int:
        """The largest message any rank sends of any slice at ``bits`` bits, slice ``j`` keyed
        ``key_of(sender, j)``: the slot every rank computes alike from ``n``, ``P`` and the
        keys. Keyed by the last rank for every slice: a key's rank varint is a byte longer from
        rank 128 on, and no larger rank has a shorter one."""
        last = self.size - 1
        return max(
            ints_message_size(hi - lo, bits, key_of(last, j))
            for j, (lo, hi) in enumerate(self.bounds)
        )


def _pipeline(chunks: list[_ChunkSum]) -> None:
    """Every chunk's reduce-scatter and all-gather, the transfers on one worker thread in the
    order RS 0, RS 1, AG 0, RS 2, AG 1, ..., AG C-1 (alike on every rank, so the collectives
    pair up), while this thread packs chunk ``c + 1``, completes chunk ``c`` and unpacks chunk
    ``c - 1``: the link does not wait for the codec, nor the codec for the link."""
    # [CHOICE] one worker thread runs every transfer in order; the calling thread never
    # touches the transport meanwhile, so transports need no thread safety beyond their own
    worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gradzip-sum")
    succeeded = False
    try:
        scattered = worker.submit(chunks[0].scatter())
        gathered: Future[list[Payload]] | None = None
        for number, chunk in enumerate(chunks):
            following = (
                worker.submit(chunks[number + 1].scatter()) if number + 1 < len(chunks) else None
            )
            completing = worker.submit(chunk.completed(scattered.result()))
            if gathered is not None:
                chunks[number - 1].land(gathered.result())
            gathered = completing
            if following is not None:
                scattered = following
        assert gathered is not None
        chunks[-1].land(gathered.result())
        succeeded = True
    finally:
        # on an error the queued transfers are dropped (their peers fail on the transport's
        # timeout, as with one chunk); no thread is left behind on success
        worker.shutdown(wait=succeeded, cancel_futures=True)


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
