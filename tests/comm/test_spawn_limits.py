"""`run_processes` has no whole-run limit by default: a long run of quick operations is never
killed, while an explicit ``run_timeout`` still ends a run that exceeds it. A signal to the
launcher becomes the ranks' stop request, and nothing outlives the launcher."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from gradzip.comm import spawn
from gradzip.comm.signals import Interrupted
from gradzip.comm.spawn import DistributedRunError, run_processes
from gradzip.comm.transport import Transport


def quick_collectives(transport: Transport, seconds: float) -> int:
    """All-gathers back to back for ``seconds`` (every one far quicker than the timeout);
    the ranks stop together, once any of them is past the time. How many there were."""
    end = time.monotonic() + seconds
    count = 0
    while True:
        count += 1
        flags = transport.all_gather_bytes(b"1" if time.monotonic() > end else b"0")
        if b"1" in flags:
            return count


def sleeper(transport: Transport, seconds: float) -> None:
    time.sleep(seconds)


@pytest.mark.distributed
def test_a_run_longer_than_the_timeout_is_not_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    # Before, a run without run_timeout was killed after timeout + START_UP_ALLOWANCE (60 s):
    # the allowance is made small so that the test costs seconds, not minutes. One rank: the
    # rendezvous then cannot time out on a loaded machine, whatever the small timeout.
    timeout = 1.0
    monkeypatch.setattr(spawn, "START_UP_ALLOWANCE", 1.0)
    start = time.monotonic()
    [count] = run_processes(1, quick_collectives, 4 * timeout, timeout=timeout)
    assert time.monotonic() - start > 4 * timeout
    assert count > 10


@pytest.mark.distributed
def test_an_explicit_run_timeout_still_kills() -> None:
    start = time.monotonic()
    with pytest.raises(DistributedRunError) as info:
        run_processes(1, sleeper, 600.0, timeout=30.0, run_timeout=3.0)
    assert info.value.failures == {0: "still running after the run's limit of 3.0 s; killed"}
    assert time.monotonic() - start < 120  # not the 600 s sleep


def stop_on_request(transport: Transport) -> int | None:
    """Both ranks poll the stop flag once (so the launcher knows they act on it); rank 0 then
    sends its launcher SIGTERM and waits for the stop request that comes back; rank 1 ignores
    it (sleeps), so the launcher must kill it once the grace is over."""
    spawn.stop_requested()
    if transport.rank == 1:
        time.sleep(600)
    os.kill(os.getppid(), signal.SIGTERM)
    deadline = time.monotonic() + 300
    while spawn.stop_requested() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    return spawn.stop_requested()


@pytest.mark.distributed
def test_a_signal_to_the_launcher_reaches_the_ranks_and_every_process_is_reaped() -> None:
    start = time.monotonic()
    with pytest.raises(Interrupted) as info:
        run_processes(2, stop_on_request, timeout=60.0, stop_grace=2.0)
    stopped = info.value
    assert stopped.signum == signal.SIGTERM
    assert stopped.results == [int(signal.SIGTERM), None]  # rank 0 saw the request
    assert stopped.failures == {1: "still running 2.0 s after SIGTERM asked it to stop; killed"}
    assert time.monotonic() - start < 120  # not the 600 s sleep
    assert spawn.stop_requested() is None  # the launcher itself is no rank


def stop_twice(transport: Transport) -> None:
    """Both ranks act on stop requests but never stop; rank 0 sends its launcher SIGINT, waits
    until the launcher has passed it on, and sends a second one."""
    spawn.stop_requested()
    if transport.rank == 0:
        os.kill(os.getppid(), signal.SIGINT)
        while spawn.stop_requested() is None:
            time.sleep(0.01)
        os.kill(os.getppid(), signal.SIGINT)
    time.sleep(600)


@pytest.mark.distributed
def test_a_second_signal_kills_every_rank_at_once() -> None:
    with pytest.raises(Interrupted) as info:
        # a grace far longer than any test: only the second signal can end this run
        run_processes(2, stop_twice, timeout=60.0, stop_grace=3600.0)
    assert info.value.signum == signal.SIGINT
    assert info.value.failures == {0: "killed on a second SIGINT", 1: "killed on a second SIGINT"}


def never_polls(transport: Transport) -> None:
    """Rank 0 polls the stop flag and sends its launcher SIGINT; rank 1 never polls (as a rank
    still importing torch or loading its data), so it cannot act on the request."""
    if transport.rank == 0:
        spawn.stop_requested()
        os.kill(os.getppid(), signal.SIGINT)
        while spawn.stop_requested() is None:
            time.sleep(0.01)
        return
    time.sleep(600)


@pytest.mark.distributed
def test_a_rank_still_starting_is_killed_at_the_first_signal() -> None:
    with pytest.raises(Interrupted) as info:
        run_processes(2, never_polls, timeout=60.0, stop_grace=3600.0)
    assert info.value.results == [None, None]
    assert info.value.failures == {1: "still starting when SIGINT asked to stop; killed"}


def stops_itself(transport: Transport) -> None:
    """Both ranks connect; rank 1 then stops (SIGSTOP, as `kill -STOP` or a debugger would)
    and rank 0 waits for it in a collective, until its timeout."""
    transport.all_gather_bytes(b"")
    if transport.rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    transport.all_gather_bytes(b"")


@pytest.mark.distributed
def test_a_stopped_rank_is_killed_soon_after_its_peer_times_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before, the launcher waited 2 * timeout after the failure before killing the stopped
    # rank (61 s in all with --timeout 20). The grace is made short here so that "soon" is
    # far from 2 * timeout whatever the load.
    timeout = 5.0
    monkeypatch.setattr(spawn, "FAILURE_GRACE", 0.5)
    with pytest.raises(DistributedRunError) as info:
        run_processes(2, stops_itself, timeout=timeout)
    failures = info.value.failures
    assert list(failures) == [0, 1]
    assert f"no message from rank 1 within {timeout} s" in failures[0]
    killed = re.fullmatch(r"still running (\d+\.\d) s after rank 0 failed; killed", failures[1])
    assert killed is not None and float(killed.group(1)) < 2 * timeout, failures[1]
