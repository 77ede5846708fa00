"""One bucket handed from DDP's hook call (main thread) to the worker thread."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from gradzip.comm.transport import Payload
from gradzip.integrations._layout import BucketLayout, Unit
from gradzip.schemes.base import Outgoing


@dataclass
class BucketJob:
    """A bucket to reduce: its position in this backward pass, whether it is the last one, its
    flat buffer (averaged in place), its layout (``None`` when the main thread refused the
    bucket, with ``error`` saying why), the future DDP waits on, and the intra-op thread count
    of the main thread (the stages use the same, so results cannot depend on it; their numba
    kernels take ``kernel_threads``)."""

    position: int
    last: bool
    buffer: torch.Tensor
    layout: BucketLayout | None
    future: torch.futures.Future[torch.Tensor]
    threads: int
    error: BaseException | None = None
    #: the threads the stages' numba kernels take: the main thread's
    #: :func:`~gradzip.kernels._threads.kernel_thread_count` (None: numba's own setting)
    kernel_threads: int | None = None
    #: the CUDA stream DDP's backward ran on when it handed the bucket over (None off CUDA):
    #: every stage runs the bucket's work on it (:mod:`gradzip.integrations._streams`)
    stream: Any = None
    #: the error of this bucket's reduction (in whichever stage it happened)
    outcome: BaseException | None = None
    #: whether the encode stage has handed on the bucket's last piece
    sealed: bool = False
    #: set once the encode stage is done with the bucket (its residuals stored, or its failure
    #: in ``outcome``): the last piece may travel before, but its job may not end before
    encoded: threading.Event = field(default_factory=threading.Event)
    #: set once the job has run through every stage; ``failure`` is then the step's error, if any
    done: threading.Event = field(default_factory=threading.Event)
    failure: BaseException | None = None
    #: what the future completes with: the bucket's buffer, or the mean where the worker did not
    #: copy it into the buffer (same dtype and device: DDP copies the result into the gradients)
    result: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.result = self.buffer


@dataclass
class BucketPart:
    """What travels from stage to stage: one part ``[lo, hi)`` of a bucket's buffer (the
    pipelined all-gather sends a bucket as messages numbered ``chunk``, each the payloads of
    ``units``), or the whole bucket (``chunk`` None: a scheme reduced in one piece, or a bucket
    that is not communicated).

    ``last``: the bucket's last piece (its job is done once it leaves the decode stage).
    ``error``: why this piece is not to be communicated, decided by the encode stage before the
    piece is handed on (so the transfer stage never depends on a later stage's progress)."""

    job: BucketJob
    chunk: int | None
    lo: int
    hi: int
    last: bool
    error: BaseException | None = None
    #: the parameter-aligned units whose payloads the message holds (pipelined only)
    units: tuple[Unit, ...] = ()
    #: this rank's message (encode stage: its units' payloads joined, its flag, and one
    #: :class:`Outgoing` per unit), then every rank's message (transfer stage; None when
    #: nothing is to be decoded)
    outgoing: Outgoing | None = None
    unit_outgoing: tuple[Outgoing, ...] = ()
    #: the most bytes any rank's message holds, the same on every rank (device payloads of a
    #: size the shapes fix), so the message travels in one collective of equal slots; None:
    #: the ring (see :meth:`~gradzip.comm.transport.Transport.all_gather_flagged`)
    expected_size: int | None = None
    payloads: list[Payload] | None = None  # bytes, or device payloads (uint8 tensors)
