"""Small timing helpers for the benchmarks."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


def best_time(fn: Callable[[], T], repeat: int) -> tuple[float, T]:
    """Run ``fn`` once to warm up, then ``repeat`` times; the fastest time in seconds and the
    last result. The minimum is the least noisy estimate of what the code itself costs."""
    result = fn()
    best = float("inf")
    for _ in range(max(1, repeat)):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def memcpy_gbps(numel: int, repeat: int) -> float:
    """Throughput of copying ``numel`` float32 values into a preallocated buffer, in GB/s of
    source bytes: the machine's memory-bandwidth yardstick for the codec figures."""
    src = torch.randn(numel)
    dst = torch.empty_like(src)
    seconds, _ = best_time(lambda: dst.copy_(src), repeat)
    return 4 * numel / seconds / 1e9


def synchronize(device: torch.device) -> None:
    """Wait until ``device`` has run every kernel queued so far. CUDA kernels return before they
    finish, so a wall-clock time around them measures only the launches; CPU kernels return
    done, so on the CPU this does nothing."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_device_time(fn: Callable[[], T], repeat: int, device: torch.device) -> tuple[float, T]:
    """:func:`best_time` for work queued on ``device``: the device is synchronized before each
    timed run (no earlier work inside it) and after it (all of its own work inside it)."""
    result = fn()
    synchronize(device)
    best = float("inf")
    for _ in range(max(1, repeat)):
        synchronize(device)
        start = time.perf_counter()
        result = fn()
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best, result
