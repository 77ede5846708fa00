"""Shared test settings: one thread (as the benchmarks use), deterministic Hypothesis, the
``distributed`` marker enforced (a test that starts a process must carry it, so ``make
test-fast``, ``-m 'not slow and not distributed'``, never spawns one), and the one harness that
runs a rank function on simulated ranks and on gloo processes (:func:`simulated_and_processes`).
"""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import matplotlib
import pytest
import torch
from hypothesis import HealthCheck, settings

from gradzip.comm.local import run_local
from gradzip.comm.spawn import run_processes

torch.set_num_threads(1)

# matplotlib builds its font cache on its first import in a fresh environment, and that runs
# `fc-list` in a subprocess; building it here, before any test, keeps the process guard below
# from refusing a plotting test on a machine that never plotted (CI's fresh set-up).
matplotlib.use("Agg")
import matplotlib.font_manager  # noqa: E402

settings.register_profile(
    "gradzip",
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("gradzip")


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    """Write the test about to run to the file ``GRADZIP_CURRENT_TEST_FILE`` names, when set:
    a test that kills the whole run (a native abort, the process killed) leaves no report, and
    the CI script prints this file's line when the suite fails so the culprit is named."""
    path = os.environ.get("GRADZIP_CURRENT_TEST_FILE")
    if path:
        with open(path, "w", encoding="utf-8") as out:
            out.write(nodeid + "\n")


@pytest.hookimpl(tryfirst=True)  # before `-m 'not slow'` deselects by mark
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the cases of :data:`tests.slow_cases.SLOW_CASES` slow; refuse an id there that
    names no collected case of a test that was collected (a rename must not move a case)."""
    from tests.slow_cases import SLOW_CASES

    by_id = {item.nodeid: item for item in items}
    collected_tests = {item.nodeid.split("[", 1)[0] for item in items}
    picked_cases = any("[" in arg for arg in config.args)  # `file::test[case]` on the command line
    stale = []
    for case in SLOW_CASES:
        if case in by_id:
            by_id[case].add_marker(pytest.mark.slow)
        elif case.split("[", 1)[0] in collected_tests and not picked_cases:
            stale.append(case)
    if stale:
        raise pytest.UsageError(
            "tests/slow_cases.py names cases that do not exist: " + ", ".join(stale)
        )


@pytest.fixture(autouse=True)
def _processes_only_in_distributed_tests(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """Refuse to start a process (multiprocessing or subprocess) in a test that is not marked
    ``distributed`` or ``gpu``.

    ``gpu`` tests are let through: on a real GPU, Triton's compiler starts processes of its own
    (``ldconfig -p`` to find libcuda, ``ptxas`` to assemble each kernel), which the first run on
    an H200 showed; the ``gpu`` tests never run where there is no CUDA device."""
    node = request.node
    if node.get_closest_marker("distributed") is None and node.get_closest_marker("gpu") is None:
        name = node.nodeid

        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError(f"{name} starts a process: mark it @pytest.mark.distributed")

        monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
        monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    yield


#: a rank's per-operation timeout when a test compares simulated ranks with processes: generous
#: (a loaded machine starts and runs processes slowly), and only a failing run ever waits it out
SIMULATED_AND_PROCESSES_TIMEOUT = 120.0


class SimulatedAndProcesses(NamedTuple):
    """What the rank function returned, in rank order: on the simulated ranks (threads of the
    test's process, :func:`~gradzip.comm.local.run_local`) and on the spawned gloo processes
    (:func:`~gradzip.comm.spawn.run_processes`)."""

    simulated: list[Any]
    processes: list[Any]


#: the type of the :func:`simulated_and_processes` fixture, for the tests' annotations
RunSimulatedAndProcesses = Callable[..., SimulatedAndProcesses]


def run_simulated_and_processes(
    world_size: int,
    fn: Callable[..., Any],
    *args: Any,
    timeout: float = SIMULATED_AND_PROCESSES_TIMEOUT,
) -> SimulatedAndProcesses:
    """``fn(transport, *args)`` on ``world_size`` simulated ranks, then on as many gloo
    processes. ``fn`` must be a module-level function (the processes import it by name). Both
    harnesses reap what they started and raise, naming the rank, when a rank fails or waits
    longer than ``timeout`` seconds for a peer."""
    simulated = run_local(world_size, lambda transport: fn(transport, *args), timeout=timeout)
    processes = run_processes(world_size, fn, *args, timeout=timeout)
    return SimulatedAndProcesses(simulated, processes)


@pytest.fixture
def simulated_and_processes(request: pytest.FixtureRequest) -> RunSimulatedAndProcesses:
    """:func:`run_simulated_and_processes`, for tests marked ``distributed`` (it spawns
    processes): ``runs = simulated_and_processes(2, rank_fn, arg)``, then compare
    ``runs.simulated`` with ``runs.processes`` as strictly as the test needs."""
    if request.node.get_closest_marker("distributed") is None:
        pytest.fail(f"{request.node.nodeid} runs processes: mark it @pytest.mark.distributed")
    return run_simulated_and_processes


@pytest.fixture(autouse=True)
def _forced_modes_do_not_leak() -> Iterator[None]:
    """A test that leaves the forced device path or torch-ops path on would turn every later
    test's CPU encoding into the device path: fail the leaking test instead."""
    from gradzip.device import mode
    from gradzip.kernels import backend

    yield
    assert mode._forced == 0, "forced_device_payloads() left open by this test"
    assert backend._force_torch_ops == 0, "forced_torch_ops() left open by this test"
