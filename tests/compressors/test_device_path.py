"""Every device-resident codec's device path, checked on CPU (see device_checks)."""

from __future__ import annotations

import pytest
import torch

from gradzip.compressors import registry
from gradzip.device.mode import forced_device_payloads
from gradzip.errors import (
    ChecksumMismatchError,
    NonFiniteInputError,
    NonFiniteSenderError,
    PayloadError,
)
from gradzip.keys import StreamKey
from tests.compressors.device_checks import (
    check_device_decode,
    check_twin_bytes,
    device_payload,
    encode_fake_cuda,
)

#: issue 28's list: every one encodes, decodes and averages where the gradient lives
REQUIRED = (
    "dqsg", "ndqsg", "half_dither", "qsgd", "terngrad", "hou", "lpc", "qesgd", "onebit",
    "fp16", "bf16", "identity", "topk", "randk",
)  # fmt: skip
KEY = StreamKey(run_seed=7, rank=1, step=3, tensor_index=2)
SHAPES = [(1,), (7,), (1000,), (33, 65), (4097,)]


def make(name: str) -> registry.Compressor:
    cls = registry.get(name)
    return cls(**cls.example_params)


# per instance: a codec's device_resident may depend on its configuration (e.g. its packing)
DEVICE_CODECS = [n for n in registry.names() if make(n).device_resident]


def gradient(shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g) * torch.rand(shape, generator=g).pow(3) * 3e-3


@pytest.mark.parametrize("name", REQUIRED)
def test_required_codec_is_device_resident(name: str) -> None:
    assert make(name).device_resident, f"{name} has no device path yet"


@pytest.mark.parametrize("name", DEVICE_CODECS)
@pytest.mark.parametrize("shape", [(1000,), (33, 65)])
def test_encodes_fake_cuda_tensor_without_host_reads(name: str, shape: tuple[int, ...]) -> None:
    codec = make(name)
    size = encode_fake_cuda(codec, shape, KEY)
    assert size == len(codec.encode(gradient(shape), KEY).payload)


@pytest.mark.parametrize("name", DEVICE_CODECS)
@pytest.mark.parametrize("shape", SHAPES)
def test_device_bytes_equal_host_bytes(name: str, shape: tuple[int, ...]) -> None:
    check_twin_bytes(make(name), gradient(shape, seed=len(shape)), KEY)


@pytest.mark.parametrize("name", DEVICE_CODECS)
@pytest.mark.parametrize("scale", [0.0, 1e-30, 1.0, 3e30])
def test_device_bytes_equal_host_bytes_across_scales(name: str, scale: float) -> None:
    check_twin_bytes(make(name), gradient((2049,), seed=5) * scale, KEY)


@pytest.mark.parametrize(
    "name", [n for n in DEVICE_CODECS if not registry.get(n).needs_side_information]
)
@pytest.mark.parametrize("shape", SHAPES)
def test_device_decode_equals_host_decode(name: str, shape: tuple[int, ...]) -> None:
    check_device_decode(make(name), gradient(shape, seed=3), KEY)


@pytest.mark.parametrize("name", DEVICE_CODECS)
def test_non_finite_input_is_flagged_and_never_decodes(name: str) -> None:
    codec = make(name)
    x = gradient((500,))
    x[17] = float("nan")
    with forced_device_payloads():
        encoded = codec.encode(x, KEY)
        with pytest.raises(NonFiniteInputError):
            encoded.verify()
        side = torch.zeros(500) if codec.needs_side_information else None
        with pytest.raises(NonFiniteSenderError, match="NaN or Inf"):
            codec.decode(encoded.payload, expected_key=KEY, shape=x.shape, side=side)


@pytest.mark.parametrize("name", DEVICE_CODECS)
def test_corrupt_device_payload_gets_the_host_error(name: str) -> None:
    codec = make(name)
    x = gradient((999,), seed=9)
    payload = device_payload(codec, x, KEY).clone()
    side = torch.zeros(999) if codec.needs_side_information else None
    flipped = payload.clone()
    flipped[len(flipped) // 2] ^= 0x10
    with forced_device_payloads(), pytest.raises(ChecksumMismatchError):
        codec.decode(flipped, expected_key=KEY, shape=x.shape, side=side)
    with forced_device_payloads(), pytest.raises(PayloadError):
        codec.decode(payload[:-3], expected_key=KEY, shape=x.shape, side=side)
    with forced_device_payloads(), pytest.raises(PayloadError):
        codec.decode(payload, expected_key=StreamKey(run_seed=8), shape=x.shape, side=side)


@pytest.mark.parametrize("params", [{"b": 2}, {"b": 8, "scaled": True}])
def test_hou_device_bytes_equal_host_bytes_for_an_all_zero_tensor(
    params: dict[str, object],
) -> None:
    """Hou's scale of ``+0.0`` entries is ``+0.0`` on both paths (its device path once took the
    dithered quantizers' ``max(-min, max)``, which gives ``-0.0`` there)."""
    check_twin_bytes(registry.get("hou")(**params), torch.zeros(37), KEY)
