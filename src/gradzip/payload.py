"""The gradzip wire format: a versioned header, a compressor-specific body, and a CRC32.

Layout (all integers little-endian; ``varint`` is unsigned LEB128)::

    offset size     field
    0      2        magic b"GZ"
    2      1        format version (3)
    3      1        codec id (see gradzip.compressors.registry)
    4      8        total payload length in bytes, header and CRC included (u64)
    12     1        dtype code of the original tensor (float32=1, float16=2, bfloat16=3, float64=4)
    13     1        ndim
    14     varint*  shape, one varint per dimension
           varint   bucket size (0: one bucket per tensor)
           varint*  stream key: run seed, rank, step, tensor index, chunk
           varint   length of the parameter block, then the block (the codec's own parameters,
                    e.g. M or the bit width, so a receiver configured differently is told so)
           ...      body (codec-specific; its length is the rest of the payload)
    end-4  4        CRC32 (zlib polynomial) of every byte before it

Version history (each later version keeps the layout; a payload of an older version is refused by
number instead of decoding to wrong values, since its dither or indices came from another
stream): 1 was the first format; 2 marks the change of the shared and local random streams from
SFC64 to Philox4x32-10; 3 marks the float streams' new layout, two 16-bit uniforms per Philox
word instead of one 23-bit uniform (see :mod:`gradzip.kernels.philox`; the word streams behind
random indices did not change, but a version-2 payload is refused all the same).

[CHOICE] Framing copies the body once: :func:`frame_payload` writes header, body pieces and CRC
into one NumPy buffer (recycled from :mod:`gradzip.buffers` when large: a payload of the same
size as an earlier, released one costs no page faults), a :class:`Deferred` piece is
written there by its producer directly (no intermediate array), and the CRC runs over
zero-copy memoryviews (:func:`gradzip.checksum.crc32`, 13x faster than the standard library's
on the development machine). :func:`parse_payload` returns the body as a zero-copy view; a
decoder copies it at most once, into its output.

The header is read with bounds checks on every field, so truncated or corrupt bytes raise a
:class:`~gradzip.errors.PayloadError` that names the problem; they never crash, hang or decode to
silent garbage. A header's element count is only bounded here by :data:`MAX_ELEMENTS`; a decoder
bounds its work and memory by the payload's size before allocating anything (the body's floor
for that count, and without ``shape=`` a cap of elements per payload byte: see
:mod:`gradzip.compressors._decode_guards`), so that any payload of up to 64 KiB is decoded or
refused in under 0.1 s and 64 MiB. No pickle is used anywhere. An empty tensor is sent as an empty payload of 0 bits
(spec 0.3); only a receiver that expects an empty tensor accepts one.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from gradzip.buffers import fresh_array
from gradzip.checksum import crc32
from gradzip.errors import (
    ChecksumMismatchError,
    CorruptPayloadError,
    TruncatedPayloadError,
    UnsupportedVersionError,
)
from gradzip.keys import StreamKey

MAGIC = b"GZ"
FORMAT_VERSION = 3
CRC_BYTES = 4
#: the most elements one payload may hold (8 GiB of float32): decoding a corrupt or hostile
#: header must not try to materialise an absurd tensor; larger tensors travel in chunks
#: (``StreamKey.chunk``)
MAX_ELEMENTS = 2**31
_FIXED = struct.Struct("<2sBBQBB")  # magic, version, codec id, total length, dtype, ndim
#: the body of a framed payload starts at a memory address that is a multiple of this, so that
#: producers may view it as any dtype up to 8 bytes wide (the wire format itself has no padding)
BODY_ALIGN = 64

DTYPE_CODES: dict[torch.dtype, int] = {
    torch.float32: 1,
    torch.float16: 2,
    torch.bfloat16: 3,
    torch.float64: 4,
}
CODE_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}


def encode_varint(value: int) -> bytes:
    """Unsigned LEB128 encoding of ``value`` (0 <= value < 2**64)."""
    if value < 0 or value >= 2**64:
        raise ValueError(f"varint out of range: {value}")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def decode_varint(buf: bytes | memoryview, pos: int, what: str) -> tuple[int, int]:
    """Read a varint at ``pos``; returns ``(value, next position)``; ``what`` names the field.

    Only the canonical encoding that :func:`encode_varint` writes is accepted: a value below
    2**64 in at most 10 bytes, without a redundant zero last byte (``0x80 0x00`` for 0), so that
    every payload has exactly one byte form and a corrupt field cannot alias a valid one.
    """
    value = 0
    shift = 0
    end = len(buf)
    while True:
        if pos >= end:
            raise TruncatedPayloadError(f"payload ends inside the header field '{what}'")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if byte == 0 and shift:
                raise CorruptPayloadError(
                    f"header field '{what}' is an over-long varint (a redundant zero byte)"
                )
            if value >= 2**64:
                raise CorruptPayloadError(f"header field '{what}' exceeds 64 bits")
            return value, pos
        shift += 7
        if shift > 63:
            raise CorruptPayloadError(f"header field '{what}' is not a valid varint")


def varint_size(value: int) -> int:
    """Bytes taken by ``encode_varint(value)``."""
    return max(1, (value.bit_length() + 6) // 7)


@dataclass(frozen=True)
class Header:
    """Everything a payload says about itself before its body."""

    codec_id: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    bucket_size: int
    key: StreamKey
    params: bytes

    @property
    def numel(self) -> int:
        n = 1
        for dim in self.shape:
            n *= dim
        return n


def header_size(header: Header) -> int:
    """Bytes the header takes on the wire (the CRC is counted separately, as CRC_BYTES)."""
    key = header.key
    return (
        _FIXED.size
        + sum(varint_size(d) for d in header.shape)
        + varint_size(header.bucket_size)
        + sum(
            varint_size(v) for v in (key.run_seed, key.rank, key.step, key.tensor_index, key.chunk)
        )
        + varint_size(len(header.params))
        + len(header.params)
    )


def overhead_bits(header: Header) -> int:
    """Header plus CRC, in bits: ``wire_bits = overhead_bits + body bits`` for every payload."""
    return 8 * (header_size(header) + CRC_BYTES)


@dataclass(frozen=True)
class Deferred:
    """A body piece of ``nbytes`` bytes that its producer writes straight into the payload.

    ``write(out)`` receives a writable uint8 NumPy array of exactly ``nbytes`` and must fill all
    of it; a piece that starts the body starts at a :data:`BODY_ALIGN`-aligned address.
    """

    nbytes: int
    write: Callable[[np.ndarray], None]


BodyPiece = bytes | bytearray | memoryview | Deferred


def _piece_size(piece: BodyPiece) -> int:
    return piece.nbytes if isinstance(piece, Deferred) else memoryview(piece).nbytes


def _header_bytes(header: Header, total: int) -> bytearray:
    if len(header.shape) > 255:
        raise ValueError(
            f"tensors of more than 255 dimensions are not supported ({len(header.shape)})"
        )
    key = header.key
    head = bytearray(
        _FIXED.pack(
            MAGIC,
            FORMAT_VERSION,
            header.codec_id,
            total,
            DTYPE_CODES[header.dtype],
            len(header.shape),
        )
    )
    for value in (
        *header.shape,
        header.bucket_size,
        key.run_seed,
        key.rank,
        key.step,
        key.tensor_index,
        key.chunk,
        len(header.params),
    ):
        head += encode_varint(value)
    head += header.params
    return head


def frame_payload(header: Header, body: Sequence[BodyPiece]) -> memoryview:
    """Serialize ``header`` and the body pieces and append the CRC32, copying each piece once.

    Returns a read-only memoryview of a NumPy buffer (use it like ``bytes``; ``bytes(view)``
    makes an ordinary copy). See the module doc for why.
    """
    body_len = sum(_piece_size(piece) for piece in body)
    head_len = header_size(header)
    total = head_len + body_len + CRC_BYTES
    head = _header_bytes(header, total)
    # place the buffer so that the body (not the header) starts on an aligned address
    raw = fresh_array(total + BODY_ALIGN, np.uint8)  # recycled: no page faults when large
    shift = (-(raw.ctypes.data + head_len)) % BODY_ALIGN
    buf = raw[shift : shift + total]
    buf[:head_len] = np.frombuffer(head, dtype=np.uint8)
    pos = head_len
    for piece in body:
        size = _piece_size(piece)
        if isinstance(piece, Deferred):
            piece.write(buf[pos : pos + size])
        elif size:
            buf[pos : pos + size] = np.frombuffer(piece, dtype=np.uint8)
        pos += size
    view = buf.data
    crc = crc32(view[: total - CRC_BYTES])
    buf[total - CRC_BYTES :] = np.frombuffer(crc.to_bytes(CRC_BYTES, "little"), dtype=np.uint8)
    return view.toreadonly()


def build_payload(header: Header, body: Sequence[BodyPiece]) -> bytes:
    """:func:`frame_payload` as ``bytes`` (one more copy; for small control messages)."""
    return bytes(frame_payload(header, body))


def _check_frame(buf: memoryview, length: int) -> tuple[int, int, int, int]:
    """The fixed fields of a payload of ``length`` bytes whose first bytes are ``buf``, checked:
    ``(codec id, total length, dtype code, ndim)``."""
    if length < _FIXED.size + CRC_BYTES:
        raise TruncatedPayloadError(
            f"payload of {length} bytes is shorter than the smallest gradzip header "
            f"({_FIXED.size + CRC_BYTES} bytes)"
        )
    magic, version, codec_id, total, dtype_code, ndim = _FIXED.unpack_from(buf, 0)
    if magic != MAGIC:
        raise CorruptPayloadError(
            f"not a gradzip payload: magic bytes {bytes(magic)!r} != {MAGIC!r}"
        )
    if version != FORMAT_VERSION:
        raise UnsupportedVersionError(
            f"payload has wire-format version {version}; this gradzip reads version {FORMAT_VERSION}"
        )
    if total > length:
        raise TruncatedPayloadError(f"payload is truncated: {length} bytes of the {total} declared")
    if total < length:
        raise CorruptPayloadError(
            f"payload has {length - total} trailing bytes beyond its declared length {total}"
        )
    return codec_id, total, dtype_code, ndim


def _header_fields(
    view: memoryview, codec_id: int, dtype_code: int, ndim: int
) -> tuple[Header, int]:
    """The header after the fixed fields, read from ``view`` (which ends where the body may
    end at the latest); returns it and the position of the body."""
    if dtype_code not in CODE_DTYPES:
        raise CorruptPayloadError(f"payload names unknown dtype code {dtype_code}")
    end = len(view)
    pos = _FIXED.size
    shape = []
    for axis in range(ndim):
        dim, pos = decode_varint(view, pos, f"shape[{axis}]")
        shape.append(dim)
    bucket_size, pos = decode_varint(view, pos, "bucket size")
    key_fields = []
    for name in ("run seed", "rank", "step", "tensor index", "chunk"):
        value, pos = decode_varint(view, pos, name)
        key_fields.append(value)
    numel = 1
    for dim in shape:
        numel *= dim
    if numel > MAX_ELEMENTS:
        raise CorruptPayloadError(
            f"payload declares a tensor of shape {tuple(shape)} ({numel} elements); one payload "
            f"holds at most {MAX_ELEMENTS} (send larger tensors in chunks)"
        )
    params_len, pos = decode_varint(view, pos, "parameter block length")
    if pos + params_len > end:
        raise TruncatedPayloadError("payload ends inside the parameter block")
    params = bytes(view[pos : pos + params_len])
    pos += params_len
    header = Header(
        codec_id=codec_id,
        dtype=CODE_DTYPES[dtype_code],
        shape=tuple(shape),
        bucket_size=bucket_size,
        key=StreamKey(*key_fields),
        params=params,
    )
    return header, pos


def parse_payload(payload: bytes | bytearray | memoryview) -> tuple[Header, memoryview]:
    """Validate ``payload`` and split it into its header and a view of its body.

    Raises :class:`TruncatedPayloadError`, :class:`CorruptPayloadError`,
    :class:`ChecksumMismatchError` or :class:`UnsupportedVersionError` naming the problem.
    """
    buf = memoryview(payload).cast("B")
    codec_id, total, dtype_code, ndim = _check_frame(buf, len(buf))
    stored_crc = int.from_bytes(buf[total - CRC_BYTES : total], "little")
    actual_crc = crc32(buf[: total - CRC_BYTES])
    if stored_crc != actual_crc:
        raise ChecksumMismatchError(
            f"payload checksum mismatch (stored CRC32 {stored_crc:#010x}, computed {actual_crc:#010x}):"
            " the bytes were corrupted in transit or storage"
        )
    view = buf[: total - CRC_BYTES]
    header, pos = _header_fields(view, codec_id, dtype_code, ndim)
    return header, view[pos:]


def read_header(prefix: bytes | bytearray | memoryview, length: int) -> tuple[Header, int]:
    """The header of a payload of ``length`` bytes from its first bytes ``prefix`` (every check
    of :func:`parse_payload` but the CRC's, which the caller makes where the bytes are), and
    the offset of its body. A header longer than ``prefix`` raises
    :class:`TruncatedPayloadError` while ``prefix`` is shorter than the payload: read more."""
    buf = memoryview(prefix).cast("B")
    if len(buf) < min(length, _FIXED.size):
        raise TruncatedPayloadError("the header prefix read is shorter than the fixed header")
    codec_id, _, dtype_code, ndim = _check_frame(buf, length)
    return _header_fields(buf[: length - CRC_BYTES], codec_id, dtype_code, ndim)


def header_bytes(header: Header, total: int) -> bytes:
    """The header's bytes for a payload of ``total`` bytes (what :func:`frame_payload` writes
    first): device framing builds it on the host, where everything it says is known."""
    return bytes(_header_bytes(header, total))
