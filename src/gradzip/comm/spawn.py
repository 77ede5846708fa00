"""Run a function on P real processes joined by a gloo group on 127.0.0.1.

For tests, benchmarks and quick experiments on one machine; for real jobs use ``torchrun``. The
results come back through a multiprocessing queue (harness plumbing, not the payload wire).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gradzip.comm.distributed import DistributedTransport
from gradzip.errors import GradzipError


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _worker(
    rank: int,
    world_size: int,
    port: int,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    results: Any,
    timeout: float,
) -> None:
    torch.set_num_threads(1)  # P processes share the machine's cores
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout),
    )
    try:
        results.put((rank, fn(DistributedTransport(), *args), None))
    except BaseException as err:
        results.put((rank, None, f"{type(err).__name__}: {err}"))
    finally:
        dist.destroy_process_group()


def run_processes(
    world_size: int, fn: Callable[..., Any], *args: Any, timeout: float = 60.0
) -> list[Any]:
    """``fn(transport, *args)`` on ``world_size`` spawned processes; results in rank order.

    ``fn`` must be importable by name (a module-level function). Raises
    :class:`~gradzip.errors.GradzipError` naming the rank if any process fails or the whole run
    takes longer than ``timeout`` plus a start-up allowance.
    """
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    port = free_port()
    procs = [
        ctx.Process(target=_worker, args=(r, world_size, port, fn, args, results, timeout))
        for r in range(world_size)
    ]
    for proc in procs:
        proc.start()
    outputs: list[Any] = [None] * world_size
    failures: list[str] = []
    deadline = time.monotonic() + timeout + 60.0  # process start-up and torch import
    received = 0
    while received < world_size:
        if not results.empty():
            rank, value, error = results.get()
            received += 1
            outputs[rank] = value
            if error is not None:
                failures.append(f"rank {rank}: {error}")
            continue
        if time.monotonic() > deadline or any(p.exitcode not in (None, 0) for p in procs):
            break
        time.sleep(0.02)
    for proc in procs:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
    if failures or received < world_size:
        detail = "; ".join(failures) or f"only {received} of {world_size} ranks reported"
        raise GradzipError(f"distributed run failed: {detail}")
    return outputs
