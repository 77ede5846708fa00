"""Ranks as processes: a transport over a ``torch.distributed`` process group.

This is the only module of gradzip that imports ``torch.distributed`` (besides the test and
benchmark harness :mod:`gradzip.comm.spawn`). A message is an 8-byte header (the length and
the sender's flag bit) followed by the payload bytes, as uint8 tensors, so ranks may send
payloads of different sizes; see :meth:`DistributedTransport._transfer` for how it travels
at the line rate in one round trip when short. The tensors
live on the CPU for gloo (and any CPU-capable backend) and on this process's current CUDA
device for NCCL, which only moves GPU memory; received bytes always come back to the CPU.

Failures: every wait for a peer (each receive, and the completion of each send) is bounded by
the transport's ``timeout``. A peer that died (its connection closes) or stalled (nothing
arrives in time) raises a :class:`~gradzip.errors.GradzipError` that names this rank, the peer,
the operation and the timeout, so no rank hangs on a dead job. After such an error the message
stream is out of step, and every later operation on this transport raises at once.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Sequence
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from gradzip.comm.slots import DEVICE_PAYLOAD_BIT, frame_slot, read_slots, write_slot
from gradzip.comm.transport import (
    FLAG_DOWN_BIT,
    LENGTH_PREFIX_BYTES,
    Payload,
    Send,
    Transport,
    oversize_error,
)
from gradzip.device.host_reads import host_read
from gradzip.device.ops import bytes_tensor, on_device
from gradzip.errors import GradzipError


def _joined_tensor(head_part: np.ndarray, tail: torch.Tensor, has_tail: bool) -> torch.Tensor:
    """A received device payload: the bytes inlined in its head (host memory, gloo only) and
    its tail, as one ``uint8`` tensor on the tail's device."""
    if not head_part.size:
        return tail
    head = bytes_tensor(head_part.tobytes(), tail.device)
    return torch.cat([head, tail]) if has_tail else head


#: payload bytes that travel in a message's first part with gloo [CHOICE]: a scale vector, a
#: flag or a small tensor's payload is one message (one round trip); a longer payload's tail
#: follows once the receiver can post its receive
INLINE_BYTES = 64 * 1024 - LENGTH_PREFIX_BYTES
#: the messages a segmented slot exchange cuts each slot into (see ``segment_from``)
SEGMENT_BYTES = 64 * 1024
#: the tag of a slot exchange's first segment: far from the tag 0 of every other message
SEGMENT_TAG_BASE = 1 << 20

_LOCATION = re.compile(r"^\s*\[[^\]]*\]\s*")  # the C++ source location some errors start with


def _cuda_only(backend: str) -> bool:
    """Whether the group moves CUDA tensors only: "nccl" or "cuda:nccl", but not a group that
    also has a CPU backend ("cpu:gloo,cuda:nccl", what ``init_process_group()`` picks by
    default)."""
    return all(part.split(":")[-1].strip() == "nccl" for part in backend.lower().split(","))


class DistributedTransport(Transport):
    """This process's endpoint in the default (or a given) ``torch.distributed`` group.

    ``timeout`` (seconds, default 60) bounds every wait for a peer: a receive that gets no
    message, or a send that does not complete, within it raises a
    :class:`~gradzip.errors.GradzipError`; a peer whose connection closes raises at once.

    ``ring_gather_from`` (bytes, default None): on gloo, all-gathers of equal slots at least this
    large take gloo's ring all-gather instead of one all-to-all (see the attribute: the ring
    was the faster with eight ranks on a 100 Mbit/s link, not with four or at 1 Gbit/s).

    With the NCCL backend the message tensors are put on
    ``torch.device("cuda", torch.cuda.current_device())``, so select each rank's device
    (``torch.cuda.set_device(local_rank)``) before building the transport, and pass
    ``device_id`` to ``init_process_group`` so that point-to-point traffic uses the group's
    communicator instead of creating one per pair of ranks.
    """

    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        timeout: float = 60.0,
        ring_gather_from: int | None = None,
        segment_from: int | None = None,
    ) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise GradzipError(
                "torch.distributed is not initialised: call dist.init_process_group(...) first "
                "(torchrun sets the environment for init_method='env://')"
            )
        if not (timeout > 0 and math.isfinite(timeout)):
            raise ValueError(f"the timeout must be a positive number of seconds, got {timeout}")
        if ring_gather_from is not None and (
            isinstance(ring_gather_from, bool)
            or not isinstance(ring_gather_from, int)
            or ring_gather_from < 0
        ):
            raise ValueError(
                f"ring_gather_from must be None or a number of bytes >= 0, got {ring_gather_from!r}"
            )
        if segment_from is not None and (
            isinstance(segment_from, bool) or not isinstance(segment_from, int) or segment_from < 1
        ):
            raise ValueError(
                f"segment_from must be None or a number of bytes >= 1, got {segment_from!r}"
            )
        self._group = group
        self.timeout = float(timeout)
        self._wait_for = timedelta(seconds=self.timeout)
        self.backend = str(dist.get_backend(group))
        self.device = (
            torch.device("cuda", torch.cuda.current_device())
            if _cuda_only(self.backend)
            else torch.device("cpu")
        )
        self._broken: str | None = None  # the first failure: later operations refuse to run
        self._stranded: list[torch.Tensor] = []  # buffers of operations a failure abandoned
        #: payload bytes a message's first part carries (NCCL matches sizes exactly: none)
        self.inline_bytes = 0 if _cuda_only(self.backend) else INLINE_BYTES
        #: whether an all-gather of equal slots runs as an all-to-all of this rank's slot to
        #: every rank (the CPU, i.e. gloo) rather than the backend's all-gather (NCCL's).
        #: [CHOICE] gloo's all-gather is a ring of ``P - 1`` rounds, each waiting for the last;
        #: its all-to-all sends every message at once. The bytes are the same (``P - 1`` slots
        #: out and in a rank), the rounds one: on the project's 2-core machine a 57 KB-slot
        #: all-gather took 4.1 ms (1.5 ms of CPU) at P = 4 and 12.6 ms (2.6) at P = 8, the
        #: all-to-all 2.8 (1.0) and 4.7 (1.0) (``benchmarks/gloo_gather_forms.py``).
        #: NCCL keeps its all-gather (bandwidth-optimal rings on the GPUs' links).
        self.gather_as_all_to_all = self.device.type == "cpu"
        #: where :attr:`gather_as_all_to_all` holds, slots of at least this many bytes (the
        #: 8-byte header included) still take the backend's all-gather; None: none do.
        #: [CHOICE] None by default, measured both ways on the emulated cluster
        #: (``gradzip bench cluster --ring-gather-from``; docs/performance.md): gloo's
        #: all-to-all sends to every peer at once, ``P - 1`` TCP flows sharing the rank's link,
        #: and on a rate-limited link they lose packets to each other where the ring's single
        #: flow does not. At P = 8 and 100 Mbit/s mlp-4096's one-chunk integer all-reduce
        #: stepped 1.22x faster with every gather a ring; at P = 8 and 1 Gbit/s the forms were
        #: within the launches' spread, and at P = 4 the ring from 64 KiB on was 1.02-1.12x
        #: slower (its P - 1 rounds wait on ranks that share the cores). The faster form
        #: depends on the link and on P, so it is the user's to set
        self.ring_gather_from = ring_gather_from
        #: on the CPU (gloo), slot exchanges (the all-to-all, and the all-gather where it runs
        #: as one) of slots of at least this many bytes (the 8-byte header included) go as
        #: ``SEGMENT_BYTES`` messages to and from every peer, all posted at once, instead of one
        #: ``all_to_all_single``; None: never. Why: gloo carries one large message each way at
        #: once between two ranks at half the link's rate in most repetitions, the same bytes
        #: in 64 KiB messages at the rate (``benchmarks/gloo_duplex.py``, docs/performance.md).
        #: With 1 MiB, mlp-4096's one-chunk integer all-reduce stepped 1.46x faster at P = 2
        #: and 100 Mbit/s (its sums' slots over 1 MiB), the variants of smaller slots alike.
        #: [CHOICE] None by default: not measured past P = 4, and small slots lose to the one
        #: collective's single message. The bytes and their count are the same.
        self.segment_from = segment_from if self.device.type == "cpu" else None
        super().__init__(dist.get_rank(group), dist.get_world_size(group))

    def _global(self, rank: int) -> int:
        return rank if self._group is None else dist.get_global_rank(self._group, rank)

    # -- the primitive --------------------------------------------------------------------------
    def _transfer(
        self, sends: Sequence[Send], sources: Sequence[int]
    ) -> list[tuple[Payload, bool]]:
        """One message is a head (the 8-byte header word, then up to ``inline_bytes`` of the
        payload) and, for a longer payload, a tail with the rest:

        1. post a receive of a full-size head from every source (gloo accepts a shorter
           message into a larger buffer; the header says how much arrived);
        2. send every head;
        3. wait for the heads; post a receive for each tail announced;
        4. only then send the tails: in an exchange the peer posts its tail receive as soon as
           our head arrives, so a large tail meets a posted receive, which is what keeps gloo
           at the line rate;
        5. wait for the tails, then for every send.

        A payload of at most ``inline_bytes`` is one message and one round trip."""
        self._check_usable()
        keep: list[torch.Tensor] = []  # buffers must outlive their asynchronous operations
        try:
            heads = []
            for src in sources:
                buf = torch.empty(LENGTH_PREFIX_BYTES + self.inline_bytes, dtype=torch.uint8)
                buf = buf.to(self.device)
                keep.append(buf)
                heads.append((src, buf, self._post(dist.irecv, buf, src, "receive")))
            outgoing, tails = [], []
            for dst, data, ok in sends:
                head, tail = self._frame(data, ok)
                keep += [head, tail]
                outgoing.append((dst, self._post(dist.isend, head, dst, "send")))
                if tail.numel():
                    tails.append((dst, tail))
            arrived = [self._tail_of(buf, work, src, keep) for src, buf, work in heads]
            for dst, tail in tails:
                outgoing.append((dst, self._post(dist.isend, tail, dst, "send")))
            out: list[tuple[Payload, bool]] = []
            for src, (head_part, tail_in, work, ok, on_device) in zip(
                sources, arrived, strict=True
            ):
                if work is not None:
                    self._wait(work, src, "receive")
                if on_device:  # a device payload stays a tensor where it arrived
                    out.append((_joined_tensor(head_part, tail_in, work is not None), ok))
                    continue
                if work is None:
                    out.append((head_part.tobytes(), ok))
                    continue
                parts = (head_part.data, tail_in.cpu().numpy().data)
                out.append((b"".join(parts), ok))  # one copy
            for dst, work in outgoing:
                self._wait(work, dst, "send")
        except BaseException as err:
            self._stranded.extend(keep)  # operations may still be posted on these buffers
            if self._broken is None:
                self._broken = f"a transfer was abandoned ({type(err).__name__}: {err})"
            raise
        return out

    # -- one collective of equal-sized slots ----------------------------------------------------
    def _gather_slots(
        self, payload: Payload, ok: bool, expected_size: int, collective: str
    ) -> tuple[list[Payload], list[int]] | None:
        """Every rank's payload in one collective of ``8 + expected_size``-byte slots
        (:mod:`gradzip.comm.slots`), on the group's device (gloo: the CPU, NCCL: this rank's
        GPU): an ``all_to_all_single`` of this rank's slot to every rank where
        :attr:`gather_as_all_to_all` (the CPU), else ``all_gather_into_tensor``
        (``all_gather_single``, its newer name, where torch has it); one host read of the
        ``P`` header words. Counted as ``P - 1`` slots sent and received (see
        :meth:`~gradzip.comm.transport.Transport.all_gather_flagged`).

        A payload larger than its slot still takes part, as a header word alone, so the
        peers raise a corrupt-frame error naming this rank instead of waiting; this rank then
        raises the ValueError naming both sizes."""
        self._check_usable()
        slot_bytes = LENGTH_PREFIX_BYTES + expected_size
        mine = frame_slot(payload, ok, slot_bytes, self.device)
        gathered = torch.empty(self.world_size * slot_bytes, dtype=torch.uint8, device=self.device)
        if self._gathers_as_all_to_all(slot_bytes):
            # this rank's slot to every rank (its own copy is never read): the slots land in
            # rank order, as the all-gather lays them; the send buffer is P slots, as large as
            # the receive buffer
            self._exchange_slots(gathered, mine.repeat(self.world_size), slot_bytes)
        else:
            gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            self._collective(gather, gathered, mine)
        if len(payload) > expected_size:
            raise oversize_error(self.rank, len(payload), expected_size)
        out = read_slots(gathered, self.world_size, self.rank, payload)
        for _ in range(self.world_size - 1):
            self.meter.record(collective, slot_bytes, slot_bytes)
        return out

    def _gathers_as_all_to_all(self, slot_bytes: int) -> bool:
        """Whether an all-gather of ``slot_bytes``-byte slots runs as an all-to-all (see
        :attr:`gather_as_all_to_all` and :attr:`ring_gather_from`)."""
        if not self.gather_as_all_to_all:
            return False
        return self.ring_gather_from is None or slot_bytes < self.ring_gather_from

    def _all_to_all_slots(
        self, messages: Sequence[Payload], expected_size: int, collective: str
    ) -> list[Payload] | None:
        """Every rank's message to this rank in one ``all_to_all_single`` of ``8 +
        expected_size``-byte slots (:mod:`gradzip.comm.slots`; this rank's own slot travels
        empty and is never read), on the group's device; one host read of the ``P`` header
        words. Counted as ``P - 1`` slots sent and received (see
        :meth:`~gradzip.comm.transport.Transport.all_to_all_bytes`).

        A message larger than its slot still takes part, as a header word alone, so the peer
        raises a corrupt-frame error naming this rank instead of waiting; this rank then raises
        the ValueError naming both sizes."""
        self._check_usable()
        size = self.world_size
        slot_bytes = LENGTH_PREFIX_BYTES + expected_size
        outgoing = torch.empty(size * slot_bytes, dtype=torch.uint8, device=self.device)
        for dst, message in enumerate(messages):
            piece = outgoing.narrow(0, dst * slot_bytes, slot_bytes)
            write_slot(piece, b"" if dst == self.rank else message, True)
        incoming = torch.empty(size * slot_bytes, dtype=torch.uint8, device=self.device)
        self._exchange_slots(incoming, outgoing, slot_bytes)
        self._check_messages_fit(messages, expected_size)
        out, _ = read_slots(incoming, size, self.rank, messages[self.rank])
        for _ in range(size - 1):
            self.meter.record(collective, slot_bytes, slot_bytes)
        return out

    def _exchange_slots(self, out: torch.Tensor, inp: torch.Tensor, slot_bytes: int) -> None:
        """Slot ``r`` of ``inp`` to rank ``r``, rank ``r``'s slot for this rank into slot ``r``
        of ``out``: one ``all_to_all_single``, or segmented (see :attr:`segment_from`)."""
        if self.segment_from is None or slot_bytes < self.segment_from:
            self._collective(dist.all_to_all_single, out, inp)
            return
        size, rank = self.world_size, self.rank
        mine = slice(rank * slot_bytes, (rank + 1) * slot_bytes)
        out[mine].copy_(inp[mine])  # as the collective does: the slots read back in rank order
        pieces = [
            (tag, offset, min(SEGMENT_BYTES, slot_bytes - offset))
            for tag, offset in enumerate(range(0, slot_bytes, SEGMENT_BYTES), SEGMENT_TAG_BASE)
        ]
        posted: list[tuple[int, str, dist.Work]] = []
        try:
            # every receive first (from rank - 1, rank - 2, ...), so each segment meets a posted
            # buffer; then every send (to rank + 1, rank + 2, ...)
            for op, operation, buffer, direction in (
                (dist.irecv, "receive", out, -1),
                (dist.isend, "send", inp, 1),
            ):
                for step in range(1, size):
                    peer = (rank + direction * step) % size
                    for tag, offset, length in pieces:
                        piece = buffer.narrow(0, peer * slot_bytes + offset, length)
                        posted.append(
                            (peer, operation, self._post(op, piece, peer, operation, tag))
                        )
            for peer, operation, work in posted:
                self._wait(work, peer, operation)
        except BaseException:
            self._stranded += [inp, out]  # operations may still be posted on these buffers
            raise

    def _collective(
        self, op: Callable[..., dist.Work | None], out: torch.Tensor, inp: torch.Tensor
    ) -> None:
        """Run the equal-slot collective ``op(out, inp)`` and wait for it at most ``timeout``
        seconds. Every peer sends to and receives from it, so a failure names the next rank;
        the buffers of an abandoned collective are kept alive (it may still write them)."""
        peer = (self.rank + 1) % self.world_size
        try:
            work = op(out, inp, group=self._group, async_op=True)
        except RuntimeError as err:
            raise self._failed(peer, "receive", err) from err
        assert work is not None  # async_op=True returns its work
        try:
            self._wait(work, peer, "receive")
        except BaseException:
            self._stranded += [inp, out]
            raise

    def _tail_of(
        self, head: torch.Tensor, work: dist.Work, src: int, keep: list[torch.Tensor]
    ) -> tuple[np.ndarray, torch.Tensor, dist.Work | None, bool, bool]:
        """Wait for a head; the payload bytes it holds, the buffer of the tail it announces
        with that tail's posted receive (None without a tail), the sender's flag, and whether
        the payload is a device payload. With NCCL the head is the 8-byte word alone, so that
        word is the only thing read on the host."""
        self._wait(work, src, "receive")
        head_bytes = host_read(head)
        size, ok, on_device = self._parse_header(head_bytes[:LENGTH_PREFIX_BYTES], src)
        inline = min(size, self.inline_bytes)
        try:
            tail = torch.empty(size - inline, dtype=torch.uint8, device=self.device)
        except (RuntimeError, MemoryError) as err:  # a header announcing absurd bytes
            raise GradzipError(
                f"rank {src} announced a message of {size} bytes, which cannot be allocated "
                f"here ({type(err).__name__}); a corrupt header or a peer that is not gradzip's"
            ) from err
        keep.append(tail)
        tail_work = self._post(dist.irecv, tail, src, "receive") if size > inline else None
        head_part = head_bytes[LENGTH_PREFIX_BYTES : LENGTH_PREFIX_BYTES + inline]
        return head_part, tail, tail_work, ok, on_device

    def _frame(self, data: Payload, ok: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The head and the tail (possibly empty) of one message, from one copy of ``data``.
        A device payload is framed where it lives (copied only when the group's device is
        another: a CUDA payload through a gloo group), its header word marked so the receiver
        keeps it a tensor."""
        if isinstance(data, torch.Tensor):
            size = data.numel()
            word = (size if ok else size | FLAG_DOWN_BIT) | DEVICE_PAYLOAD_BIT
            head = bytes_tensor(word.to_bytes(8, "little"), self.device)
            whole = torch.cat([head, on_device(data.reshape(-1), self.device)])
            split = LENGTH_PREFIX_BYTES + min(size, self.inline_bytes)
            return whole.narrow(0, 0, split), whole.narrow(0, split, whole.numel() - split)
        size = len(data)
        frame = np.empty(LENGTH_PREFIX_BYTES + size, dtype=np.uint8)
        word = size if ok else size | FLAG_DOWN_BIT
        frame[:LENGTH_PREFIX_BYTES] = np.frombuffer(word.to_bytes(8, "little"), dtype=np.uint8)
        frame[LENGTH_PREFIX_BYTES:] = np.frombuffer(data, dtype=np.uint8)
        whole = torch.from_numpy(frame).to(self.device)
        split = LENGTH_PREFIX_BYTES + min(size, self.inline_bytes)
        return whole[:split], whole[split:]

    def _parse_header(self, header: np.ndarray, src: int) -> tuple[int, bool, bool]:
        """The payload length, the sender's flag and the device-payload mark of a header word;
        a word with bit 63 set (no header :meth:`_frame` writes: lengths stay below bit 61, the
        device mark, then the flag at bit 62) breaks the transport with a
        :class:`~gradzip.errors.GradzipError` before anything is allocated."""
        word = int.from_bytes(header.tobytes(), "little")
        if word >= 2 * FLAG_DOWN_BIT:
            self._broken = (
                f"rank {src} sent a malformed message header {word:#x}: bit 63 is set (a header "
                "is a length below 2**62 and the flag bit 62)"
            )
            raise GradzipError(f"rank {self.rank}: {self._broken}")
        size = word & ~(FLAG_DOWN_BIT | DEVICE_PAYLOAD_BIT)
        return size, not word & FLAG_DOWN_BIT, bool(word & DEVICE_PAYLOAD_BIT)

    def _post(
        self,
        op: Callable[..., dist.Work | None],
        tensor: torch.Tensor,
        peer: int,
        operation: str,
        tag: int = 0,
    ) -> dist.Work:
        try:
            work = op(tensor, self._global(peer), group=self._group, tag=tag)
        except RuntimeError as err:
            raise self._failed(peer, operation, err) from err
        assert work is not None  # isend and irecv return their work outside coalescing
        return work

    def _wait(self, work: dist.Work, peer: int, operation: str) -> None:
        """Wait for ``work`` at most ``timeout`` seconds; any failure becomes a GradzipError."""
        start = time.monotonic()
        try:
            completed = work.wait(timeout=self._wait_for)
        except RuntimeError as err:
            raise self._failed(peer, operation, err, time.monotonic() - start) from err
        if completed is False:  # some backends report a timeout this way
            raise self._failed(peer, operation, None, time.monotonic() - start)

    def _failed(
        self, peer: int, operation: str, err: BaseException | None, waited: float = 0.0
    ) -> GradzipError:
        detail = _LOCATION.sub("", str(err)) if err is not None else ""
        timed_out = (
            err is None
            or waited >= 0.95 * self.timeout
            or "timed out" in detail.lower()
            or "timeout" in detail.lower()
        )
        if timed_out:
            what = (
                f"no message from rank {peer}"
                if operation == "receive"
                else f"send to rank {peer} not completed"
            )
            message = f"{what} within {self.timeout} s (peer dead or stalled)"
        else:
            where = f"from rank {peer}" if operation == "receive" else f"to rank {peer}"
            message = (
                f"{operation} {where} failed (peer dead or connection lost; "
                f"timeout {self.timeout} s): {detail}"
            )
        self._broken = message
        return GradzipError(f"rank {self.rank}: {message}")

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise GradzipError(
                f"rank {self.rank}: this transport failed earlier and its message stream is out "
                f"of step ({self._broken}); start a new process group"
            )


def init_from_environment(
    world_size: int, backend: str = "gloo", timeout: float = 60.0
) -> DistributedTransport:
    """Join the process group described by ``torchrun``'s environment (env:// rendezvous:
    ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``) and return this rank's
    transport; ``world_size`` must equal ``WORLD_SIZE``; ``timeout``: seconds a rank waits
    for a peer (the process group's and the transport's)."""
    import os

    missing = [
        v for v in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE") if v not in os.environ
    ]
    if missing:
        raise GradzipError(
            f"backend 'env' needs torchrun's environment ({', '.join(missing)} missing): launch "
            "with `torchrun --nproc_per_node=P ...`"
        )
    if int(os.environ["WORLD_SIZE"]) != world_size:
        raise GradzipError(
            f"--workers {world_size} differs from torchrun's WORLD_SIZE {os.environ['WORLD_SIZE']}"
        )
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
    return DistributedTransport(timeout=timeout)
