"""Several device payloads in one message (the DDP hook's buckets of small tensors): the
device twin of :mod:`gradzip.payload_batch`, the same bytes.

Joining is a concatenation on the device. Splitting needs each payload's total length (bytes
4-11 of its header): [CHOICE] the lengths are read on the host, one 12-byte read per payload
(the receiver knows how many payloads to expect, not their sizes), and every piece is then
validated in full by its decoder on the device (magic, version, CRC, key), as host pieces are.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gradzip.device.host_reads import host_read
from gradzip.errors import CorruptPayloadError, TruncatedPayloadError
from gradzip.payload import CRC_BYTES, MAGIC

_LENGTH_AT, _LENGTH_END = 4, 12


def join_device_payloads(payloads: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The message holding ``payloads`` back to back (no bytes of its own), on ``device``."""
    if not payloads:
        return torch.empty(0, dtype=torch.uint8, device=device)
    return torch.cat([p.reshape(-1) for p in payloads])


def split_device_payloads(message: torch.Tensor, numels: Sequence[int]) -> list[torch.Tensor]:
    """The payloads of a :func:`join_device_payloads` message of tensors of ``numels`` elements,
    as views; raises a :class:`~gradzip.errors.PayloadError` naming the problem when the
    message does not hold exactly that many payloads."""
    pieces, pos, size = [], 0, message.numel()
    for number, numel in enumerate(numels):
        if numel == 0:
            pieces.append(message.narrow(0, pos, 0))
            continue
        if size - pos < _LENGTH_END:
            raise TruncatedPayloadError(
                f"message of {size} bytes ends at payload {number} of {len(numels)} (byte {pos})"
            )
        head = host_read(message.narrow(0, pos, _LENGTH_END)).tobytes()
        if head[: len(MAGIC)] != MAGIC:
            raise CorruptPayloadError(
                f"payload {number} of {len(numels)} in a message does not start with the "
                f"gradzip magic bytes (byte {pos})"
            )
        total = int.from_bytes(head[_LENGTH_AT:_LENGTH_END], "little")
        if total < _LENGTH_END + CRC_BYTES:
            raise CorruptPayloadError(
                f"payload {number} of {len(numels)} in a message declares {total} bytes, fewer "
                "than a header"
            )
        if total > size - pos:
            raise TruncatedPayloadError(
                f"payload {number} of {len(numels)} in a message declares {total} bytes; "
                f"{size - pos} remain"
            )
        pieces.append(message.narrow(0, pos, total))
        pos += total
    if pos != size:
        raise CorruptPayloadError(
            f"message holds {size - pos} bytes beyond its {len(numels)} payloads"
        )
    return pieces
