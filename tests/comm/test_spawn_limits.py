"""`run_processes` has no whole-run limit by default: a long run of quick operations is never
killed, while an explicit ``run_timeout`` still ends a run that exceeds it. A signal to the
launcher becomes the ranks' stop request, and nothing outlives the launcher."""

from __future__ import annotations

import os
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
    """Rank 0 sends its launcher SIGTERM and waits for the stop request that comes back;
    rank 1 ignores it (sleeps), so the launcher must kill it."""
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
