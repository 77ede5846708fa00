"""RankPool: persistent simulated ranks, the same transports on every call."""

from __future__ import annotations

import gc
import threading
import time

import pytest
import torch

from gradzip import create
from gradzip.comm.local import LocalTransport, run_local
from gradzip.comm.pool import RankPool
from gradzip.errors import GradzipError
from gradzip.schemes import make_scheme
from gradzip.sync import GradientSync


def _pool_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("gradzip-rank-")]


def test_results_in_rank_order() -> None:
    with RankPool(5) as pool:
        for _ in range(3):
            assert pool.run(lambda t: (t.rank, t.world_size)) == [(r, 5) for r in range(5)]


def test_ranks_run_concurrently_on_their_own_threads() -> None:
    barrier = threading.Barrier(4, timeout=10)  # passes only if all 4 ranks run at once

    def meet(t: LocalTransport) -> str:
        barrier.wait()
        return threading.current_thread().name

    with RankPool(4) as pool:
        names = pool.run(meet)
        assert names == [f"gradzip-rank-{r}" for r in range(4)]
        assert pool.run(lambda t: threading.current_thread().name) == names


def test_transports_persist_and_meters_accumulate() -> None:
    with RankPool(3) as pool:
        seen = pool.run(lambda t: t)
        assert seen == pool.transports
        gathered = []
        for i in range(4):

            def gather(t: LocalTransport, i: int = i) -> list[bytes]:
                return t.all_gather_bytes(bytes([t.rank, i]))

            gathered.append(pool.run(gather))
        assert pool.run(lambda t: t) == seen
    for i, per_rank in enumerate(gathered):
        assert per_rank == [[bytes([r, i]) for r in range(3)]] * 3
    for t in seen:  # 4 calls, each: 2 ring rounds of one 2-byte payload + 8-byte prefix
        assert t.meter.total(collective="all_gather").sent == 4 * 2 * 10
        assert t.meter.total().received == 4 * 2 * 10


def test_collectives_across_calls_match_run_local() -> None:
    def step(t: LocalTransport) -> bytes:
        gathered = t.all_gather_bytes(bytes([t.rank] * (t.rank + 1)))
        root = t.broadcast_bytes(b"".join(gathered) if t.rank == 1 else None, root=1)
        return root

    expected = run_local(4, step)
    with RankPool(4) as pool:
        for _ in range(3):
            assert pool.run(step) == expected


def test_per_rank_state_persists_with_gradient_sync() -> None:
    with RankPool(3) as pool:
        syncs = [
            GradientSync(t, scheme=make_scheme("ps[fp32]", create("dqsg", M=2)))
            for t in pool.transports
        ]
        grads = [[torch.full((10,), float(r + 1)), torch.ones(2, 3) * r] for r in range(3)]
        for step in range(2):
            means = pool.run(lambda t: syncs[t.rank].synchronize(grads[t.rank]))
            first = means[0]
            assert first is not None
            for m in means:  # the same average on every rank
                assert m is not None and all(a.equal(b) for a, b in zip(m, first, strict=True))
            assert [s.step for s in syncs] == [step + 1] * 3


def test_exception_names_rank_root_cause_first_and_pool_recovers() -> None:
    def fail_on_2(t: LocalTransport) -> list[bytes]:
        if t.rank == 2:
            raise KeyError("boom")
        return t.all_gather_bytes(b"x")  # the others wait for rank 2 and give up

    with RankPool(4, timeout=30) as pool:
        start = time.monotonic()
        with pytest.raises(
            GradzipError, match=r"^simulated ranks failed: rank 2: KeyError"
        ) as info:
            pool.run(fail_on_2)
        assert time.monotonic() - start < 10  # the others did not wait out the timeout
        assert isinstance(info.value.__cause__, KeyError)
        assert "another rank failed" in str(info.value)
        assert pool.broken is None
        # the wire is clean again: a collective works, and no stale message is delivered
        assert (
            pool.run(lambda t: t.all_gather_bytes(bytes([t.rank])))
            == [[bytes([r]) for r in range(4)]] * 4
        )


def test_first_failed_rank_is_the_cause() -> None:
    def fail(t: LocalTransport) -> None:
        if t.rank in (1, 3):
            raise ValueError(f"bad {t.rank}")

    with RankPool(4) as pool:
        with pytest.raises(GradzipError, match="rank 1: ValueError: bad 1; rank 3") as info:
            pool.run(fail)
        assert str(info.value.__cause__) == "bad 1"
        assert pool.run(lambda t: t.rank) == [0, 1, 2, 3]


def test_timeout_marks_the_pool_broken() -> None:
    def stall(t: LocalTransport) -> bytes:
        if t.rank == 0:
            return t.recv_bytes(1)  # rank 1 never sends
        return b""

    with RankPool(2, timeout=0.2) as pool:
        with pytest.raises(GradzipError, match="rank 0: GradzipError: rank 0: no message"):
            pool.run(stall)
        assert pool.broken is not None and "timed out" in pool.broken
        with pytest.raises(GradzipError, match="broken"):
            pool.run(lambda t: t.rank)


def test_close_joins_threads_and_refuses_more_work() -> None:
    before = len(_pool_threads())
    pool = RankPool(6)
    threads = list(pool._threads)
    assert all(t.daemon and t.is_alive() for t in threads)
    assert len(_pool_threads()) == before + 6
    pool.run(lambda t: None)
    pool.close()
    assert pool.closed and not any(t.is_alive() for t in threads)
    pool.close()  # idempotent
    with pytest.raises(GradzipError, match="closed"):
        pool.run(lambda t: None)
    with RankPool(2) as other:
        inner = list(other._threads)
    assert not any(t.is_alive() for t in inner)
    assert len(_pool_threads()) == before


def test_unclosed_pool_stops_its_threads_when_collected() -> None:
    pool = RankPool(3)
    threads = list(pool._threads)
    pool.run(lambda t: t.rank)
    del pool
    gc.collect()
    for t in threads:
        t.join(timeout=5)
    assert not any(t.is_alive() for t in threads)


def test_run_from_a_rank_is_refused() -> None:
    with RankPool(2) as pool:
        with pytest.raises(GradzipError, match=r"rank 0: GradzipError: RankPool\.run called"):
            pool.run(lambda t: pool.run(lambda u: u.rank) if t.rank == 0 else None)
        assert pool.run(lambda t: t.rank) == [0, 1]


def test_world_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least one rank"):
        RankPool(0)
