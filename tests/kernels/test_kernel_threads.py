"""The thread count of gradzip's numba kernels: the torch intra-op count of the thread they work
for (at most numba's own), and the DDP hook's stage threads taking the main thread's count
instead of numba's default of every core (which oversubscribed ranks sharing a machine)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable

import numba
import pytest
import torch

from gradzip.integrations._job import BucketJob
from gradzip.integrations.ddp import _match_threads
from gradzip.kernels._threads import kernel_thread_count, use_kernel_threads

POOL = int(numba.config.NUMBA_NUM_THREADS)


def _in_fresh_thread(body: Callable[[], int]) -> int:
    """``body()`` on a new thread (numba's count starts there at its pool's size)."""
    out: list[int] = []
    worker = threading.Thread(target=lambda: out.append(body()))
    worker.start()
    worker.join()
    return out[0]


@pytest.fixture
def restored_counts() -> object:
    torch_before, numba_before = torch.get_num_threads(), numba.get_num_threads()
    yield None
    torch.set_num_threads(torch_before)
    numba.set_num_threads(numba_before)


@pytest.mark.usefixtures("restored_counts")
def test_the_count_follows_torch_and_keeps_a_lower_numba_setting() -> None:
    torch.set_num_threads(1)
    numba.set_num_threads(POOL)
    assert kernel_thread_count() == 1
    torch.set_num_threads(max(POOL, 2))
    assert kernel_thread_count() == POOL
    numba.set_num_threads(1)  # a user's lower numba count stays
    assert kernel_thread_count() == 1


def test_a_fresh_thread_starts_at_numba_pool_size_and_takes_the_count_given() -> None:
    """Why the stages need it: numba's count is per thread and a new one starts at the pool's
    size, whatever the main thread was told."""
    assert _in_fresh_thread(numba.get_num_threads) == POOL

    def given(count: int) -> int:
        use_kernel_threads(count)
        return numba.get_num_threads()

    assert _in_fresh_thread(lambda: given(1)) == 1
    assert _in_fresh_thread(lambda: given(POOL + 7)) == POOL  # capped at the pool
    assert _in_fresh_thread(lambda: given(0)) == 1


@pytest.mark.usefixtures("restored_counts")
def test_a_hook_stage_thread_runs_its_kernels_at_the_main_threads_count() -> None:
    """A bucket queued by a main thread pinned to one torch thread (as ``torchrun`` pins every
    rank of a shared machine): the stage thread's numba count becomes 1, not the pool's."""
    torch.set_num_threads(1)
    job = BucketJob(
        0, True, torch.ones(4), None, torch.futures.Future(), torch.get_num_threads(),
        kernel_threads=kernel_thread_count(),
    )  # fmt: skip

    def stage() -> int:
        _match_threads(job)
        assert torch.get_num_threads() == 1
        return numba.get_num_threads()

    assert _in_fresh_thread(stage) == 1
    job.kernel_threads = None  # no count captured: numba's own setting stays
    assert _in_fresh_thread(stage) == POOL


@pytest.mark.distributed  # a fresh Python process, so that numba starts its threading layer there
def test_asking_numba_first_leaves_torchs_count_alone() -> None:
    """numba's OpenMP layer, started by the first question a process asks it, sets the
    thread's OpenMP count to numba's pool size, which torch reads as its own: a rank that
    ``torchrun`` pinned to one torch thread ran its convolutions on every core after the hook
    asked (a fresh process, so that the layer starts here)."""
    program = (
        "import torch\n"
        "from gradzip.kernels._threads import kernel_thread_count, use_kernel_threads\n"
        "assert torch.get_num_threads() == 1\n"
        "count = kernel_thread_count()\n"
        "after_asking = torch.get_num_threads()\n"
        "use_kernel_threads(8)\n"
        "print(count, after_asking, torch.get_num_threads())\n"
    )
    # a pool of 4 whatever the CPU, so that "1" is the pinned count and not the pool's size
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "4"}
    done = subprocess.run(
        [sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "1", "1"]
