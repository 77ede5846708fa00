"""One message of a bucket's payloads, joined and split where the payloads live.

The pipelined all-gather sends a message's units as one payload string. A device-resident
codec's payloads are ``uint8`` tensors on the gradient's device
(:mod:`gradzip.device`): they are joined and split on the device
(:mod:`gradzip.device.batch`, the same bytes as :mod:`gradzip.payload_batch`), so the bucket's
bytes never cross to the host in the hook. Host payloads (bytes) keep the host path exactly.

[CHOICE] Splitting a device message reads each payload's 12-byte length prefix on the host:
one :func:`~gradzip.device.host_reads.host_read` per payload per rank, never the body. The
receiver knows how many payloads a message holds, not their sizes (a lossy codec's body size
may depend on the values), and adding a length table to the message would change the wire.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gradzip.device.batch import join_device_payloads, split_device_payloads
from gradzip.payload_batch import join_payloads, split_payloads

#: a payload as a scheme hands it over: host bytes, or a device payload (``uint8`` tensor)
AnyPayload = bytes | bytearray | memoryview | torch.Tensor


def joined(payloads: Sequence[AnyPayload], device: torch.device) -> AnyPayload:
    """One message of ``payloads``: device payloads joined on ``device``, host bytes on the
    host (a bucket's units all take the same path: one compressor, one device)."""
    tensors = [p for p in payloads if isinstance(p, torch.Tensor)]
    if tensors:
        # an empty tensor's payload is empty host bytes on either path: it adds nothing
        if any(not isinstance(p, torch.Tensor) and len(p) for p in payloads):
            raise TypeError("a message mixes device payloads and host bytes")
        return join_device_payloads(tensors, device)
    return join_payloads([p for p in payloads if not isinstance(p, torch.Tensor)])


def split(message: AnyPayload, numels: Sequence[int]) -> Sequence[AnyPayload]:
    """The payloads of one rank's message (:func:`joined`), as views of it."""
    if isinstance(message, torch.Tensor):
        return split_device_payloads(message, numels)
    return split_payloads(message, numels)
