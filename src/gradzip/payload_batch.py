"""Several payloads in one message: concatenated as they are, split again by their headers.

A gradzip payload states its own total length (header and CRC included) at bytes 4-11 of its
header (see :mod:`gradzip.payload`), so a message of several payloads needs no framing of its
own: the receiver, which knows how many payloads (and of how many elements each) to expect,
reads each one's length and cuts there. An empty tensor travels as an empty payload (spec 0.3),
so it takes no bytes in the message. Each piece is then validated in full by the decoder
(magic, version, CRC, key), so a cut in the wrong place cannot decode to silent garbage.
"""

from __future__ import annotations

from collections.abc import Sequence

from gradzip.errors import CorruptPayloadError, TruncatedPayloadError
from gradzip.payload import CRC_BYTES, MAGIC

#: where the header's u64 total length sits, and the fewest bytes of a payload that holds one
_LENGTH_AT, _LENGTH_END = 4, 12


def join_payloads(payloads: Sequence[bytes | bytearray | memoryview]) -> bytes:
    """The message holding ``payloads`` back to back (no bytes of its own)."""
    return b"".join(payloads)


def split_payloads(
    message: bytes | bytearray | memoryview, numels: Sequence[int]
) -> list[memoryview]:
    """The payloads of a :func:`join_payloads` message of tensors of ``numels`` elements, as
    zero-copy views; raises a :class:`~gradzip.errors.PayloadError` naming the problem when the
    message does not hold exactly that many payloads."""
    buf = memoryview(message).cast("B")
    pieces, pos = [], 0
    for number, numel in enumerate(numels):
        if numel == 0:
            pieces.append(buf[pos:pos])
            continue
        if len(buf) - pos < _LENGTH_END:
            raise TruncatedPayloadError(
                f"message of {len(buf)} bytes ends at payload {number} of {len(numels)} "
                f"(byte {pos})"
            )
        if bytes(buf[pos : pos + len(MAGIC)]) != MAGIC:
            raise CorruptPayloadError(
                f"payload {number} of {len(numels)} in a message does not start with the "
                f"gradzip magic bytes (byte {pos})"
            )
        total = int.from_bytes(buf[pos + _LENGTH_AT : pos + _LENGTH_END], "little")
        if total < _LENGTH_END + CRC_BYTES:
            raise CorruptPayloadError(
                f"payload {number} of {len(numels)} in a message declares {total} bytes, fewer "
                "than a header"
            )
        if total > len(buf) - pos:
            raise TruncatedPayloadError(
                f"payload {number} of {len(numels)} in a message declares {total} bytes; "
                f"{len(buf) - pos} remain"
            )
        pieces.append(buf[pos : pos + total])
        pos += total
    if pos != len(buf):
        raise CorruptPayloadError(
            f"message holds {len(buf) - pos} bytes beyond its {len(numels)} payloads"
        )
    return pieces
