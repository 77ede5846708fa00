"""The wire format: header fields, CRC, and the errors that name each problem."""

from __future__ import annotations

import contextlib
import struct
import zlib

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from gradzip.errors import (
    ChecksumMismatchError,
    CorruptPayloadError,
    PayloadError,
    TruncatedPayloadError,
    UnsupportedVersionError,
)
from gradzip.keys import StreamKey
from gradzip.payload import (
    BODY_ALIGN,
    CRC_BYTES,
    FORMAT_VERSION,
    MAX_ELEMENTS,
    Deferred,
    Header,
    build_payload,
    decode_varint,
    encode_varint,
    frame_payload,
    header_size,
    overhead_bits,
    parse_payload,
    varint_size,
)

HEADER = Header(
    codec_id=10,
    dtype=torch.bfloat16,
    shape=(3, 1, 300),
    bucket_size=512,
    key=StreamKey(run_seed=2**63 + 5, rank=3, step=1000, tensor_index=7, chunk=2),
    params=b"\x02\x04",
)


def _refresh_crc(buf: bytearray) -> bytes:
    body = bytes(buf[:-CRC_BYTES])
    return body + zlib.crc32(body).to_bytes(CRC_BYTES, "little")


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_varint_round_trip_and_size(value: int) -> None:
    raw = encode_varint(value)
    assert len(raw) == varint_size(value)
    assert decode_varint(raw, 0, "x") == (value, len(raw))


def test_varint_rejects_out_of_range() -> None:
    with pytest.raises(ValueError):
        encode_varint(-1)
    with pytest.raises(ValueError):
        encode_varint(2**64)


def test_round_trip_preserves_every_header_field() -> None:
    body = [b"abc", bytearray(b"de"), memoryview(b"f")]
    payload = build_payload(HEADER, body)
    header, parsed_body = parse_payload(payload)
    assert header == HEADER
    assert bytes(parsed_body) == b"abcdef"
    assert len(payload) * 8 == overhead_bits(HEADER) + 6 * 8
    assert len(payload) == header_size(HEADER) + 6 + CRC_BYTES


def test_every_truncation_is_named() -> None:
    payload = build_payload(HEADER, [b"0123456789"])
    for cut in range(len(payload)):
        with pytest.raises(TruncatedPayloadError):
            parse_payload(payload[:cut])


def test_trailing_bytes_are_corrupt() -> None:
    payload = build_payload(HEADER, [b"xyz"])
    with pytest.raises(CorruptPayloadError, match="trailing"):
        parse_payload(payload + b"\x00")


def test_every_single_bit_flip_is_detected() -> None:
    payload = build_payload(HEADER, [bytes(range(40))])
    for position in range(len(payload)):
        for bit in (0, 7):
            damaged = bytearray(payload)
            damaged[position] ^= 1 << bit
            with pytest.raises(PayloadError):
                parse_payload(bytes(damaged))


def test_checksum_error_names_the_checksum() -> None:
    damaged = bytearray(build_payload(HEADER, [b"payload body"]))
    damaged[-6] ^= 0x10
    with pytest.raises(ChecksumMismatchError, match="checksum"):
        parse_payload(bytes(damaged))


def test_bad_magic_and_version() -> None:
    payload = bytearray(build_payload(HEADER, [b"x"]))
    wrong_magic = bytearray(payload)
    wrong_magic[0:2] = b"PK"
    with pytest.raises(CorruptPayloadError, match="magic"):
        parse_payload(_refresh_crc(wrong_magic))
    future = bytearray(payload)
    future[2] = 99
    with pytest.raises(UnsupportedVersionError, match="version 99"):
        parse_payload(_refresh_crc(future))


def test_unknown_dtype_code_is_corrupt() -> None:
    payload = bytearray(build_payload(HEADER, [b"x"]))
    payload[12] = 200
    with pytest.raises(CorruptPayloadError, match="dtype"):
        parse_payload(_refresh_crc(payload))


def test_declared_length_larger_than_buffer_is_truncation() -> None:
    payload = bytearray(build_payload(HEADER, [b"x"]))
    struct.pack_into("<Q", payload, 4, len(payload) + 10)
    with pytest.raises(TruncatedPayloadError, match="truncated"):
        parse_payload(bytes(payload))


@pytest.mark.parametrize("size", [14, 15, 16, 17])
def test_a_buffer_shorter_than_header_and_crc_is_truncated_whatever_it_declares(size: int) -> None:
    # the fixed fields (14 bytes) fit, declaring exactly this length, but no CRC fits after
    # them: that is a truncation, not a checksum error read from the header's own bytes
    buf = struct.pack("<2sBBQBB", b"GZ", FORMAT_VERSION, 1, size, 1, 0) + bytes(size - 14)
    assert len(buf) == size
    with pytest.raises(TruncatedPayloadError, match=f"{size} bytes is shorter .* \\(18 bytes\\)"):
        parse_payload(buf)


def test_a_header_with_parameters_and_an_empty_body_parses() -> None:
    # the parameter block ends exactly where the CRC starts
    header, body = parse_payload(build_payload(HEADER, []))
    assert header == HEADER and len(body) == 0


def test_a_payload_holds_at_most_max_elements() -> None:
    # a header alone (no body: parse_payload leaves the body's size to the decoder) declaring
    # exactly MAX_ELEMENTS parses; one element more is refused before anything is allocated
    at_most = Header(1, torch.float32, (2, MAX_ELEMENTS // 2), 0, StreamKey(), b"")
    assert parse_payload(build_payload(at_most, []))[0].numel == MAX_ELEMENTS
    beyond = Header(1, torch.float32, (MAX_ELEMENTS + 1,), 0, StreamKey(), b"")
    with pytest.raises(CorruptPayloadError, match="holds at most"):
        parse_payload(build_payload(beyond, []))


@given(st.binary(max_size=80))
def test_random_bytes_never_crash(data: bytes) -> None:
    with contextlib.suppress(PayloadError):
        parse_payload(data)


def _with_field(field_index: int, raw: bytes) -> bytes:
    """A valid payload (right length, recomputed CRC) whose ``field_index``-th header varint
    (0..2 the shape, 3 the bucket size, 4..8 the key) is replaced by the bytes ``raw``, so that
    the parser itself, not the CRC check, meets them."""
    payload = build_payload(HEADER, [b"\x01\x02"])
    pos = struct.calcsize("<2sBBQBB")
    for _ in range(field_index):
        _, pos = decode_varint(payload, pos, "skip")
    _, end = decode_varint(payload, pos, "field")
    head = bytearray(payload[:pos] + raw + payload[end:-CRC_BYTES])
    head[4:12] = (len(head) + CRC_BYTES).to_bytes(8, "little")
    return bytes(head) + zlib.crc32(head).to_bytes(CRC_BYTES, "little")


@pytest.mark.parametrize("field_index", [0, 3, 4, 6, 8])
@pytest.mark.parametrize(
    "raw",
    [b"\x80" * 9 + b"\x00", b"\x80\x00", b"\x85\x80\x00", b"\xff" * 9 + b"\x7f", b"\x80" * 10],
    ids=["ten-byte-zero", "zero-in-two", "five-in-three", "beyond-64-bits", "unterminated"],
)
def test_non_canonical_varints_are_refused_behind_a_valid_crc(field_index: int, raw: bytes) -> None:
    # every byte form of these fields is refused as a PayloadError (a ten-byte varint in a key
    # field used to raise StreamKey's ValueError, an over-long zero decoded to 0)
    with pytest.raises(CorruptPayloadError, match=r"varint|64 bits"):
        parse_payload(_with_field(field_index, raw))


def test_the_canonical_form_of_the_same_fields_parses() -> None:
    # the splicing helper itself keeps a payload valid when given canonical bytes
    header, _ = parse_payload(_with_field(4, encode_varint(2**64 - 1)))
    assert header.key.run_seed == 2**64 - 1
    header, _ = parse_payload(_with_field(0, encode_varint(5)))
    assert header.shape == (5, 1, 300)


@pytest.mark.parametrize("old", [1, 2])
def test_older_versions_are_refused_clearly(old: int) -> None:
    # version 2 changed the random streams (Philox), version 3 the float streams' layout (two
    # 16-bit uniforms per word): an old payload must not decode silently with the wrong dither
    payload = bytearray(build_payload(HEADER, [b"x"]))
    assert payload[2] == FORMAT_VERSION == 3
    payload[2] = old
    with pytest.raises(
        UnsupportedVersionError, match=f"version {old}; this gradzip reads version 3"
    ):
        parse_payload(_refresh_crc(payload))


def test_frame_payload_writes_pieces_and_deferred_writers_in_place() -> None:
    def fill(out: np.ndarray) -> None:
        assert out.dtype == np.uint8 and out.size == 6 and out.flags.writeable
        out[:] = np.arange(6, dtype=np.uint8)

    framed = frame_payload(HEADER, [b"ab", Deferred(6, fill), memoryview(b"cd")])
    assert framed.readonly
    # the same bytes as the plain concatenation with the CRC of everything before it
    expected = build_payload(HEADER, [b"ab", bytes(range(6)), b"cd"])
    assert bytes(framed) == expected
    head = expected[: header_size(HEADER)]
    body = b"ab" + bytes(range(6)) + b"cd"
    assert expected[-CRC_BYTES:] == zlib.crc32(head + body).to_bytes(CRC_BYTES, "little")
    header, view = parse_payload(framed)
    assert header == HEADER and bytes(view) == body


@pytest.mark.parametrize("params", [b"", b"\x01", b"\x01\x02\x03"])
def test_frame_payload_aligns_the_body_in_memory(params: bytes) -> None:
    header = Header(1, torch.float32, (4,), 0, StreamKey(), params)
    seen: list[int] = []
    frame_payload(header, [Deferred(16, lambda out: (seen.append(out.ctypes.data), out.fill(0)))])
    assert seen[0] % BODY_ALIGN == 0


def test_parse_payload_body_is_a_zero_copy_view() -> None:
    framed = frame_payload(HEADER, [b"0123456789"])
    _, body = parse_payload(framed)
    source = np.frombuffer(framed, dtype=np.uint8)
    assert np.frombuffer(body, dtype=np.uint8).ctypes.data == (
        source.ctypes.data + header_size(HEADER)
    )
