"""Device payloads: framing on the device, reading the header, checking the CRC there.

A device payload is the host payload's bytes in a 1-D ``uint8`` tensor (see
:mod:`gradzip.device`). Framing builds the header on the host, where everything it says
(shape, key, parameters, total length) is known without reading the body, sends it to the
device with the body pieces, and appends the CRC-32 computed there
(:func:`gradzip.device.crc32.crc32_device`): nothing is read back.

A receiver reads the header once (:func:`read_device_header`: one host read of at most
:data:`HEADER_READ_BYTES`, all of the header for any tensor of up to 16 dimensions), makes
every header check of :func:`gradzip.payload.parse_payload` on the host, and checks the CRC on
the device into a flag (:func:`crc_ok`) that the caller reads with its other flags, once.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gradzip.device.crc32 import crc32_bytes_device, crc32_device
from gradzip.device.host_reads import host_read
from gradzip.device.ops import as_bytes, bytes_tensor
from gradzip.errors import TruncatedPayloadError
from gradzip.payload import CRC_BYTES, Header, header_bytes, header_size, read_header

#: the bytes :func:`read_device_header` reads first (a longer header costs a second read)
HEADER_READ_BYTES = 128


def is_device_payload(payload: object) -> bool:
    """Whether ``payload`` is a device payload (a tensor) rather than host bytes."""
    return isinstance(payload, torch.Tensor)


def frame_device_payload(
    header: Header, pieces: Sequence[torch.Tensor], device: torch.device
) -> torch.Tensor:
    """The payload of ``header`` and the body ``pieces`` (tensors of any dtype, their bytes in
    order) as a ``uint8`` tensor on ``device``: byte for byte :func:`gradzip.payload.
    frame_payload`'s, with no read back to the host."""
    body = [as_bytes(p) for p in pieces]
    total = header_size(header) + sum(p.numel() for p in body) + CRC_BYTES
    framed = torch.cat([bytes_tensor(header_bytes(header, total), device), *body])
    return torch.cat([framed, crc32_bytes_device(framed)])


def read_device_header(payload: torch.Tensor) -> tuple[Header, int]:
    """The header of a device payload and the offset of its body, from one small host read;
    raises the :class:`~gradzip.errors.PayloadError` :func:`~gradzip.payload.parse_payload`
    would for the header's faults (the CRC is :func:`crc_ok`'s)."""
    n = payload.numel()
    size = min(n, HEADER_READ_BYTES)
    try:
        return read_header(host_read(payload.narrow(0, 0, size)).tobytes(), n)
    except TruncatedPayloadError:
        if size == n:
            raise
    return read_header(host_read(payload.narrow(0, 0, n - CRC_BYTES)).tobytes(), n)


def stored_crc(payload: torch.Tensor) -> torch.Tensor:
    """The CRC-32 the payload's last four bytes hold, as a 0-d int64 tensor on its device."""
    last = payload.narrow(0, payload.numel() - CRC_BYTES, CRC_BYTES).to(torch.int64)
    shifts = torch.arange(0, 32, 8, dtype=torch.int64, device=payload.device)
    return (last << shifts).sum()


def computed_crc(payload: torch.Tensor) -> torch.Tensor:
    """The CRC-32 of every byte of the payload before its stored CRC (0-d int64, on device)."""
    return crc32_device(payload.narrow(0, 0, payload.numel() - CRC_BYTES))


def crc_ok(payload: torch.Tensor) -> torch.Tensor:
    """Whether the stored CRC matches the bytes, as a 0-d bool tensor on the payload's device."""
    return stored_crc(payload) == computed_crc(payload)


def body_of(payload: torch.Tensor, body_start: int) -> torch.Tensor:
    """The body of a device payload (a view), from the offset :func:`read_device_header` gave."""
    return payload.narrow(0, body_start, payload.numel() - CRC_BYTES - body_start)


def poisoned(payload: torch.Tensor, finite: torch.Tensor) -> torch.Tensor:
    """``payload`` where ``finite`` holds; else the same bytes with the CRC complemented.

    [CHOICE] An encoder on the device does not read whether its input was finite (that would
    stall the device for one byte), so a payload of non-finite input cannot be refused before
    it exists; instead its CRC is complemented, so no receiver ever decodes it, and a
    receiver's error names the cause (:class:`~gradzip.errors.NonFiniteSenderError`). The sender
    learns it from the encoding's flag (:meth:`gradzip.accounting.Encoded.verify`)."""
    n = payload.numel()
    head = payload.narrow(0, 0, n - CRC_BYTES)
    crc = payload.narrow(0, n - CRC_BYTES, CRC_BYTES)
    return torch.cat([head, torch.where(finite, crc, torch.bitwise_not(crc))])
