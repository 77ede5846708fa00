"""Scheme (a), the papers' "broadcast": every rank decodes every rank's payload."""

from __future__ import annotations

import torch

from gradzip.comm.transport import Transport
from gradzip.compressors.base import Compressor
from gradzip.keys import StreamKey


class AllGatherDecode:
    """Each rank encodes its tensor, the payloads are all-gathered, and every rank decodes all
    of them and averages in ascending rank order, so every rank holds a bit-identical mean.

    Bytes per rank and step: it sends and receives the other ``P - 1`` payloads (plus an 8-byte
    length each), so traffic grows linearly with ``P`` (spec 3.3 (a): ``M(M-1)(b*d + 32)`` bits
    in all). No re-quantization, no overflow; the decoded mean carries each rank's own
    compression error divided by ``P``.

    Every rank's payload is decoded with the key the receiver expects (run seed, sender rank,
    step, tensor index), so a payload of another step or run raises
    :class:`~gradzip.errors.KeyMismatchError` instead of being averaged in.

    References: spec 3.3 (a) and Alg. 1 of the DQSG paper (server decode and average).
    """

    def __init__(self, compressor: Compressor, run_seed: int = 0) -> None:
        if compressor.needs_side_information:
            raise ValueError(
                f"{compressor.name} needs side information; use the nested scheme for it"
            )
        self.compressor = compressor
        self.run_seed = run_seed

    def key(self, rank: int, step: int, tensor_index: int) -> StreamKey:
        """The key of ``rank``'s payload for ``(step, tensor_index)``."""
        return StreamKey(self.run_seed, rank, step, tensor_index)

    def mean(
        self, transport: Transport, tensor: torch.Tensor, step: int, tensor_index: int = 0
    ) -> torch.Tensor:
        """The average over ranks of the decoded tensors (float32, or float64 for float64)."""
        mine = self.key(transport.rank, step, tensor_index)
        payload = self.compressor.encode(tensor, mine).payload
        return self.exchange(transport, payload, step, tensor_index, tensor.shape, tensor.dtype)

    def exchange(
        self,
        transport: Transport,
        payload: bytes,
        step: int,
        tensor_index: int,
        shape: torch.Size,
        dtype: torch.dtype,
    ) -> torch.Tensor:
        """All-gather this rank's already encoded ``payload`` and average the decoded payloads
        (for callers that encode themselves, e.g. through error feedback)."""
        transport.meter.step = step
        payloads = transport.all_gather_bytes(payload)
        work = torch.float64 if dtype == torch.float64 else torch.float32
        total = torch.zeros(shape, dtype=work)
        for rank, received in enumerate(payloads):
            decoded = self.compressor.decode(
                received,
                expected_key=self.key(rank, step, tensor_index),
                shape=shape,
                dtype=dtype,
            )
            total += decoded.to(work)
        return total.div_(transport.world_size)
