"""The DDP hook on the device path (issue 28), without a GPU and without DDP: each bucket job
run inside :func:`~gradzip.device.mode.forced_device_payloads` on simulated ranks gives the host
path's means bit for bit, and the hook itself reads back only a fixed number of small values
per bucket (payload length prefixes, one finite flag), never gradient-sized data."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import pytest
import torch

import gradzip
from gradzip.comm.local import run_local
from gradzip.comm.transport import Transport
from gradzip.device.host_reads import HostReads, count_host_reads
from gradzip.device.mode import forced_device_payloads
from gradzip.integrations._finite import bucket_finite
from gradzip.integrations._messages import joined, split
from gradzip.integrations.ddp import GradzipHookState
from gradzip.schemes import AllGatherDecode, make_scheme
from gradzip.schemes.base import Outgoing, Scheme

SHAPES = [(4, 3), (4,), (2, 4), (2,)]
LAYOUT = [(3, 2), (1, 0)]  # two buckets, in DDP's reverse order
STEPS = 2
#: the files whose reads are the hook's own (the rest are the scheme's and the codec's)
HOOK_FILES = ("batch.py", "_messages.py", "_finite.py", "ddp.py", "_layout.py", "_job.py")


class StandInBucket:
    """What the hook uses of ``torch.distributed.GradBucket``."""

    def __init__(self, index: int, last: bool, params: list[torch.Tensor], buffer: torch.Tensor):
        self._index, self._last, self._params, self._buffer = index, last, params, buffer

    def index(self) -> int:
        return self._index

    def is_last(self) -> bool:
        return self._last

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def parameters(self) -> list[torch.Tensor]:
        return self._params


def _tensor(payload: Any) -> Any:
    """Host bytes as a ``uint8`` tensor (a stand-in device payload); empty stays empty bytes."""
    return torch.frombuffer(bytearray(payload), dtype=torch.uint8) if len(payload) else b""


def _bytes(payload: Any) -> bytes:
    return payload.numpy().tobytes() if isinstance(payload, torch.Tensor) else bytes(payload)


class TensorPayloadAllGather(AllGatherDecode):
    """The all-gather handing the hook ``uint8`` tensor payloads, as the device-resident
    all-gather (branch i28-s1) will: the hook's joining, splitting and averaging then see
    device payloads, whatever this branch's scheme and transport do with them. Its own
    conversions are read in this file, so they do not count as the hook's reads."""

    def encode_flagged(self, *args: Any, **kwargs: Any) -> Outgoing:
        out = super().encode_flagged(*args, **kwargs)
        return Outgoing(_tensor(out.payload), out.finite, out.dtype, out.own)

    def gather_flagged(
        self, transport: Transport, outgoing: Outgoing, step: int, expected_size: int | None = None
    ) -> tuple[list[Any], list[int]]:
        sent = Outgoing(_bytes(outgoing.payload), outgoing.finite, outgoing.dtype)
        payloads, down = super().gather_flagged(transport, sent, step, expected_size)
        return [_tensor(p) for p in payloads], down

    def average(self, payloads: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        return super().average([_bytes(p) for p in payloads], *args, **kwargs)


def _scheme(name: str, codec: str, ef: bool) -> Scheme:
    if name == "tensor-allgather":
        return TensorPayloadAllGather(gradzip.create(codec), run_seed=5, error_feedback=ef)
    return make_scheme(name, gradzip.create(codec), run_seed=5, error_feedback=ef)


def _steps(
    transport: Transport, name: str, codec: str, ef: bool, mode: AbstractContextManager[None]
) -> list[torch.Tensor]:
    """``STEPS`` backward passes of ``LAYOUT``'s buckets through the hook: each bucket's result."""
    params = [torch.nn.Parameter(torch.zeros(s)) for s in SHAPES]
    state = GradzipHookState(_scheme(name, codec, ef), torch.nn.ParameterList(params), transport)
    out = []
    with mode:
        for step in range(STEPS):
            gen = torch.Generator().manual_seed(100 * step + transport.rank)
            grads = [torch.randn(s, generator=gen) for s in SHAPES]
            buckets = [
                StandInBucket(
                    k,
                    k == len(LAYOUT) - 1,
                    [params[i] for i in group],
                    torch.cat([grads[i].reshape(-1) for i in group]),
                )
                for k, group in enumerate(LAYOUT)
            ]
            futures = [state.reduce_bucket(b) for b in buckets]  # type: ignore[arg-type]
            out += [f.wait().clone() for f in futures]
    state.close()
    return out


CASES = [
    ("allgather", "fp16", False),
    ("allgather", "identity", False),
    ("allgather", "fp16", True),
    ("tensor-allgather", "fp16", False),
    ("tensor-allgather", "identity", True),
    ("ps", "identity", False),
]


@pytest.mark.parametrize(("name", "codec", "ef"), CASES)
def test_forced_device_buckets_equal_the_host_path(name: str, codec: str, ef: bool) -> None:
    host = run_local(2, lambda t: _steps(t, name, codec, ef, nullcontext()))
    device = run_local(2, lambda t: _steps(t, name, codec, ef, forced_device_payloads()))
    for got, want in zip(device, host, strict=True):
        assert len(got) == len(want) == STEPS * len(LAYOUT)
        for a, b in zip(got, want, strict=True):
            assert a.dtype == b.dtype and torch.equal(a, b)


def _slot_sizes(transport: Transport, mode: AbstractContextManager[None]) -> list[Any]:
    """``(payload bytes, expected_size)`` of each all-gather the hook runs (fp16, pipelined)."""
    seen: list[Any] = []
    original = transport.all_gather_flagged

    def spy(payload, ok, collective="all_gather", **sizes):  # type: ignore[no-untyped-def]
        seen.append((len(payload), sizes.get("expected_size")))
        return original(payload, ok, collective, **sizes)

    transport.all_gather_flagged = spy  # type: ignore[method-assign]
    _steps(transport, "allgather", "fp16", False, mode)
    return seen


def test_the_hook_gathers_fixed_size_device_messages_in_equal_slots() -> None:
    """With device payloads of a size the shapes fix, every message the hook gathers carries
    its exact size (the slot of the one-collective path); host payloads keep the ring."""
    device = run_local(2, lambda t: _slot_sizes(t, forced_device_payloads()))
    host = run_local(2, lambda t: _slot_sizes(t, nullcontext()))
    for calls in device:
        assert calls and all(size == bound for size, bound in calls), calls
    for calls in host:
        assert calls and all(bound is None for _, bound in calls), calls


def _hook_reads(reads: HostReads) -> list[tuple[str, int, str]]:
    return [r for r in reads.records if r[2].split(":")[0] in HOOK_FILES]


@pytest.mark.parametrize("codec", ["fp16", "identity"])
def test_the_hook_reads_only_length_prefixes_of_device_payloads(codec: str) -> None:
    """Pipelined: per bucket and rank, one 12-byte length read per payload of every rank's
    message (units x world size), nothing else of the hook's own."""
    name = "tensor-allgather"
    with count_host_reads() as reads:
        run_local(2, lambda t: _steps(t, name, codec, False, forced_device_payloads()))
    mine = _hook_reads(reads)
    # one message per bucket (these are small): each rank reads the length of each of its
    # units' payloads in every rank's message, i.e. world size x units per bucket and rank
    units = sum(len(group) for group in LAYOUT)
    assert len(mine) == STEPS * 2 * 2 * units, "\n".join(map(str, mine))
    assert all(size <= 12 for _, size, _ in mine), mine


def test_a_non_pipelined_bucket_reads_one_flag() -> None:
    """Not pipelined (the parameter server): the hook's own reads are one one-byte finite flag
    per bucket and rank, whatever the bucket's size."""
    with count_host_reads() as reads:
        run_local(2, lambda t: _steps(t, "ps", "identity", False, forced_device_payloads()))
    mine = _hook_reads(reads)
    assert len(mine) == STEPS * len(LAYOUT) * 2, mine
    assert all(size == 1 and where.startswith("_finite.py") for _, size, where in mine)


def test_bucket_finite_reads_one_byte() -> None:
    flat = torch.randn(1000)
    with count_host_reads() as reads:
        assert bucket_finite(flat)
        flat[17] = float("nan")
        assert not bucket_finite(flat)
        assert bucket_finite(torch.empty(0))
    assert reads.count == 2 and reads.largest == 1


def test_messages_of_device_payloads_split_into_the_same_bytes() -> None:
    codec = gradzip.create("fp16")
    with forced_device_payloads():
        device = [codec.encode(torch.arange(float(n))).payload for n in (3, 0, 5)]
    assert isinstance(device[0], torch.Tensor) and device[1] == b""
    host = [p if isinstance(p, bytes) else p.numpy().tobytes() for p in device]
    message = joined(device, torch.device("cpu"))
    assert isinstance(message, torch.Tensor)
    assert bytes(message.numpy().tobytes()) == joined(host, torch.device("cpu"))
    with count_host_reads() as reads:
        pieces = split(message, [3, 0, 5])
    assert reads.count == 2 and reads.largest == 12  # the empty payload costs no read
    assert [bytes(p.numpy().tobytes()) for p in pieces] == host  # type: ignore[union-attr]
    assert pieces[1].numel() == 0
    with pytest.raises(TypeError):
        joined([device[0], host[0]], torch.device("cpu"))


# -- a real DDP run over gloo: the forced device path trains exactly like the host path --------
DDP_CASES = [
    ("allgather", "fp16", True),
    ("allgather", "identity", False),
    ("tensor-allgather", "fp16", False),
    ("ps", "identity", False),
]
DDP_STEPS = 3


def _ddp_model() -> torch.nn.Module:
    net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.4)
    return net


def _ddp_train(transport: Transport, case: tuple[str, str, bool], forced: bool) -> bytes:
    from torch.nn.parallel import DistributedDataParallel

    from gradzip.integrations.ddp import register_gradzip_hook

    net = _ddp_model()
    ddp = DistributedDataParallel(net, bucket_cap_mb=0.0001)  # several buckets
    state = register_gradzip_hook(ddp, _scheme(*case), transport)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    with forced_device_payloads() if forced else nullcontext():
        for step in range(DDP_STEPS):
            gen = torch.Generator().manual_seed(1000 + 10 * step + transport.rank)
            x = torch.randn(12, 6, generator=gen)
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(x), x.sum(dim=1, keepdim=True).sin()).backward()
            opt.step()
    state.close()
    assert state.step == DDP_STEPS
    return b"".join(p.detach().numpy().tobytes() for p in net.parameters())


def _ddp_runs(transport: Transport) -> dict[Any, bytes]:
    return {
        (case, forced): _ddp_train(transport, case, forced)
        for case in DDP_CASES
        for forced in (False, True)
    }


@pytest.mark.distributed
def test_ddp_over_gloo_on_the_forced_device_path_equals_the_host_path() -> None:
    from gradzip.comm.spawn import run_processes

    for runs in run_processes(2, _ddp_runs, timeout=30.0, run_timeout=240.0):
        for case in DDP_CASES:
            assert runs[case, True] == runs[case, False], case
            assert runs[case, True] != b"".join(
                p.detach().numpy().tobytes() for p in _ddp_model().parameters()
            )
