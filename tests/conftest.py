"""Shared test settings: one thread (as the benchmarks use), deterministic Hypothesis, and the
``distributed`` marker enforced: a test that starts a process must carry it, so ``make
test-fast`` (``-m 'not slow and not distributed'``) never spawns one."""

from __future__ import annotations

import multiprocessing.process
import subprocess
from collections.abc import Iterator
from typing import Any

import matplotlib
import pytest
import torch
from hypothesis import HealthCheck, settings

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


@pytest.fixture(autouse=True)
def _processes_only_in_distributed_tests(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """Refuse to start a process (multiprocessing or subprocess) in a test that is not marked
    ``distributed``."""
    if request.node.get_closest_marker("distributed") is None:
        name = request.node.nodeid

        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError(f"{name} starts a process: mark it @pytest.mark.distributed")

        monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
        monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    yield
