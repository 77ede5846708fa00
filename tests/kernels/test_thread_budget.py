"""numba's kernels run on torch's intra-op thread count (at most numba's pool), in the calling
thread, and leave torch's count as it was."""

from __future__ import annotations

import threading

import numba
import torch

from gradzip.kernels._threads import call_parallel


def test_kernels_follow_torch_s_thread_count_in_the_calling_thread() -> None:
    before = torch.get_num_threads()
    pool = int(numba.config.NUMBA_NUM_THREADS)  # type: ignore[attr-defined]
    try:
        torch.set_num_threads(1)
        assert call_parallel(numba.get_num_threads) == 1
        assert torch.get_num_threads() == 1
        torch.set_num_threads(pool + 3)  # more than numba's pool: the pool's size
        assert call_parallel(numba.get_num_threads) == pool

        seen: list[int] = []

        def worker() -> None:  # a fresh thread, as the DDP hook's stages are
            torch.set_num_threads(1)
            seen.append(call_parallel(numba.get_num_threads))

        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
        assert seen == [1]
    finally:
        torch.set_num_threads(before)
