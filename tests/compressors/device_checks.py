"""Shared checks of a codec's device path (see gradzip.device), run on this CPU-only machine:

* on fake CUDA tensors (FakeTensorMode: no value exists, so any host read raises), encoding
  completes and gives a device payload of the host payload's size;
* on CPU tensors through the device path (forced_device_payloads), the payload's bytes equal
  the host path's (the twins), decoding it gives the host decode's values bit for bit, and
  reads at most one header prefix and one flag on the host; both while a division by a Python
  number follows CUDA's rule (tests/cuda_division_rule.py), so that the CPU run computes what a
  GPU would;
* a corrupt device payload is refused with the host path's error; a non-finite input gives a
  payload whose encoding's verify() raises and that no receiver decodes.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from gradzip.compressors.base import Compressor
from gradzip.device.host_reads import count_host_reads
from gradzip.device.mode import forced_device_payloads
from gradzip.device.payloads import HEADER_READ_BYTES
from gradzip.keys import StreamKey
from tests.cuda_division_rule import cuda_scalar_division

#: the host reads one decode of a valid device payload may make: the header prefix, the flag
DECODE_READS = 2
DECODE_READ_BYTES = HEADER_READ_BYTES + 8


def encode_fake_cuda(codec: Compressor, shape: tuple[int, ...], key: StreamKey) -> int:
    """Encode a fake CUDA tensor of ``shape``; returns the device payload's size."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.randn(shape, device="cuda")
        encoded = codec.encode(x, key)
        assert isinstance(encoded.payload, torch.Tensor)
        assert encoded.payload.device.type == "cuda"
        assert encoded.payload.dtype == torch.uint8
        return int(encoded.payload.numel())


def device_payload(codec: Compressor, x: torch.Tensor, key: StreamKey) -> torch.Tensor:
    """The device path's payload of CPU tensor ``x``, checked to read nothing on the host."""
    with forced_device_payloads(), cuda_scalar_division(), count_host_reads() as reads:
        encoded = codec.encode(x, key)
    assert reads.count == 0, reads.describe()
    assert isinstance(encoded.payload, torch.Tensor)
    return encoded.payload


def check_twin_bytes(codec: Compressor, x: torch.Tensor, key: StreamKey) -> torch.Tensor:
    """The device payload of ``x`` equals the host payload byte for byte; returns it."""
    host = bytes(codec.encode(x, key).payload)
    device = device_payload(codec, x, key)
    assert bytes(device.numpy()) == host, f"{codec.describe()}: device bytes differ from host"
    return device


def check_device_decode(
    codec: Compressor, x: torch.Tensor, key: StreamKey, side: torch.Tensor | None = None
) -> None:
    """Decoding the device payload gives the host decode's values bit for bit, with at most
    :data:`DECODE_READS` host reads; ``decode_add_`` and ``decode_into_`` agree too."""
    host_payload = bytes(codec.encode(x, key).payload)
    want = codec.decode(host_payload, expected_key=key, shape=x.shape, side=side)
    payload = device_payload(codec, x, key)
    with forced_device_payloads(), cuda_scalar_division(), count_host_reads() as reads:
        got = codec.decode(payload, expected_key=key, shape=x.shape, side=side)
    assert reads.count <= DECODE_READS, reads.describe()
    assert reads.total_bytes <= DECODE_READ_BYTES, reads.describe()
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got.view(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8))
    base = torch.linspace(-1, 1, x.numel()).reshape(x.shape)
    with forced_device_payloads(), cuda_scalar_division():
        added = codec.decode_add_(payload, base.clone(), expected_key=key, side=side)
        into = codec.decode_into_(payload, torch.empty_like(base), expected_key=key, side=side)
    want_added = codec.decode_add_(host_payload, base.clone(), expected_key=key, side=side)
    assert torch.equal(added.view(torch.int32), want_added.view(torch.int32))
    assert torch.equal(into.view(torch.int32), want.to(torch.float32).view(torch.int32))
