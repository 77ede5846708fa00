"""The sparsifiers' kept values on a tensor's own device (see :mod:`gradzip.device`).

The device twins of :func:`~gradzip.compressors._sparse_coding.encode_values` and
:func:`~gradzip.compressors._sparse_coding.parse_values` for the value codings whose codec is
itself device resident (``"fp32"``: the raw float32; ``"fp16"``, ``"bf16"``: a whole inner
payload of that codec, framed on the device). [CHOICE] The decoder knows every size from the
header (``k`` values of a fixed-size codec), so it checks the inner payload's length word and
header by comparing them on the device with the bytes an encoder writes, checks its CRC there,
and decodes its body with the codec's own device decoder: nothing more is read on the host. A
crafted inner header that parses to the same values in other bytes is refused on the device;
the host decoder then names it (:func:`gradzip.compressors._device_decode.decode_device_payload`
reports a payload the host accepts).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import torch

from gradzip.compressors.base import Compressor, encode_params
from gradzip.device.ops import bytes_tensor
from gradzip.device.payloads import crc_ok
from gradzip.keys import StreamKey
from gradzip.payload import CRC_BYTES, Header, header_bytes, header_size

_WORD = struct.Struct("<I")
#: the value codecs whose payload size follows from ``k`` alone and that are device resident
_FIXED_SIZE_CODECS = ("fp16", "bf16")


def values_on_device(codec: Compressor | None) -> bool:
    """Whether kept values coded by ``codec`` (None: plain float32) stay on the device."""
    return codec is None or (codec.name in _FIXED_SIZE_CODECS and bool(codec.device_resident))


def false_flag(device: torch.device) -> torch.Tensor:
    """A 0-d False flag on ``device``."""
    return torch.zeros((), dtype=torch.bool, device=device)


class DeviceValues(NamedTuple):
    """The kept values' part of a device body and its paper bits."""

    piece: torch.Tensor
    paper_bits: float


def _inner_header(codec: Compressor, k: int, key: StreamKey) -> tuple[Header, int]:
    """The header an inner value payload of ``k`` float32 values has, and its total size
    (exact for codecs of fixed-size bodies: fp16, bf16)."""
    header = Header(
        codec_id=codec.codec_id,
        dtype=torch.float32,
        shape=(k,),
        bucket_size=codec.bucket_size,
        key=key,
        params=encode_params(codec.wire_params()),
    )
    body = codec.min_body_bits(header) // 8
    return header, header_size(header) + body + CRC_BYTES


def encode_values_device(
    codec: Compressor | None, x: torch.Tensor, idx: torch.Tensor, key: StreamKey
) -> DeviceValues:
    """``x[idx]`` as float32 on ``x``'s device, or as the length-prefixed device payload of
    ``codec`` keyed by ``key`` (byte for byte the host path's)."""
    kept = x.index_select(0, idx)
    k = idx.numel()
    if codec is None:
        return DeviceValues(kept, 32.0 * k)
    inner = codec.encode(kept, key)  # a device payload: the codec is device resident
    payload = inner.payload
    assert isinstance(payload, torch.Tensor)
    length = bytes_tensor(_WORD.pack(payload.numel()), x.device)
    return DeviceValues(torch.cat((length, payload)), inner.paper_bits)


def values_size(codec: Compressor | None, k: int, key: StreamKey) -> int:
    """Bytes the kept values take at the start of a body."""
    if codec is None:
        return 4 * k
    return 4 + _inner_header(codec, k, key)[1]


def decode_values_device(
    codec: Compressor | None, body: torch.Tensor, k: int, key: StreamKey
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The ``k`` float32 kept values at the start of ``body`` (uint8 on the device, 8-byte
    aligned, at least :func:`values_size` bytes) and a 0-d validity flag (None: nothing to
    check beyond finiteness)."""
    if codec is None:
        return body.narrow(0, 0, 4 * k).view(torch.float32), None
    header, total = _inner_header(codec, k, key)
    start = header_size(header)
    expected = bytes_tensor(_WORD.pack(total) + header_bytes(header, total), body.device)
    framing_ok = (body.narrow(0, 0, 4 + start) == expected).all()
    payload = body.narrow(0, 4, total)
    inner_body = payload.narrow(0, start, total - start - CRC_BYTES)
    inner_body = inner_body.clone()  # the codec's decoder views it as wider words: align it
    values, valid = codec._decode_device(inner_body, header, None)
    ok = framing_ok & crc_ok(payload)
    if valid is not None:
        ok = ok & valid
    return values.to(torch.float32), ok


__all__ = [
    "DeviceValues",
    "decode_values_device",
    "encode_values_device",
    "false_flag",
    "values_on_device",
    "values_size",
]
