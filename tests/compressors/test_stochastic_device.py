"""The stochastic quantizers' device decoders refuse what their host decoders refuse (a body
with a valid CRC but a symbol outside the alphabet, set padding bits, a negative or non-finite
scale, a wrong size), with the host's error; their device helpers run on fake CUDA tensors."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from gradzip.compressors.base import Compressor
from gradzip.compressors.lpc import LPC
from gradzip.compressors.qesgd import QESGD
from gradzip.compressors.qsgd import QSGD
from gradzip.compressors.terngrad import TernGrad
from gradzip.device.mode import forced_device_payloads
from gradzip.errors import PayloadError
from gradzip.kernels.bitpack_device import pack_bits_device, unpack_bits_device
from gradzip.keys import StreamKey
from gradzip.payload import frame_payload, parse_payload
from tests.compressors.device_checks import device_payload

KEY = StreamKey(run_seed=2, rank=0, step=7, tensor_index=4)
N = 999  # 2-bit (and 4-bit) streams of 999 symbols end in padding bits


def _qesgd() -> QESGD:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return QESGD(1e-3, bits=3)


CODECS: dict[str, Callable[[], Compressor]] = {
    "qsgd": lambda: QSGD(s=1, bucket_size=512),
    "terngrad": lambda: TernGrad(bucket_size=None),
    "lpc": lambda: LPC(b=3),
    "qesgd": _qesgd,
}
#: bytes of float32 scales in front of the packed symbols
SCALE_BYTES = {"qsgd": 8, "terngrad": 4, "lpc": 4, "qesgd": 0}


def _reframed(payload: bytes, edit: Callable[[bytearray], bytearray]) -> torch.Tensor:
    header, body = parse_payload(payload)
    data = bytes(frame_payload(header, [bytes(edit(bytearray(body)))]))
    return torch.from_numpy(np.frombuffer(data, dtype=np.uint8).copy())


def _corruptions(name: str) -> dict[str, Callable[[bytearray], bytearray]]:
    k = SCALE_BYTES[name]

    def padding(b: bytearray) -> bytearray:
        b[-1] |= 0x80
        return b

    def symbol(b: bytearray) -> bytearray:
        b[k] = 0xFF  # s = 1: symbol 3 of an alphabet of 3; lpc b = 3: symbol 7 of 7
        return b

    def negative(b: bytearray) -> bytearray:
        b[3] |= 0x80
        return b

    def nan(b: bytearray) -> bytearray:
        b[0:4] = np.array([np.nan], dtype=np.float32).tobytes()
        return b

    def longer(b: bytearray) -> bytearray:
        return b + b"\0"

    out = {"padding": padding, "longer": longer}
    if name != "qesgd":  # every 3-bit code is a valid two's complement value
        out.update(symbol=symbol, negative=negative, nan=nan)
    return out


@pytest.mark.parametrize("name", list(CODECS))
def test_a_malformed_body_gets_the_host_error(name: str) -> None:
    codec = CODECS[name]()
    x = torch.randn(N, generator=torch.Generator().manual_seed(3)) * 1e-2
    host = bytes(codec.encode(x, KEY).payload)
    assert bytes(device_payload(codec, x, KEY).numpy()) == host
    for what, edit in _corruptions(name).items():
        bad = _reframed(host, edit)
        with pytest.raises(PayloadError) as on_host:
            codec.decode(bytes(bad.numpy()), expected_key=KEY, shape=x.shape)
        with forced_device_payloads(), pytest.raises(PayloadError) as on_device:
            codec.decode(bad, expected_key=KEY, shape=x.shape)
        assert type(on_device.value) is type(on_host.value), what
        assert str(on_device.value) == str(on_host.value), what


@pytest.mark.parametrize("bits", [1, 2, 3, 5, 8, 11, 16, 24])
@pytest.mark.parametrize("n", [1, 7, 8, 9, 100])
def test_packing_round_trips_and_matches_the_host_layout(bits: int, n: int) -> None:
    from gradzip.codecs.bitpack import pack_bits

    g = torch.Generator().manual_seed(bits * 1000 + n)
    symbols = torch.randint(0, 2**bits, (n,), generator=g, dtype=torch.int64)
    packed = pack_bits_device(symbols, bits)
    assert bytes(packed.numpy()) == bytes(pack_bits(symbols, bits).numpy())
    back, clean = unpack_bits_device(packed, n, bits)
    assert torch.equal(back, symbols) and bool(clean)


def test_packing_runs_on_fake_cuda_tensors() -> None:
    with FakeTensorMode(allow_non_fake_inputs=True):
        symbols = torch.zeros(37, dtype=torch.int64, device="cuda")
        packed = pack_bits_device(symbols, 5)
        back, clean = unpack_bits_device(packed, 37, 5)
        assert packed.numel() == 24 and back.numel() == 37 and clean.dim() == 0


@pytest.mark.parametrize("name", list(CODECS))
def test_device_decoder_runs_on_fake_cuda_tensors(name: str) -> None:
    """The body decoder itself (the base reads the header on the host, which a fake tensor has
    no values for) runs on fake CUDA tensors: no slicing, no host read."""
    codec = CODECS[name]()
    header, body = parse_payload(bytes(codec.encode(torch.randn(N) * 1e-2, KEY).payload))
    with FakeTensorMode(allow_non_fake_inputs=True):
        fake = torch.empty(len(body), dtype=torch.uint8, device="cuda")
        values, ok = codec._decode_device(fake, header, None)
        assert values.device.type == "cuda" and values.shape == (N,)
        assert ok is not None and ok.dim() == 0
