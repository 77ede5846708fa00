"""Ranks as processes: a transport over a ``torch.distributed`` process group.

This is the only module of gradzip that imports ``torch.distributed``. Payload bytes travel as
uint8 CPU tensors (gloo); a message is an int64 length followed by the bytes, so ranks may send
payloads of different sizes. Peer failures surface as a :class:`~gradzip.errors.GradzipError`
once the process group's timeout expires (set it in ``init_process_group(timeout=...)``).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from gradzip.comm.transport import Transport
from gradzip.errors import GradzipError


class _PairedSend:
    """The two sends of one message (length, then bytes); ``wait`` completes both."""

    def __init__(self, works: list[dist.Work], keep: list[torch.Tensor]) -> None:
        self._works = works
        self._keep = keep  # the buffers must outlive the asynchronous sends

    def wait(self) -> None:
        try:
            for work in self._works:
                work.wait()
        except RuntimeError as err:
            raise GradzipError(f"sending a payload failed (peer gone or timed out): {err}") from err


class DistributedTransport(Transport):
    """This process's endpoint in the default (or a given) ``torch.distributed`` group."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise GradzipError(
                "torch.distributed is not initialised: call dist.init_process_group(...) first "
                "(torchrun sets the environment for init_method='env://')"
            )
        self._group = group
        super().__init__(dist.get_rank(group), dist.get_world_size(group))

    def _global(self, rank: int) -> int:
        return rank if self._group is None else dist.get_global_rank(self._group, rank)

    def _start_send(self, dst: int, data: bytes) -> _PairedSend:
        length = torch.tensor([len(data)], dtype=torch.int64)
        body = torch.from_numpy(np.frombuffer(data, dtype=np.uint8).copy())
        peer = self._global(dst)
        works = [dist.isend(length, peer, group=self._group)]
        if len(data):
            works.append(dist.isend(body, peer, group=self._group))
        return _PairedSend([w for w in works if w is not None], [length, body])

    def _recv(self, src: int) -> bytes:
        peer = self._global(src)
        length = torch.empty(1, dtype=torch.int64)
        try:
            dist.recv(length, peer, group=self._group)
            size = int(length[0])
            if size < 0:
                raise GradzipError(f"rank {src} announced a message of {size} bytes")
            body = torch.empty(size, dtype=torch.uint8)
            if size:
                dist.recv(body, peer, group=self._group)
        except RuntimeError as err:
            raise GradzipError(
                f"rank {self.rank}: receiving from rank {src} failed (peer gone or timed out): {err}"
            ) from err
        return body.numpy().tobytes()
