"""The schemes' own messages: integer code sums and float32 scale vectors.

They travel in the same self-validating format as compressor payloads (:mod:`gradzip.payload`:
header with the key, CRC32), so a sum of another step, seed or shape is rejected by name, and
their bytes are counted like any payload. Integer sums are bit-packed at the width their range
needs (``bits`` is written in the header's bucket-size field).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from gradzip.codecs.bitpack import pack_bits, unpack_bits
from gradzip.comm.transport import Payload, Transport
from gradzip.compressors.base import tensor_bytes
from gradzip.errors import (
    CorruptPayloadError,
    GradzipError,
    KeyMismatchError,
    PayloadMismatchError,
)
from gradzip.kernels.packed import check_bits, check_packed_size, packed_bytes
from gradzip.keys import StreamKey
from gradzip.payload import (
    CRC_BYTES,
    Deferred,
    Header,
    build_payload,
    frame_payload,
    header_size,
    parse_payload,
)

INT_CODEC = 40  # packed non-negative integers (code sums)
FLOAT_CODEC = 41  # float32 vectors (scales)
ABORT_CODEC = 42  # a server's "this step failed" notice, with the reason as UTF-8
_CODEC_BYTE = 3  # offset of the codec id in every header (after the magic and the version)


def bits_for(max_value: int) -> int:
    """Bits holding every integer in ``[0, max_value]`` (at least 1)."""
    return max(1, int(max_value).bit_length())


def pack_ints(values: torch.Tensor, bits: int, key: StreamKey) -> bytes:
    """``values`` (integers in ``[0, 2**bits)``) packed at ``bits`` bits each."""
    header = Header(INT_CODEC, torch.float32, (values.numel(),), bits, key, b"")
    return build_payload(header, [tensor_bytes(pack_bits(values, bits))])


def _message_size(codec: int, n: int, bits: int, body: int, key: StreamKey) -> int:
    """Bytes of a scheme message (header, ``body`` bytes, CRC), known without building it."""
    return header_size(Header(codec, torch.float32, (n,), bits, key, b"")) + body + CRC_BYTES


def ints_message_size(n: int, bits: int, key: StreamKey) -> int:
    """Bytes of the :func:`pack_ints` message of ``n`` integers at ``bits`` bits named ``key``."""
    return _message_size(INT_CODEC, n, bits, packed_bytes(n, bits), key)


def floats_message_size(n: int, key: StreamKey) -> int:
    """Bytes of the :func:`pack_floats` message of ``n`` values named ``key``."""
    return _message_size(FLOAT_CODEC, n, 0, 4 * n, key)


def frame_ints(n: int, bits: int, key: StreamKey, write: Callable[[np.ndarray], None]) -> Payload:
    """The :func:`pack_ints` message of ``n`` integers whose packed body ``write(out)`` writes
    straight into the payload (``out``: uint8, ``ceil(n bits / 8)`` bytes, arbitrary contents
    to overwrite): the same bytes, without an integer tensor or a packed copy in between."""
    header = Header(INT_CODEC, torch.float32, (n,), bits, key, b"")
    return frame_payload(header, [Deferred(packed_bytes(n, bits), write)])


def unpack_ints(payload: bytes, n: int, bits: int, key: StreamKey) -> torch.Tensor:
    """The ``n`` integers (int32) of a :func:`pack_ints` message that must carry ``key``."""
    return unpack_bits(_bytes(open_ints(payload, n, bits, key).data), n, bits).to(torch.int32)


def open_ints(payload: bytes | memoryview, n: int, bits: int, key: StreamKey) -> np.ndarray:
    """The packed body (uint8, read-only, zero-copy) of a :func:`pack_ints` message that must
    carry ``key``, ``n`` integers and ``bits``, after every check :func:`unpack_ints` makes:
    the same error for the same bad message (checksum, kind, key, shape, width, body length,
    padding bits)."""
    header, body = _open(payload, INT_CODEC, n, key)
    if header.bucket_size != bits:
        raise PayloadMismatchError(
            f"integer message packed at {header.bucket_size} bits; expected {bits}"
        )
    check_bits(bits)
    check_packed_size(len(body), lambda: body[-1], n, bits)
    return np.frombuffer(body, dtype=np.uint8)


def pack_floats(values: torch.Tensor, key: StreamKey) -> bytes:
    """A float32 vector as a message."""
    values = values.to(torch.float32).reshape(-1)
    header = Header(FLOAT_CODEC, torch.float32, (values.numel(),), 0, key, b"")
    return build_payload(header, [tensor_bytes(values)])


def unpack_floats(payload: bytes, n: int, key: StreamKey) -> torch.Tensor:
    """The ``n`` float32 values of a :func:`pack_floats` message that must carry ``key``."""
    _, body = _open(payload, FLOAT_CODEC, n, key)
    if len(body) != 4 * n:
        raise CorruptPayloadError(f"float message body has {len(body)} bytes, expected {4 * n}")
    values = _bytes(body).view(torch.float32) if n else torch.empty(0)
    if not bool(torch.isfinite(values).all()):
        raise CorruptPayloadError("float message holds NaN or Inf")
    return values


def _bytes(body: memoryview) -> torch.Tensor:
    """A uint8 copy of ``body`` (``torch.frombuffer`` refuses empty buffers)."""
    if len(body) == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(bytearray(body), dtype=torch.uint8)


def _open(
    payload: bytes | memoryview, codec: int, n: int, key: StreamKey
) -> tuple[Header, memoryview]:
    header, body = parse_payload(payload)
    if header.codec_id != codec:
        raise PayloadMismatchError(f"expected a message of kind {codec}, got {header.codec_id}")
    if header.key != key:
        raise KeyMismatchError(
            f"message key differs from the expected one: {header.key.describe_difference(key)}"
        )
    if header.shape != (n,):
        raise PayloadMismatchError(f"message holds shape {header.shape}, expected ({n},)")
    return header, body


class ServerAbortError(GradzipError):
    """The server rank could not complete the step and told every worker why."""


def serve(
    transport: Transport,
    payload: Payload,
    server: int,
    reply: Callable[[list[Payload]], Payload],
    key: StreamKey,
) -> Payload:
    """Gather ``payload`` at ``server``, which broadcasts ``reply(payloads)``; returns that reply
    on every rank.

    If ``reply`` raises on the server (a payload of another step, a corrupt message), the
    server broadcasts an abort notice before re-raising, so the workers raise
    :class:`ServerAbortError` at once, naming the reason, instead of waiting for a timeout.
    """
    gathered = transport.gather_bytes(payload, server)
    message = None
    if gathered is not None:
        try:
            message = reply(gathered)
        except Exception as err:
            transport.broadcast_bytes(abort_notice(err, key), server)
            raise
    received = transport.broadcast_bytes(message, server)
    reason = abort_reason(received)
    if reason is not None:
        raise ServerAbortError(
            f"rank {transport.rank}: the server (rank {server}) abandoned step {key.step}, "
            f"nothing was applied: {reason}"
        )
    return received


def abort_notice(error: BaseException, key: StreamKey) -> bytes:
    """A "this step failed" message naming ``error`` (its type and text, UTF-8), sent in place
    of a reply so that a waiting rank raises at once instead of at its timeout."""
    reason = f"{type(error).__name__}: {error}".encode()
    header = Header(ABORT_CODEC, torch.float32, (len(reason),), 0, key, b"")
    return build_payload(header, [reason])


def abort_reason(received: Payload) -> str | None:
    """The reason an :func:`abort_notice` carries, or None when ``received`` is not one."""
    if isinstance(received, torch.Tensor):  # a device payload is a compressor's, never a notice
        return None
    if len(received) <= _CODEC_BYTE or received[_CODEC_BYTE] != ABORT_CODEC:
        return None
    _, body = parse_payload(received)
    return bytes(body).decode(errors="replace")
