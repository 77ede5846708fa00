"""Device twins of the schemes' own messages (:mod:`gradzip.schemes._messages`).

A device message is a 1-D ``uint8`` tensor on the gradient's device holding exactly the bytes
of the host message (header, body, CRC-32): the integer sums bit-packed at the width the header
names, the float32 scale vectors. They are built with torch operations (header on the host,
where all it says is known; body and CRC on the device) and checked on the device into flags:

* the header is compared byte for byte with the one the receiver expects (the same codec,
  shape, width and key: every check of the host parser, with no read of the header);
* the CRC-32 is recomputed on the device (:func:`gradzip.device.payloads.crc_ok`);
* the body's own rules: zero padding bits (integers), finite values (floats).

[CHOICE] The flags are not read per message: a :class:`Checks` collects them and the scheme
reads them all at once (:meth:`Checks.verify`: one host read of a few bytes), where the host
path would have stopped. Only then, if one is False, the message is read back and parsed on
the host, which raises the host path's precise error. A rank that has received a bad message
spoils the CRC of everything it sends afterwards (:func:`spoiled`), so the failure reaches its
neighbours as a refusal too, never as a wrong result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from gradzip.device.crc32 import crc32_bytes_device
from gradzip.device.host_reads import host_read
from gradzip.device.ops import bytes_tensor
from gradzip.device.payloads import crc_ok, frame_device_payload
from gradzip.errors import CorruptPayloadError
from gradzip.kernels.bitpack_device import pack_bits_device, unpack_bits_device
from gradzip.keys import StreamKey
from gradzip.payload import CRC_BYTES, Header, header_bytes, header_size
from gradzip.schemes._messages import FLOAT_CODEC, INT_CODEC, unpack_floats, unpack_ints


def _int_header(n: int, bits: int, key: StreamKey) -> Header:
    return Header(INT_CODEC, torch.float32, (n,), bits, key, b"")


def _float_header(n: int, key: StreamKey) -> Header:
    return Header(FLOAT_CODEC, torch.float32, (n,), 0, key, b"")


def int_message_bytes(n: int, bits: int, key: StreamKey) -> int:
    """The length of a :func:`pack_ints_device` message (host arithmetic)."""
    return header_size(_int_header(n, bits, key)) + (n * bits + 7) // 8 + CRC_BYTES


def pack_ints_device(values: torch.Tensor, bits: int, key: StreamKey) -> torch.Tensor:
    """:func:`gradzip.schemes._messages.pack_ints` on ``values``' device: the same bytes."""
    n = values.numel()
    body = pack_bits_device(values, bits) if n else values.new_empty(0, dtype=torch.uint8)
    return frame_device_payload(_int_header(n, bits, key), [body], values.device)


def pack_floats_device(values: torch.Tensor, key: StreamKey) -> torch.Tensor:
    """:func:`gradzip.schemes._messages.pack_floats` on ``values``' device: the same bytes."""
    values = values.to(torch.float32).reshape(-1)
    return frame_device_payload(_float_header(values.numel(), key), [values], values.device)


def spoiled(payload: torch.Tensor, ok: torch.Tensor) -> torch.Tensor:
    """``payload`` where ``ok`` holds, else the same bytes with a CRC that cannot match (the
    complement of the true one, so a message spoiled twice stays spoiled)."""
    n = payload.numel()
    head = payload.narrow(0, 0, n - CRC_BYTES)
    stored = payload.narrow(0, n - CRC_BYTES, CRC_BYTES)
    return torch.cat([head, torch.where(ok, stored, torch.bitwise_not(crc32_bytes_device(head)))])


@dataclass
class Checks:
    """The flags of the messages a rank received in one call, read once (see the module)."""

    device: torch.device
    #: one ``(flag, payload, host parser)`` per received message
    entries: list[tuple[torch.Tensor, torch.Tensor, Callable[[bytes], object]]] = field(
        default_factory=list
    )
    _all: torch.Tensor | None = None

    def add(
        self, ok: torch.Tensor, payload: torch.Tensor, parse: Callable[[bytes], object]
    ) -> None:
        self.entries.append((ok, payload, parse))
        self._all = ok if self._all is None else self._all & ok

    def all_ok(self) -> torch.Tensor:
        """Whether every message so far passed (0-d bool on the device; True if none)."""
        if self._all is None:
            return torch.ones((), dtype=torch.bool, device=self.device)
        return self._all

    def verify(self, extra: torch.Tensor | None = None) -> bool:
        """Read every flag and ``extra`` in one host read. False if ``extra`` is False (the
        caller raises its own error first, as the host path would have before receiving);
        else raise the host parser's error for the first message that failed, or return True."""
        flags = [ok.reshape(1) for ok, _, _ in self.entries]
        if extra is not None:
            flags.append(extra.reshape(1))
        if not flags:
            return True
        values = host_read(torch.cat(flags))
        if extra is not None and not values[-1]:
            self.entries.clear()
            self._all = None
            return False
        for passed, (_, payload, parse) in zip(values, self.entries, strict=False):
            if not passed:
                _diagnose(payload, parse)
        self.entries.clear()
        self._all = None
        return True


def _diagnose(payload: torch.Tensor, parse: Callable[[bytes], object]) -> None:
    """Raise the host parser's error for a message whose device checks failed."""
    data = host_read(payload).tobytes()
    try:
        parse(data)
    except CorruptPayloadError as err:
        if len(data) >= CRC_BYTES and _spoiled_crc(data):
            raise CorruptPayloadError(
                f"{err} (the sender refused an earlier message of this step and spoiled this "
                "one's CRC, so that every rank refuses the step)"
            ) from err
        raise
    raise CorruptPayloadError("a message failed its device checks but parses on the host")


def _spoiled_crc(data: bytes) -> bool:
    import zlib

    stored = int.from_bytes(data[-CRC_BYTES:], "little")
    return stored == (~zlib.crc32(data[:-CRC_BYTES])) & 0xFFFFFFFF


def _expected_header_ok(payload: torch.Tensor, header: Header, total: int) -> torch.Tensor:
    expected = bytes_tensor(header_bytes(header, total), payload.device)
    return (payload.narrow(0, 0, expected.numel()) == expected).all()


def _refuse_length(payload: torch.Tensor, parse: Callable[[bytes], object], total: int) -> None:
    """A message of the wrong length (known on the host): the host parser's error."""
    data = host_read(payload).tobytes()
    parse(data)
    raise CorruptPayloadError(f"message of {len(data)} bytes, expected {total}")


def unpack_ints_device(
    payload: torch.Tensor, n: int, bits: int, key: StreamKey, checks: Checks
) -> torch.Tensor:
    """The ``n`` integers (int32) of a :func:`pack_ints_device` message carrying ``key``; its
    flag goes to ``checks`` (see the module)."""

    def parse(data: bytes) -> object:
        return unpack_ints(data, n, bits, key)

    header = _int_header(n, bits, key)
    total = int_message_bytes(n, bits, key)
    if payload.numel() != total:
        _refuse_length(payload, parse, total)
    start = header_size(header)
    body = payload.narrow(0, start, total - CRC_BYTES - start)
    ok = _expected_header_ok(payload, header, total) & crc_ok(payload)
    if n:
        values, padding_ok = unpack_bits_device(body, n, bits)
        ok = ok & padding_ok
    else:
        values = torch.zeros(0, dtype=torch.int64, device=payload.device)
    checks.add(ok, payload, parse)
    return values.to(torch.int32)


def unpack_floats_device(
    payload: torch.Tensor, n: int, key: StreamKey, checks: Checks
) -> torch.Tensor:
    """The ``n`` float32 values of a :func:`pack_floats_device` message carrying ``key``; its
    flag (header, CRC, finite values) goes to ``checks``."""

    def parse(data: bytes) -> object:
        return unpack_floats(data, n, key)

    header = _float_header(n, key)
    start = header_size(header)
    total = start + 4 * n + CRC_BYTES
    if payload.numel() != total:
        _refuse_length(payload, parse, total)
    # a copy: the body starts at the header's length, not on a float32 boundary
    body = payload.narrow(0, start, 4 * n).clone()
    values = body.view(torch.float32)
    ok = _expected_header_ok(payload, header, total) & crc_ok(payload)
    checks.add(ok & torch.isfinite(values).all(), payload, parse)
    return values
