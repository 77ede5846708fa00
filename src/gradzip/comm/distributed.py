"""Ranks as processes: a transport over a ``torch.distributed`` process group.

This is the only module of gradzip that imports ``torch.distributed`` (besides the test and
benchmark harness :mod:`gradzip.comm.spawn`). A message is an int64 length followed by the
payload bytes as a uint8 tensor, so ranks may send payloads of different sizes. The tensors
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
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from gradzip.comm.transport import Transport
from gradzip.errors import GradzipError

_LOCATION = re.compile(r"^\s*\[[^\]]*\]\s*")  # the C++ source location some errors start with


def _cuda_only(backend: str) -> bool:
    """Whether the group moves CUDA tensors only: "nccl" or "cuda:nccl", but not a group that
    also has a CPU backend ("cpu:gloo,cuda:nccl", what ``init_process_group()`` picks by
    default)."""
    return all(part.split(":")[-1].strip() == "nccl" for part in backend.lower().split(","))


class _PairedSend:
    """The two sends of one message (length, then bytes); ``wait`` completes both."""

    def __init__(
        self,
        transport: DistributedTransport,
        dst: int,
        works: list[dist.Work],
        keep: list[torch.Tensor],
    ) -> None:
        self._transport = transport
        self._dst = dst
        self._works = works
        self._keep = keep  # the buffers must outlive the asynchronous sends

    def wait(self) -> None:
        for work in self._works:
            self._transport._wait(work, self._dst, "send")


class DistributedTransport(Transport):
    """This process's endpoint in the default (or a given) ``torch.distributed`` group.

    ``timeout`` (seconds, default 60) bounds every wait for a peer: a receive that gets no
    message, or a send that does not complete, within it raises a
    :class:`~gradzip.errors.GradzipError`; a peer whose connection closes raises at once.

    With the NCCL backend the message tensors are put on
    ``torch.device("cuda", torch.cuda.current_device())``, so select each rank's device
    (``torch.cuda.set_device(local_rank)``) before building the transport, and pass
    ``device_id`` to ``init_process_group`` so that point-to-point traffic uses the group's
    communicator instead of creating one per pair of ranks.
    """

    def __init__(self, group: dist.ProcessGroup | None = None, timeout: float = 60.0) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise GradzipError(
                "torch.distributed is not initialised: call dist.init_process_group(...) first "
                "(torchrun sets the environment for init_method='env://')"
            )
        if not (timeout > 0 and math.isfinite(timeout)):
            raise ValueError(f"the timeout must be a positive number of seconds, got {timeout}")
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
        super().__init__(dist.get_rank(group), dist.get_world_size(group))

    def _global(self, rank: int) -> int:
        return rank if self._group is None else dist.get_global_rank(self._group, rank)

    # -- the two primitives ---------------------------------------------------------------------
    def _start_send(self, dst: int, data: bytes) -> _PairedSend:
        self._check_usable()
        length = torch.tensor([len(data)], dtype=torch.int64).to(self.device)
        body = torch.from_numpy(np.frombuffer(data, dtype=np.uint8).copy()).to(self.device)
        peer = self._global(dst)
        try:
            works = [dist.isend(length, peer, group=self._group)]
            if len(data):
                works.append(dist.isend(body, peer, group=self._group))
        except RuntimeError as err:
            raise self._failed(dst, "send", err) from err
        return _PairedSend(self, dst, [w for w in works if w is not None], [length, body])

    def _recv(self, src: int) -> bytes:
        self._check_usable()
        length = torch.empty(1, dtype=torch.int64, device=self.device)
        self._receive_into(length, src)
        size = int(length.cpu()[0])
        if size < 0:
            self._broken = f"rank {src} announced a message of {size} bytes"
            raise GradzipError(f"rank {self.rank}: {self._broken}")
        body = torch.empty(size, dtype=torch.uint8, device=self.device)
        if size:
            self._receive_into(body, src)
        return body.cpu().numpy().tobytes()

    # -- waiting with a deadline ----------------------------------------------------------------
    def _receive_into(self, tensor: torch.Tensor, src: int) -> None:
        try:
            work = dist.irecv(tensor, self._global(src), group=self._group)
        except RuntimeError as err:
            raise self._failed(src, "receive", err) from err
        if work is not None:
            self._wait(work, src, "receive")

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
