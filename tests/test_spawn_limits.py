"""`run_processes` has no whole-run limit by default: a long run of quick operations is never
killed, while an explicit ``run_timeout`` still ends a run that exceeds it."""

from __future__ import annotations

import time

import pytest

from gradzip.comm import spawn
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
