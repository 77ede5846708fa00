"""Chunked, pipelined ring allreduce of code sums kept at one code's width on every hop.

Reduce-scatter then allgather around the ring ``r -> r + 1`` (Patarasuk & Yuan 2009), as in
:mod:`gradzip.schemes._ring_ints`, with two differences:

* **Fixed width.** A message is packed at ``b = bits_for(top)`` bits, the width of one rank's
  code, whatever the number ``m`` of ranks its partial sum covers. While ``m * top`` fits in
  ``b`` bits the sum travels exactly (in practice one rank's codes only: ``b`` is the least
  width holding ``top``, so a sum of two needs one bit more); beyond, it is re-quantized stochastically onto the
  ``L + 1 = 2**b`` levels ``k * m * top / L`` of ``[0, m * top]``: ``q = floor(S * L / (m top)
  + u)``, ``u`` the sender's own uniform, so ``E[q] * m top / L = S`` (unbiased, within the
  ``2**-17`` step of the Philox float grid) and the rounding adds at most ``(m top / L)**2 / 4``
  to the variance of that coordinate's sum [CHOICE: bytes stay at ``2 (P-1)/P`` of one code
  payload instead of growing by ``ceil(log2 P)`` bits, at the price of this variance].
* **Chunks in a pipeline.** Every slice is cut into ``C`` chunks; the transfers run in order
  on one worker thread while the calling thread decodes the chunk that arrived and encodes the
  next one, so the link does not wait for the codec (the codec work on chunk ``c + 1`` overlaps
  the transfer of chunk ``c``). Each rank issues the same transfers in the same order as the
  unpipelined ring (round by round, chunk by chunk), each an exchange with both ring
  neighbours, so the ring stays deadlock free; only one thread ever uses the transport while
  the ring runs, and the byte meter counts every message as the blocking ring would.

Sums are float32 (exact integers up to ``2**24``; re-quantized values are ``q * (m top / L)``
computed with the same float32 operations on every rank), so every rank ends with the same
bits: a re-quantized slice is decoded by its owner from the very message it forwards.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from gradzip.buffers import fresh_array
from gradzip.comm.transport import Payload, Transport, host_bytes
from gradzip.kernels.grid_sums import add_scaled, requantize
from gradzip.kernels.ring_hops import add_packed, encode_packed
from gradzip.keys import StreamKey
from gradzip.rng import derive_seed, local_uniform
from gradzip.schemes._messages import (
    bits_for,
    frame_ints,
    open_ints,
    pack_floats,
    pack_ints,
    unpack_floats,
    unpack_ints,
)
from gradzip.schemes._slices import slice_bounds

#: the default number of values per chunk [CHOICE]: 1 MiB messages at 8 bits (about 8 ms at
#: 1 Gbit/s), so a 40-byte header costs 4e-5 of the bytes and a pipeline has several stages for
#: any tensor of more than a few million values
DEFAULT_CHUNK_VALUES = 1 << 20
#: codes up to this many bits are exact integers in float32
FLOAT32_EXACT_BITS = 24


@dataclass(frozen=True)
class HopCode:
    """How a partial sum of ``ranks`` ranks' codes (each in ``[0, top]``) travels at ``bits``."""

    top: int
    bits: int
    ranks: int
    #: float32, or float64 for codes wider than float32's exact integers (``lpc`` with large b)
    dtype: torch.dtype = torch.float32

    @property
    def exact(self) -> bool:
        """Whether the sum fits in ``bits`` bits as it is."""
        return bits_for(self.ranks * self.top) <= self.bits

    @property
    def unit(self) -> float:
        """The value of one step of a re-quantized message: ``m top / L``."""
        return self.ranks * self.top / ((1 << self.bits) - 1)

    @property
    def _fused(self) -> bool:
        """Whether the hop runs the fused float32 kernels (:mod:`gradzip.kernels.ring_hops`)."""
        return self.dtype == torch.float32

    def encode(self, sums: torch.Tensor, key: StreamKey) -> Payload:
        """``sums`` (partial sums) as a message, re-quantized when not exact."""
        if self._fused:
            return self._encode_fused(sums.reshape(-1).contiguous(), key, keep=False)
        return self._encode_levels(sums, key)[0]

    def encode_kept(self, acc: torch.Tensor, key: StreamKey) -> Payload:
        """:meth:`encode` of ``acc``, which then holds what every receiver decodes from the
        message (the allgather's start: the owner keeps the very values it sends)."""
        if self._fused and acc.dim() == 1 and acc.is_contiguous():
            return self._encode_fused(acc, key, keep=True)
        message, q = self._encode_levels(acc, key)
        self.add_levels(acc, q, replace=True)
        return message

    def _encode_fused(self, sums: torch.Tensor, key: StreamKey, keep: bool) -> Payload:
        """One pass from float32 sums to the message's packed body (and, with ``keep``, to the
        decoded values written back): the bytes of :meth:`_encode_levels`."""
        levels = (1 << self.bits) - 1
        exact = self.exact
        factor = levels / (self.ranks * self.top)
        seed = 0 if exact else derive_seed(key, domain="local")
        unit = 1.0 if exact else self.unit

        def write(out: np.ndarray) -> None:
            encode_packed(
                sums, self.bits, out, exact=exact, factor=factor, seed=seed, unit=unit, keep=keep
            )

        return frame_ints(sums.numel(), self.bits, key, write)

    def _encode_levels(self, sums: torch.Tensor, key: StreamKey) -> tuple[bytes, torch.Tensor]:
        """The unfused formulation: the integers ``q`` (int32), then :func:`pack_ints`."""
        if self.exact:
            q = sums.to(torch.int32)
            return pack_ints(q, self.bits, key), q
        levels = (1 << self.bits) - 1
        factor = levels / (self.ranks * self.top)
        if self.dtype == torch.float32:
            q = requantize(sums, factor, derive_seed(key, domain="local"), levels)
            return pack_ints(q, self.bits, key), q
        scaled = sums * torch.tensor(factor, dtype=self.dtype)
        q = scaled.add_(local_uniform(key, sums.numel())).floor_().clamp_(0, levels)
        q = q.to(torch.int32)
        return pack_ints(q, self.bits, key), q

    def add_into(self, acc: torch.Tensor, message: Payload, key: StreamKey, replace: bool) -> None:
        """``acc += decode(message)`` (``acc = ...`` when ``replace``); for float32 one pass
        from the packed body into ``acc`` (:func:`~gradzip.kernels.ring_hops.add_packed`),
        after every check :func:`unpack_ints` makes."""
        if self._fused and acc.dim() == 1 and acc.is_contiguous():
            body = open_ints(_host(message), acc.numel(), self.bits, key)
            add_packed(acc, body, self.bits, 1.0 if self.exact else self.unit, replace)
            return
        q = unpack_ints(host_bytes(message), acc.numel(), self.bits, key)
        self.add_levels(acc, q, replace)

    def add_levels(self, acc: torch.Tensor, q: torch.Tensor, replace: bool) -> None:
        """``acc += q * unit`` (or ``=``; ``unit`` 1 for exact sums), the bits of
        :meth:`decode`."""
        if self.dtype == torch.float32 and acc.is_contiguous():
            add_scaled(acc, q, 1.0 if self.exact else self.unit, replace)
            return
        value = q.to(self.dtype)
        if not self.exact:
            value.mul_(torch.tensor(self.unit, dtype=self.dtype))
        if replace:
            acc.copy_(value)
        else:
            acc += value

    def decode(self, message: Payload, n: int, key: StreamKey) -> torch.Tensor:
        """The partial sums (``dtype``) of a message from :meth:`encode`."""
        q = unpack_ints(host_bytes(message), n, self.bits, key).to(self.dtype)
        if self.exact:
            return q
        return q.mul_(torch.tensor(self.unit, dtype=self.dtype))


def _host(message: Payload) -> bytes | memoryview:
    """A message's host bytes without a copy where it already is on the host."""
    if isinstance(message, torch.Tensor):
        return host_bytes(message)
    return memoryview(message)


def pipelined_ring_sum(
    transport: Transport,
    values: torch.Tensor,
    top: int,
    key: Callable[[int, int], StreamKey],
    chunk_values: int = DEFAULT_CHUNK_VALUES,
) -> torch.Tensor:
    """The element-wise sum over ranks of ``values`` (integers in ``[0, top]``) as float32
    (float64 for codes of more than 24 bits),
    the same bits on every rank; exact while no hop re-quantizes (see the module docstring).

    ``key(rank, chunk)`` names each message: a reduce-scatter message of slice ``s``, chunk
    ``c`` carries ``(sender, s * C + c)``, an allgather message ``(owner, (P + s) * C + c)``
    (forwarded as received).
    """
    size, rank = transport.world_size, transport.rank
    bits = bits_for(top)
    dtype = torch.float32 if bits <= FLOAT32_EXACT_BITS else torch.float64
    # recycled [CHOICE]: a fresh accumulator of tens of MB costs page faults on every step
    # (gradzip.buffers); the values' conversion is .to(dtype)'s
    acc = torch.from_numpy(
        fresh_array(values.numel(), np.float32 if bits <= FLOAT32_EXACT_BITS else np.float64)
    )
    acc.copy_(values.reshape(-1))
    if size == 1:
        return acc
    slices = slice_bounds(acc.numel(), size)
    longest = max(hi - lo for lo, hi in slices)
    count = max(1, -(-longest // max(1, chunk_values)))
    chunks = [[(lo + a, lo + b) for a, b in slice_bounds(hi - lo, count)] for lo, hi in slices]
    nxt, prv = (rank + 1) % size, (rank - 1) % size

    def rs_send(k: int) -> int:  # the slice this rank sends in reduce-scatter round k
        return (rank - k) % size

    # [CHOICE] one worker thread runs every transfer in order; the calling thread never touches
    # the transport meanwhile, so transports need no thread safety beyond their own
    worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gradzip-ring")
    inflight: deque[tuple[str, int, int, Future[Payload]]] = deque()

    def submit(phase: str, k: int, c: int, message: Payload) -> None:
        collective = "reduce_scatter" if phase == "rs" else "allgather"
        future = worker.submit(transport.exchange_bytes, nxt, message, prv, collective)
        inflight.append((phase, k, c, future))

    def land() -> None:
        """Wait for the oldest transfer and use what it brought."""
        phase, k, c, future = inflight.popleft()
        got = future.result()
        if phase == "rs":
            piece = (rank - k - 1) % size
            lo, hi = chunks[piece][c]
            code = HopCode(top, bits, k + 1, dtype)
            code.add_into(acc[lo:hi], got, key(prv, piece * count + c), replace=False)
            if k + 1 < size - 1:
                lo, hi = chunks[rs_send(k + 1)][c]
                code = HopCode(top, bits, k + 2, dtype)
                submit(
                    "rs", k + 1, c, code.encode(acc[lo:hi], key(rank, rs_send(k + 1) * count + c))
                )
            else:  # this chunk of the owned slice is complete: its allgather starts
                owned = (rank + 1) % size
                lo, hi = chunks[owned][c]
                code = HopCode(top, bits, size, dtype)
                # the owner keeps what every other rank will decode from this message (from the
                # very integers it packed, in the same pass: no unpack of its own message)
                message = code.encode_kept(acc[lo:hi], key(rank, (size + owned) * count + c))
                submit("ag", 0, c, message)
        else:
            piece = (rank - k) % size
            lo, hi = chunks[piece][c]
            owner = (piece - 1) % size
            HopCode(top, bits, size, dtype).add_into(
                acc[lo:hi], got, key(owner, (size + piece) * count + c), replace=True
            )
            if k + 1 < size - 1:
                submit("ag", k + 1, c, got)  # forwarded as received

    try:
        for c in range(count):
            lo, hi = chunks[rs_send(0)][c]
            submit(
                "rs",
                0,
                c,
                HopCode(top, bits, 1, dtype).encode(acc[lo:hi], key(rank, rs_send(0) * count + c)),
            )
        while inflight:
            land()
    finally:
        # on an error the pending transfers are dropped (their peers fail on the transport's
        # timeout, as with the blocking ring); no thread is left behind on success
        worker.shutdown(wait=not inflight, cancel_futures=True)
    return acc


def ring_max_floats(
    transport: Transport, values: torch.Tensor, key: Callable[[int, int], StreamKey]
) -> torch.Tensor:
    """The element-wise maximum over ranks of the float32 vector ``values``, by a ring
    (reduce-scatter, then allgather): ``2 (P-1)/P`` of the vector per rank instead of an
    all-gather's ``P - 1`` vectors (the scales of a bucketed 2-bit code would otherwise cost
    ``(P-1) * 32 / bucket`` bits a value). A maximum is exact and order free, so every rank
    gets the same bits. ``key(rank, slice)`` names the messages (``slice`` in ``[0, 2P)``:
    ``P + s`` for the allgather)."""
    size, rank = transport.world_size, transport.rank
    acc = values.to(torch.float32, copy=True).reshape(-1)
    if size == 1:
        return acc
    slices = slice_bounds(acc.numel(), size)
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    for k in range(size - 1):
        send, recv = (rank - k) % size, (rank - k - 1) % size
        lo, hi = slices[send]
        got = transport.exchange_bytes(nxt, pack_floats(acc[lo:hi], key(rank, send)), prv, "scales")
        lo, hi = slices[recv]
        torch.maximum(
            acc[lo:hi], unpack_floats(host_bytes(got), hi - lo, key(prv, recv)), out=acc[lo:hi]
        )
    owned = (rank + 1) % size
    lo, hi = slices[owned]
    message: Payload = pack_floats(acc[lo:hi], key(rank, size + owned))
    for k in range(size - 1):
        message = transport.exchange_bytes(nxt, message, prv, "scales")
        piece = (rank - k) % size
        lo, hi = slices[piece]
        acc[lo:hi] = unpack_floats(
            host_bytes(message), hi - lo, key((piece - 1) % size, size + piece)
        )
    return acc
