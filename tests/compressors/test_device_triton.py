"""The device codecs' Triton route (:mod:`gradzip.kernels.triton_device`), checked on CPU tensors
under Triton's interpreter: each wired codec's device payload equals the host payload byte for
byte and decodes to the host decode's values, the kernels were really launched (counted, so a
silent fall back to the torch operations fails), and the route reads nothing back on encode
(the interpreter's own access to its CPU tensors is not a read the instrument sees; the grid
of every launch is checked to be host integers).

The interpreted kernel modules come from :func:`tests.kernels.triton_modes.load_kernels` and are
registered in ``sys.modules`` for the test's duration (the route looks them up there). Sizes
are kept small: the interpreter runs a 1024-element program in NumPy, one program at a time.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from gradzip.compressors import registry
from gradzip.compressors.base import Compressor
from gradzip.device.host_reads import count_host_reads
from gradzip.device.mode import forced_device_payloads
from gradzip.kernels.triton_dispatch import forced_triton, triton_installed
from gradzip.keys import StreamKey
from tests.compressors.device_checks import DECODE_READS
from tests.kernels.triton_modes import Counted, load_kernels

pytestmark = pytest.mark.skipif(not triton_installed(), reason="triton is not installed")

KEY = StreamKey(run_seed=11, rank=2, step=5, tensor_index=1)

#: (codec, params, shape, the kernels its encode and decode launch)
CASES: list[tuple[str, dict[str, Any], tuple[int, ...], tuple[str, ...]]] = [
    ("dqsg", {"M": 1, "bucket_size": 512}, (1500,), ("encode", "decode_affine")),
    ("dqsg", {"M": 7, "bucket_size": None}, (37,), ("encode", "decode_affine")),
    ("dqsg", {"M": 200, "bucket_size": 100}, (1030,), ("encode", "decode_affine")),
    ("qsgd", {"s": 3, "bucket_size": 256}, (1500,), ("symmetric_encode", "symmetric_decode")),
    ("qsgd", {"s": 200, "bucket_size": None}, (9,), ("symmetric_encode", "symmetric_decode")),
    ("terngrad", {"bucket_size": 512}, (33, 65), ("symmetric_encode", "symmetric_decode")),
    ("terngrad", {"bucket_size": None}, (1,), ("symmetric_encode", "symmetric_decode")),
    (
        "half_dither",
        {"M": 1, "dither_sum": 2, "bucket_size": 300},
        (700,),
        ("encode", "decode_affine"),
    ),
    ("lpc", {"b": 3, "theta": 0.5}, (300,), ("symmetric_encode", "symmetric_decode")),
    ("onebit", {"group": "out"}, (33, 65), ("pack", "expand")),
    ("onebit", {"group": "in"}, (5, 7), ("pack", "expand")),
]

#: module attribute -> counted name
KERNELS = {
    ("dithered", "_encode_kernel"): "encode",
    ("dithered", "_decode_affine_kernel"): "decode_affine",
    ("stochastic", "_symmetric_encode_kernel"): "symmetric_encode",
    ("stochastic", "_symmetric_decode_kernel"): "symmetric_decode",
    ("signs", "_pack_kernel"): "pack",
    ("signs", "_expand_kernel"): "expand",
    ("signs", "_residual_kernel"): "residual",
    ("crc32", "_crc32_kernel"): "crc32",
}


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Interpreted kernels registered and their launches counted, CPU tensors let through by
    ``forced_triton``."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    kernels: SimpleNamespace = load_kernels(interpret=True)
    for short in ("dithered", "stochastic", "signs", "crc32"):
        monkeypatch.setitem(sys.modules, f"gradzip.kernels.triton_{short}", getattr(kernels, short))
    calls: Counter[str] = Counter()
    for (short, attr), name in KERNELS.items():
        module = getattr(kernels, short)
        monkeypatch.setattr(module, attr, Counted(getattr(module, attr), name, calls))
    with forced_triton():
        yield calls


def gradient(shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g) * torch.rand(shape, generator=g).pow(3) * 3e-3


def make(name: str, params: dict[str, Any]) -> Compressor:
    codec = registry.get(name)(**params)
    assert codec.device_resident
    return codec


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(
        a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)
    )


@pytest.mark.parametrize(("name", "params", "shape", "kernels"), CASES)
def test_triton_device_payload_and_decode_equal_host(
    launches: Counter[str],
    name: str,
    params: dict[str, Any],
    shape: tuple[int, ...],
    kernels: tuple[str, ...],
) -> None:
    codec = make(name, params)
    x = gradient(shape)
    host = bytes(codec.encode(x, KEY).payload)
    want = codec.decode(host, expected_key=KEY, shape=x.shape)
    assert not launches, "the host path launched a Triton kernel"
    with forced_device_payloads():
        with count_host_reads() as reads:
            payload = codec.encode(x, KEY).payload
        assert reads.count == 0, reads.describe()
        assert isinstance(payload, torch.Tensor)
        assert launches[kernels[0]] == 1, launches
        assert launches["crc32"] >= 1, launches  # the frame's checksum in the kernel
        with count_host_reads() as reads:
            got = codec.decode(payload, expected_key=KEY, shape=x.shape)
        assert reads.count <= DECODE_READS, reads.describe()
        base = torch.linspace(-1, 1, x.numel()).reshape(x.shape)
        added = codec.decode_add_(payload, base.clone(), expected_key=KEY)
    assert launches[kernels[1]] >= 1, launches
    assert bytes(payload.numpy()) == host, f"{codec.describe()}: Triton bytes differ from host"
    assert same_bits(got, want)
    want_added = codec.decode_add_(host, base.clone(), expected_key=KEY)
    assert same_bits(added, want_added)


def test_triton_ndqsg_encode_equals_host(launches: Counter[str]) -> None:
    """NDQSG's encode takes the dithered kernel too (its nested decode stays torch operations)."""
    codec = make("ndqsg", {"L1": 3, "k": 3, "alpha": 1.0, "bucket_size": 256})
    x = gradient((600,), seed=2)
    host = bytes(codec.encode(x, KEY).payload)
    with forced_device_payloads(), count_host_reads() as reads:
        payload = codec.encode(x, KEY).payload
    assert reads.count == 0, reads.describe()
    assert launches["encode"] == 1, launches
    assert isinstance(payload, torch.Tensor) and bytes(payload.numpy()) == host


def test_triton_decode_flags_bad_streams(launches: Counter[str]) -> None:
    """The launchers' flags: a symbol past the alphabet (a field of all ones in a 2-bit stream
    of 3 symbols) or a set padding bit clears them, a clean stream sets them; the sign
    expansion flags a set padding bit (the base then decodes on the host and raises)."""
    from gradzip.kernels.triton_device import dithered_values, signs_expanded, symmetric_values

    n = 5  # 10 bits: 2 bytes, 6 padding bits
    clean = torch.tensor([0b10010010, 0b00000001], dtype=torch.uint8)
    outside = torch.tensor([0b11010010, 0b00000001], dtype=torch.uint8)
    padded = torch.tensor([0b10010010, 0b00000101], dtype=torch.uint8)
    scales = torch.tensor([0.5])
    flags = {}
    for label, data in (("clean", clean), ("outside", outside), ("padding", padded)):
        _, sym_ok = symmetric_values(data, n, scales, 1, 0)
        _, dit_ok = dithered_values(data, n, 3, scales, 0, 1.0, 0.5, True, 3, 0, False)
        flags[label] = (bool(sym_ok), bool(dit_ok))
    assert flags == {"clean": (True, True), "outside": (False, False), "padding": (False, False)}
    means = torch.tensor([[0.25, -0.5]])
    packed = torch.tensor([[0b101, 0, 0, 0]], dtype=torch.uint8)
    values, ok = signs_expanded(packed, means, 3)
    assert bool(ok) and values.tolist() == [[0.25, -0.5, 0.25]]
    assert not bool(signs_expanded(packed | 0b1000, means, 3)[1])
    assert launches["symmetric_decode"] == 3 and launches["decode_affine"] == 3
    assert launches["expand"] == 2


@pytest.mark.parametrize("group", ["out", "in"])
@pytest.mark.parametrize("reconstruct", [False, True])
def test_triton_onebit_feedback_equals_host(
    launches: Counter[str], group: str, reconstruct: bool
) -> None:
    codec = make("onebit", {"group": group})
    v = gradient((33, 65), seed=4)
    host_v, dev_v = v.clone(), v.clone()
    host = codec.encode_with_feedback(host_v, KEY, reconstruct=reconstruct)
    with forced_device_payloads(), count_host_reads() as reads:
        device = codec.encode_with_feedback(dev_v, KEY, reconstruct=reconstruct)
    assert reads.count == 0, reads.describe()
    assert launches["pack"] == 1 and launches["residual"] == 1, launches
    assert host is not None and device is not None
    assert isinstance(device[0].payload, torch.Tensor)
    assert bytes(device[0].payload.numpy()) == bytes(host[0].payload)
    assert same_bits(dev_v, host_v)
    if reconstruct:
        assert host[1] is not None and device[1] is not None
        assert same_bits(device[1], host[1])
    else:
        assert device[1] is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(("name", "params", "shape", "kernels"), CASES)
def test_triton_route_on_cuda_equals_host(
    name: str, params: dict[str, Any], shape: tuple[int, ...], kernels: tuple[str, ...]
) -> None:
    """On a GPU (compiled kernels, the route taken because the tensor is on CUDA): the device
    payload equals the host payload and decodes to the host decode's values, with nothing read
    back on encode."""
    from gradzip.kernels.triton_device import use_triton

    codec = make(name, params)
    x = gradient(shape)
    host = bytes(codec.encode(x, KEY).payload)
    want = codec.decode(host, expected_key=KEY, shape=x.shape)
    xd = x.cuda()
    assert use_triton(xd)
    with count_host_reads() as reads:
        payload = codec.encode(xd, KEY).payload
    assert reads.count == 0, reads.describe()
    assert isinstance(payload, torch.Tensor) and payload.is_cuda
    assert bytes(payload.cpu().numpy()) == host
    got = codec.decode(payload, expected_key=KEY, shape=x.shape)
    assert same_bits(got.cpu(), want)
