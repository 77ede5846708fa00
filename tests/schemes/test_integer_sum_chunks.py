"""The integer all-reduce's code sum in chunks: the exact sums of every chunking on every rank,
the bytes of one chunk plus a header and slot length a message, and a bad message of a later
chunk refused with the error of one chunk."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import torch

import gradzip
from gradzip.comm.local import LocalTransport, run_local
from gradzip.comm.transport import Payload, Transport
from gradzip.errors import GradzipError, TruncatedPayloadError
from gradzip.keys import StreamKey
from gradzip.schemes import make_scheme
from gradzip.schemes._ring_ints import ring_allreduce_ints
from gradzip.schemes.ring_allreduce import RingAllreduce
from tests.schemes.test_ring_allreduce import reduce_twice

if TYPE_CHECKING:
    from tests.conftest import RunSimulatedAndProcesses

TOP = 2  # QSGD s = 1 / TernGrad / DQSG M = 1: codes in [0, 2]


def codes(rank: int, n: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(100 + rank)
    return torch.randint(0, TOP + 1, (n,), generator=gen, dtype=torch.int32)


def key(rank: int, number: int) -> StreamKey:
    return StreamKey(9, 3, 1, rank, number)


def summed(t: Transport, n: int, chunk_values: int | None) -> tuple[torch.Tensor, int, int]:
    """The sum, and the bytes and messages this rank sent."""
    out = ring_allreduce_ints(t, codes(t.rank, n), TOP, key, chunk_values=chunk_values)
    total = t.meter.total()
    return out.clone(), total.sent, total.messages


@pytest.mark.parametrize("world_size", [2, 3, 5])
@pytest.mark.parametrize("n", [1, 4, 1001])
@pytest.mark.parametrize("chunk_values", [None, 1, 7, 250, 1 << 22])
def test_every_chunking_gives_every_rank_the_exact_sum(
    world_size: int, n: int, chunk_values: int | None
) -> None:
    truth = torch.stack([codes(rank, n) for rank in range(world_size)]).sum(0, dtype=torch.int32)
    results = run_local(world_size, lambda t: summed(t, n, chunk_values))
    for out, _, _ in results:
        assert out.dtype == torch.int32
        assert torch.equal(out, truth)


def test_chunks_cost_only_their_headers() -> None:
    """Four chunks send four times the messages of one, and at most their headers and slot
    lengths more bytes (the packed codes are the same bits, cut at other places)."""
    n, world_size = 40_000, 4
    one = run_local(world_size, lambda t: summed(t, n, None))
    whole = run_local(world_size, lambda t: summed(t, n, n))
    assert [(s, m) for _, s, m in one] == [(s, m) for _, s, m in whole]
    four = run_local(world_size, lambda t: summed(t, n, n // 4))
    for (_, bytes_one, messages_one), (_, bytes_four, messages_four) in zip(one, four, strict=True):
        assert messages_four == 4 * messages_one
        extra_messages = messages_four - messages_one
        assert bytes_one < bytes_four <= bytes_one + extra_messages * 64


@pytest.mark.slow
@pytest.mark.distributed
def test_chunks_give_the_bits_of_one_chunk_in_processes_and_in_threads(
    simulated_and_processes: RunSimulatedAndProcesses,
) -> None:
    """gloo's all-to-all and all-gather from the worker thread, several chunks in flight: the
    same means as one chunk, in real processes as in simulated ranks."""
    whole = run_local(3, lambda t: reduce_twice(t, "allreduce[chunk_values=null]", "qsgd", True))
    runs = simulated_and_processes(3, reduce_twice, "allreduce[chunk_values=100]", "qsgd", True)
    for rank in range(3):
        assert runs.processes[rank] == runs.simulated[rank] == whole[rank] == whole[0]


class _TruncatingTransport(LocalTransport):
    """Rank 0's transport cuts the last byte off what the ``which``-th all-gather brings."""

    def __init__(self, inner: LocalTransport, which: int) -> None:
        self.__dict__.update(inner.__dict__)
        self._which, self._calls = which, 0

    def all_gather_bytes(
        self, payload: Payload, collective: str = "all_gather", *, expected_size: int | None = None
    ) -> list[Payload]:
        got = super().all_gather_bytes(payload, collective, expected_size=expected_size)
        self._calls += 1
        if self._calls == self._which:
            got = [bytes(message)[:-1] if i == 1 else message for i, message in enumerate(got)]
        return got


def test_a_truncated_message_of_a_later_chunk_is_refused() -> None:
    def run(t: LocalTransport) -> torch.Tensor:
        transport = _TruncatingTransport(t, which=3) if t.rank == 0 else t
        return ring_allreduce_ints(transport, codes(t.rank, 1000), TOP, key, chunk_values=100)

    with pytest.raises(GradzipError) as failure:
        run_local(2, run, timeout=10.0)
    # rank 0's own refusal of the message, not a peer giving up waiting
    assert isinstance(failure.value.__cause__, TruncatedPayloadError)
    assert "rank 0: TruncatedPayloadError" in str(failure.value)


def test_chunk_values_must_be_a_positive_int() -> None:
    def run(t: Transport) -> torch.Tensor:
        return ring_allreduce_ints(t, codes(t.rank, 10), TOP, key, chunk_values=0)

    with pytest.raises(
        GradzipError, match="ValueError: chunk_values must be a positive int or None"
    ):
        run_local(2, run)


def test_ring_allreduce_is_always_chunked() -> None:
    with pytest.raises(ValueError, match="ring_allreduce: chunk_values must be a positive int"):
        RingAllreduce(gradzip.create("qsgd", s=1), chunk_values=None)  # type: ignore[arg-type]


def test_allreduce_sums_in_chunks_of_a_mebi_value_unless_told_otherwise() -> None:
    qsgd = gradzip.create("qsgd", s=1)
    assert make_scheme("allreduce", qsgd).chunk_values == 1 << 20  # type: ignore[attr-defined]
    one = make_scheme("allreduce[chunk_values=none]", qsgd)
    assert one.chunk_values is None  # type: ignore[attr-defined]
