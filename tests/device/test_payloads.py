"""Device framing gives the host framing's bytes; the header read and the CRC flag."""

from __future__ import annotations

import pytest
import torch

from gradzip.device.host_reads import count_host_reads
from gradzip.device.payloads import (
    HEADER_READ_BYTES,
    body_of,
    crc_ok,
    frame_device_payload,
    poisoned,
    read_device_header,
)
from gradzip.errors import CorruptPayloadError, TruncatedPayloadError, UnsupportedVersionError
from gradzip.keys import StreamKey
from gradzip.payload import Header, frame_payload, parse_payload


def header(shape: tuple[int, ...] = (3, 5), params: bytes = b"\x04") -> Header:
    return Header(
        codec_id=9,
        dtype=torch.float32,
        shape=shape,
        bucket_size=512,
        key=StreamKey(run_seed=2**40 + 3, rank=5, step=123456, tensor_index=7, chunk=1),
        params=params,
    )


def pieces() -> list[torch.Tensor]:
    return [torch.tensor([1.5, -2.0]), torch.arange(11, dtype=torch.uint8)]


def test_device_framing_equals_host_framing() -> None:
    h = header()
    host = bytes(frame_payload(h, [p.numpy().tobytes() for p in pieces()]))
    with count_host_reads() as reads:
        device = frame_device_payload(h, pieces(), torch.device("cpu"))
    assert reads.count == 0
    assert bytes(device.numpy()) == host
    parsed, body = parse_payload(host)
    read, start = read_device_header(device)
    assert read == parsed
    assert bytes(body_of(device, start).numpy()) == bytes(body)
    assert bool(crc_ok(device))


def test_header_read_is_one_small_read() -> None:
    device = frame_device_payload(header(), [torch.zeros(10_000)], torch.device("cpu"))
    with count_host_reads() as reads:
        read_device_header(device)
    assert reads.count == 1 and reads.largest <= HEADER_READ_BYTES


def test_a_long_header_takes_a_second_read() -> None:
    h = header(shape=(1,) * 40, params=bytes(200))
    device = frame_device_payload(h, [torch.zeros(3)], torch.device("cpu"))
    with count_host_reads() as reads:
        assert read_device_header(device)[0] == h
    assert reads.count == 2


def test_header_faults_are_named() -> None:
    device = frame_device_payload(header(), pieces(), torch.device("cpu"))
    with pytest.raises(TruncatedPayloadError):
        read_device_header(device[:-1])
    bad_version = device.clone()
    bad_version[2] = 99
    with pytest.raises(UnsupportedVersionError):
        read_device_header(bad_version)
    bad_magic = device.clone()
    bad_magic[0] = 0
    with pytest.raises(CorruptPayloadError, match="magic"):
        read_device_header(bad_magic)


def test_crc_flag_and_poisoning() -> None:
    device = frame_device_payload(header(), pieces(), torch.device("cpu"))
    corrupt = device.clone()
    corrupt[20] ^= 4
    assert bool(crc_ok(device)) and not bool(crc_ok(corrupt))
    assert torch.equal(poisoned(device, torch.tensor(True)), device)
    bad = poisoned(device, torch.tensor(False))
    assert not bool(crc_ok(bad))
    assert torch.equal(bad[-4:], torch.bitwise_not(device[-4:]))
