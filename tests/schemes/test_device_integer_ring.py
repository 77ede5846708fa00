"""The integer all-reduce on the device (forced device payloads on simulated ranks): every
rank's result equals the host path's bit for bit, the messages are the host messages' bytes,
two host reads per call, and a corrupt message is refused by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import gradzip
from gradzip.comm.local import LocalTransport, run_local
from gradzip.comm.transport import Transport
from gradzip.device.host_reads import count_host_reads
from gradzip.device.mode import forced_device_payloads
from gradzip.errors import CorruptPayloadError, GradzipError, NonFiniteInputError
from gradzip.keys import StreamKey
from gradzip.schemes import make_scheme
from gradzip.schemes._device_grid import device_grid
from gradzip.schemes._device_messages import (
    Checks,
    pack_floats_device,
    pack_ints_device,
    unpack_ints_device,
)
from gradzip.schemes._messages import pack_floats, pack_ints

#: (codec, parameters): every configuration with a device grid, buckets and clipping included
CODECS: list[tuple[str, dict[str, Any]]] = [
    ("dqsg", {"M": 1}),
    ("dqsg", {"M": 3, "bucket_size": 16}),
    ("dqsg", {"M": 2, "clip_std": 1.5}),
    ("dqsg", {"M": 200}),
    ("qsgd", {"s": 1}),
    ("qsgd", {"s": 4, "bucket_size": 16}),
    ("qsgd", {"s": 300}),
    ("terngrad", {}),
    ("hou", {}),
]


def codec(name: str, params: dict[str, Any]) -> gradzip.Compressor:
    return gradzip.get(name)(**params)


def gradient(rank: int, step: int, shape: tuple[int, ...] = (13, 7)) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(shape, generator=gen) * (1 + rank)


def scheme_steps(
    scheme_name: str, steps: int, name: str, params: dict[str, Any], ef: bool = False
) -> Callable[[Transport], list[torch.Tensor]]:
    """One simulated rank's work: ``steps`` reductions of its gradients by ``scheme_name``."""

    def run(transport: Transport) -> list[torch.Tensor]:
        scheme = make_scheme(scheme_name, codec(name, params), run_seed=3, error_feedback=ef)
        return [scheme.reduce(transport, gradient(transport.rank, s), s, 0) for s in range(steps)]

    return run


def reduce_steps(
    name: str, params: dict[str, Any], ef: bool = False
) -> Callable[[Transport], list[torch.Tensor]]:
    """Three integer all-reduce steps."""
    return scheme_steps("allreduce", 3, name, params, ef)


def ring_steps(
    name: str, params: dict[str, Any], ef: bool = False
) -> Callable[[Transport], list[torch.Tensor]]:
    """Two ring all-reduce steps."""
    return scheme_steps("ring", 2, name, params, ef)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int64)


def assert_device_equals_host(
    world_size: int, work: Callable[[Transport], list[torch.Tensor]]
) -> None:
    """``work`` on ``world_size`` simulated ranks gives every rank the same results, bit for
    bit, through forced device payloads as through the host path."""
    host = run_local(world_size, work)
    with forced_device_payloads():
        device = run_local(world_size, work)
    for host_rank, device_rank in zip(host, device, strict=True):
        for h, d in zip(host_rank, device_rank, strict=True):
            assert d.dtype == h.dtype and d.shape == h.shape
            assert torch.equal(bits(d), bits(h))


def assert_corrupt_message_refused(
    monkeypatch: pytest.MonkeyPatch, collective: str, work: Callable[[Transport], Any]
) -> None:
    """With one body byte of what rank 1 receives in ``collective`` flipped (its CRC left as
    sent), ``work`` on three ranks fails with a :class:`CorruptPayloadError` naming rank 1."""
    original = LocalTransport.exchange_bytes

    def flip(self: LocalTransport, dst: int, data: Any, src: int, name: str) -> Any:
        got = original(self, dst, data, src, name)
        if self.rank == 1 and name == collective and isinstance(got, torch.Tensor):
            got = got.clone()
            got[got.numel() - 6] ^= 0x5A  # a body byte, CRC left as sent
        return got

    monkeypatch.setattr(LocalTransport, "exchange_bytes", flip)
    with forced_device_payloads(), pytest.raises(GradzipError) as info:
        run_local(3, work, timeout=10)
    assert isinstance(info.value.__cause__, CorruptPayloadError), info.value
    assert "rank 1" in str(info.value)


@pytest.mark.parametrize(("name", "params"), CODECS)
def test_every_listed_codec_has_a_device_grid(name: str, params: dict[str, Any]) -> None:
    assert device_grid(codec(name, params)) is not None


def test_lpc_keeps_the_host_path() -> None:
    assert device_grid(codec("lpc", {})) is None


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("ef", [False, True])
@pytest.mark.parametrize(("name", "params"), CODECS)
def test_device_allreduce_equals_the_host_path_bit_for_bit(
    name: str, params: dict[str, Any], world_size: int, ef: bool
) -> None:
    assert_device_equals_host(world_size, reduce_steps(name, params, ef))


@pytest.mark.parametrize("n", [0, 1, 7, 8, 33])
@pytest.mark.parametrize("width", [1, 3, 8, 12, 17, 31])
def test_device_messages_hold_the_host_bytes(n: int, width: int) -> None:
    key = StreamKey(3, 1, 2, 0, 5)
    values = torch.randint(0, 2**width, (n,), generator=torch.Generator().manual_seed(n))
    message = pack_ints_device(values.to(torch.int32), width, key)
    assert bytes(message.numpy()) == pack_ints(values, width, key)
    checks = Checks(torch.device("cpu"))
    back = unpack_ints_device(message, n, width, key, checks)
    assert torch.equal(back, values.to(torch.int32))
    checks.verify()
    floats = torch.randn(n)
    assert bytes(pack_floats_device(floats, key).numpy()) == pack_floats(floats, key)


def test_two_host_reads_per_call() -> None:
    world_size, steps = 3, 3
    with forced_device_payloads(), count_host_reads() as reads:
        run_local(world_size, reduce_steps("dqsg", {"M": 3, "bucket_size": 16}))
    assert reads.count == 2 * world_size * steps, reads.describe()
    assert reads.largest <= 8 * 3, reads.describe()  # flags only: a byte per message


def test_a_corrupt_message_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    assert_corrupt_message_refused(monkeypatch, "allreduce", reduce_steps("dqsg", {"M": 3}))


def test_non_finite_input_is_refused_before_anything_is_updated() -> None:
    def run(transport: Transport) -> None:
        scheme = make_scheme("allreduce", codec("dqsg", {"M": 3}), run_seed=3)
        g = gradient(transport.rank, 0)
        if transport.rank == 0:
            g.view(-1)[5] = float("nan")
        scheme.reduce(transport, g, 0, 0)

    with forced_device_payloads(), pytest.raises(GradzipError) as info:
        run_local(2, run, timeout=10)
    message = str(info.value)
    assert "rank 0: NonFiniteInputError" in message
    assert "rank 1: CorruptPayloadError" in message and "NaN or Inf" in message
    assert isinstance(info.value.__cause__, NonFiniteInputError)


@pytest.mark.parametrize(("name", "params"), CODECS)
def test_the_device_steps_run_on_fake_cuda(name: str, params: dict[str, Any]) -> None:
    """Every device step of one rank (scale message, symbols, ring message, mean) on fake CUDA
    tensors, where a host read or a forbidden indexing would raise."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from gradzip.schemes._device_grid import net_levels_device, values_device
    from gradzip.schemes._device_messages import spoiled, unpack_floats_device

    c = codec(name, params)
    grid = device_grid(c)
    common = c.common_grid()
    assert grid is not None and common is not None
    key = StreamKey(3, 0, 0, 0, 0)
    with FakeTensorMode(allow_non_fake_inputs=True):
        x = grid.prepare(torch.randn(91, device="cuda"))
        checks = Checks(x.device)
        scales = unpack_floats_device(
            pack_floats_device(grid.statistic(x), key), grid.statistic(x).numel(), key, checks
        )
        symbols = grid.symbols(x, scales, key).to(torch.int32)
        message = spoiled(pack_ints_device(symbols, 12, key), checks.all_ok())
        sums = unpack_ints_device(message, 91, 12, key, checks)
        levels = net_levels_device(grid, sums, [key, key], common.grid_levels(), False)
        mean = values_device(grid, levels, scales, 2, common.grid_bucket_size(91))
        assert mean.device.type == "cuda" and mean.shape == (91,)


RING_CODECS = [*CODECS, ("fp16", {}), ("onebit", {}), ("topk", {"ratio": 0.25})]


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("ef", [False, True])
@pytest.mark.parametrize(("name", "params"), RING_CODECS)
def test_device_ring_equals_the_host_path_bit_for_bit(
    name: str, params: dict[str, Any], world_size: int, ef: bool
) -> None:
    c = codec(name, params)
    if not c.device_resident:
        pytest.skip(f"{c.describe()} is not device resident")
    assert_device_equals_host(world_size, ring_steps(name, params, ef))


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ring_host_reads_per_call(world_size: int) -> None:
    """Per rank and call: one finiteness flag per own payload (``P``: ``P - 1`` reduce-scatter
    slices and the summed slice), a header prefix and a flag per decoded payload (``2 (P - 1)``
    received, plus the owner's own summed slice): ``5P - 2`` reads, none over 128 bytes."""
    with forced_device_payloads(), count_host_reads() as reads:
        run_local(world_size, ring_steps("dqsg", {"M": 3}))
    assert reads.count == (5 * world_size - 2) * world_size * 2, reads.describe()
    assert reads.largest <= 128, reads.describe()


def test_a_corrupt_ring_message_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    assert_corrupt_message_refused(monkeypatch, "reduce_scatter", ring_steps("dqsg", {"M": 3}))
