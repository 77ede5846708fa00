"""A rank that dies or stalls: every other rank raises a clear GradzipError within the timeout,
the harness names what happened to each rank, nothing hangs, and a failed synchronisation step
leaves the error-feedback state and the step counter as they were."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

import gradzip
from gradzip.comm import spawn
from gradzip.comm.distributed import _cuda_only
from gradzip.comm.local import run_local
from gradzip.comm.spawn import DistributedRunError, run_processes
from gradzip.comm.transport import Payload, Transport
from gradzip.errors import GradzipError
from gradzip.schemes import AllGatherDecode
from gradzip.sync import GradientSync

# Each synchronize() of two tensors is two all-gathers, one per tensor (the finite-gradient
# agreement rides on the first). Call 3 is tensor 1 of step 1, after tensor 0 has updated its
# residual.
FAILING_CALL = 3


def same_state(a: Any, b: Any) -> bool:
    """Deep equality of two state dicts holding tensors."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return (
            isinstance(b, dict) and a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
        )
    if isinstance(a, list | tuple):
        return (
            type(a) is type(b)
            and len(a) == len(b)
            and all(same_state(x, y) for x, y in zip(a, b, strict=True))
        )
    return bool(a == b)


def count_all_gathers(transport: Transport, before: Callable[[int], None]) -> list[int]:
    """Call ``before(call_index)`` ahead of each all-gather (every all-gather, flagged or not,
    goes through ``all_gather_flagged``); returns the live call counter."""
    original = transport.all_gather_flagged
    calls = [0]

    def counted(
        payload: bytes, ok: bool, collective: str = "all_gather", expected_size: int | None = None
    ) -> tuple[list[Payload], list[int]]:
        before(calls[0])
        calls[0] += 1
        return original(payload, ok, collective, expected_size=expected_size)

    transport.all_gather_flagged = counted  # type: ignore[method-assign]
    return calls


def failing_step(transport: Transport, culprit: int, action: str, pause: float) -> dict[str, Any]:
    """Two synchronisation steps with error feedback; on rank ``culprit`` the step-1 all-gather
    of tensor 1 is preceded by ``action``: "exit" (os._exit(1)), "sleep" (for ``pause`` s).
    The other ranks report how long the failing step took, the error, and whether the sync
    state is unchanged. Module level, so spawned processes can import it."""

    def before(call: int) -> None:
        if transport.rank == culprit and call == FAILING_CALL:
            if action == "exit":
                os._exit(1)
            time.sleep(pause)

    calls = count_all_gathers(transport, before)
    sync = GradientSync(
        transport, scheme=AllGatherDecode(gradzip.create("topk", k=3), error_feedback=True)
    )
    gen = torch.Generator().manual_seed(transport.rank)
    sync.synchronize([torch.randn(10, generator=gen), torch.randn(7, generator=gen)])
    before_state = sync.state_dict()
    grads = [torch.randn(10, generator=gen), torch.randn(7, generator=gen)]
    start = time.monotonic()
    try:
        sync.synchronize(grads)
    except GradzipError as err:
        return {
            "elapsed": time.monotonic() - start,
            "error": str(err),
            "failed_at_call": calls[0] - 1,
            "unchanged": same_state(before_state, sync.state_dict()) and sync.step == 1,
        }
    return {"elapsed": time.monotonic() - start, "error": None}


@pytest.mark.distributed
def test_a_dead_rank_makes_the_others_raise_quickly_and_is_reported() -> None:
    timeout = 5.0
    start = time.monotonic()
    with pytest.raises(DistributedRunError) as info:
        run_processes(3, failing_step, 2, "exit", 0.0, timeout=timeout)
    total = time.monotonic() - start
    err = info.value
    assert list(err.failures) == [2]
    assert err.failures[2] == "process died with exit code 1 before reporting a result"
    assert "rank 2: process died with exit code 1" in str(err)
    for rank in (0, 1):
        survivor = err.results[rank]
        print(f"rank {rank} raised after {survivor['elapsed']:.2f} s: {survivor['error']}")
        assert survivor["error"] is not None and survivor["error"].startswith(f"rank {rank}: ")
        assert survivor["elapsed"] < timeout  # a closed connection is noticed at once
        assert survivor["unchanged"]
    assert "rank 2" in err.results[0]["error"]  # rank 0 waits on rank 2 directly
    print(f"whole run: {total:.1f} s")


@pytest.mark.distributed
def test_a_stalled_rank_makes_the_others_time_out() -> None:
    # the stalled rank sleeps ten timeouts, so the survivor's timeout fires long before it wakes
    # even on a loaded machine (the bounds below leave that much room, not a tight margin)
    timeout = 1.0
    pause = 10 * timeout
    results = run_processes(2, failing_step, 1, "sleep", pause, timeout=timeout)
    survivor = results[0]
    print(f"rank 0 raised after {survivor['elapsed']:.2f} s: {survivor['error']}")
    assert (
        survivor["error"]
        == f"rank 0: no message from rank 1 within {timeout} s (peer dead or stalled)"
    )
    assert timeout - 0.1 <= survivor["elapsed"] < pause
    assert survivor["failed_at_call"] == FAILING_CALL
    assert survivor["unchanged"]
    # the stalled rank, once awake, finds its peer gone and raises too instead of hanging
    late = results[1]
    print(f"rank 1 (woke after {pause} s) raised: {late['error']}")
    assert late["error"] is not None and late["error"].startswith("rank 1: ")
    assert late["elapsed"] < pause + 10 * timeout


def die_or_hang(transport: Transport) -> None:
    """Rank 0 is killed by a signal, rank 1 hangs outside any communication."""
    transport.all_gather_bytes(b"")  # both ranks are fully connected before anything happens
    if transport.rank == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(600)


@pytest.mark.distributed
def test_the_harness_reports_signals_and_kills_hung_ranks() -> None:
    timeout = 1.5
    start = time.monotonic()
    with pytest.raises(DistributedRunError) as info:
        run_processes(2, die_or_hang, timeout=timeout)
    elapsed = time.monotonic() - start
    failures = info.value.failures
    assert list(failures) == [0, 1]
    assert (
        failures[0] == "process killed by signal SIGKILL (exit code -9) before reporting a result"
    )
    grace = re.fullmatch(r"still running (\d+\.\d) s after rank 0 failed; killed", failures[1])
    assert grace is not None and float(grace.group(1)) >= spawn.FAILURE_GRACE
    # start-up (up to START_UP_ALLOWANCE on a loaded machine), then the grace: not the 600 s
    # sleep
    assert elapsed < spawn.START_UP_ALLOWANCE + spawn.FAILURE_GRACE + 60.0


def late_worker(delay: float, *worker_args: Any) -> None:
    """A rank of :func:`run_processes` that starts ``delay`` seconds after the others, as on a
    loaded machine where one process takes long to import torch (module level: spawned)."""
    time.sleep(delay)
    spawn._worker(*worker_args)


def say_rank(transport: Transport) -> int:
    transport.all_gather_bytes(b"x")
    return transport.rank


@pytest.mark.distributed
def test_a_slow_starting_rank_still_joins_within_the_start_up_allowance() -> None:
    """The rendezvous is not bounded by the per-operation timeout: a rank that starts 4 s late
    (a loaded machine) joins a run whose operations time out after 1.5 s. The harness used the
    operation timeout for the rendezvous too, and failed under load with "Timed out after 2
    seconds waiting for clients"."""
    timeout, delay = 1.5, 4.0
    assert 10 * delay <= spawn.START_UP_ALLOWANCE
    ctx = mp.get_context("spawn")
    results, flag, port = ctx.SimpleQueue(), ctx.Value("i", 0), spawn.free_port()
    polled = ctx.Array("b", 2)  # held here until the ranks have started
    procs = [
        ctx.Process(
            target=late_worker,
            args=(
                delay * rank,
                rank,
                2,
                port,
                say_rank,
                (),
                results,
                timeout,
                "gloo",
                flag,
                polled,
                os.getpid(),
            ),
        )
        for rank in range(2)
    ]
    for proc in procs:
        proc.start()
    try:
        reports = sorted(results.get() for _ in procs)  # each rank reports once, error or not
    finally:
        for proc in procs:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()
    assert reports == [(0, 0, None), (1, 1, None)]


def test_a_stalled_simulated_rank_makes_the_others_time_out() -> None:
    timeout, pause = 0.5, 5.0  # the peer wakes ten timeouts later: room for a loaded machine
    results = run_local(2, lambda t: failing_step(t, 1, "sleep", pause), timeout=timeout)
    survivor = results[0]
    assert (
        survivor["error"]
        == f"rank 0: no message from rank 1 within {timeout} s (the peer failed or stalled)"
    )
    assert timeout - 0.05 <= survivor["elapsed"] < pause
    assert survivor["failed_at_call"] == FAILING_CALL
    assert survivor["unchanged"]
    assert results[1]["error"] is not None and results[1]["error"].startswith("rank 1: ")


@pytest.mark.parametrize(
    ("backend", "cuda"),
    [("gloo", False), ("nccl", True), ("cuda:nccl", True), ("cpu:gloo,cuda:nccl", False)],
)
def test_message_tensors_go_to_cuda_only_for_an_nccl_only_group(backend: str, cuda: bool) -> None:
    assert _cuda_only(backend) is cuda


def nccl_all_gather(transport: Transport) -> tuple[str, list[bytes]]:
    """Payloads of different sizes (one empty) through NCCL; module level for spawning."""
    device = getattr(transport, "device", torch.device("cpu")).type
    return device, transport.all_gather_bytes(bytes(range(transport.rank * 5)))


@pytest.mark.gpu
@pytest.mark.distributed
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_nccl_processes_exchange_payloads_on_the_gpu() -> None:
    results = run_processes(2, nccl_all_gather, timeout=30.0, backend="nccl")
    assert results == [("cuda", [b"", bytes(range(5))])] * 2
