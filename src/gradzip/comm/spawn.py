"""Run a function on P real processes joined by a gloo (or NCCL) group on 127.0.0.1.

For tests, benchmarks and quick experiments on one machine; for real jobs use ``torchrun``. The
results come back through a multiprocessing queue (harness plumbing, not the payload wire).

The harness never hangs: a rank that raises is reported with its error, a process that dies
(an exit code, or a signal) is reported as such, the ranks still running some time after a
failure are killed, and so is the whole run once it exceeds its limit.
"""

from __future__ import annotations

import signal
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

START_UP_ALLOWANCE = 60.0  # seconds for starting the processes and importing torch


class DistributedRunError(GradzipError):
    """Some ranks of :func:`run_processes` failed.

    ``failures`` maps each failed rank to what happened to it (its exception, its exit code or
    signal, or that it was killed); ``results`` holds what the other ranks returned (``None`` for
    the failed ones), so a test can still look at the survivors.
    """

    def __init__(self, failures: dict[int, str], results: list[Any]) -> None:
        self.failures = dict(failures)
        self.results = results
        detail = "; ".join(f"rank {rank}: {what}" for rank, what in failures.items())
        super().__init__(f"distributed run failed: {detail}")


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
    backend: str,
) -> None:
    torch.set_num_threads(1)  # P processes share the machine's cores
    try:
        device = None
        if backend == "nccl":  # one GPU per rank; eager initialisation (see DistributedTransport)
            device = torch.device("cuda", rank % torch.cuda.device_count())
            torch.cuda.set_device(device)
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout),
            device_id=device,
        )
        results.put((rank, fn(DistributedTransport(timeout=timeout), *args), None))
    except BaseException as err:
        results.put((rank, None, f"{type(err).__name__}: {err}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def describe_exit(exitcode: int) -> str:
    """What a process's exit code says: the signal that killed it, or the code it exited with."""
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"process killed by signal {name} (exit code {exitcode})"
    return f"process died with exit code {exitcode}"


def run_processes(
    world_size: int,
    fn: Callable[..., Any],
    *args: Any,
    timeout: float = 60.0,
    run_timeout: float | None = None,
    backend: str = "gloo",
) -> list[Any]:
    """``fn(transport, *args)`` on ``world_size`` spawned processes; results in rank order.

    ``fn`` must be importable by name (a module-level function). ``timeout`` is each rank's
    :class:`~gradzip.comm.distributed.DistributedTransport` timeout (and the process group's):
    a rank waiting longer than that for a peer raises. ``run_timeout`` limits the whole run
    (default: ``timeout`` plus a start-up allowance). Once a rank has failed, the others have
    ``2 * timeout`` seconds to finish before they are killed. ``backend="nccl"`` gives rank
    ``r`` the CUDA device ``r % torch.cuda.device_count()``.

    Raises :class:`DistributedRunError` (a :class:`~gradzip.errors.GradzipError`) naming every
    failed rank: its exception, the exit code or signal of a process that died before
    reporting, or that it was killed (still running after a failure or past ``run_timeout``).
    """
    limit = timeout + START_UP_ALLOWANCE if run_timeout is None else run_timeout
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    port = free_port()
    procs = [
        ctx.Process(
            target=_worker,
            args=(r, world_size, port, fn, args, results, timeout, backend),
        )
        for r in range(world_size)
    ]
    start = time.monotonic()
    for proc in procs:
        proc.start()
    outputs: list[Any] = [None] * world_size
    reported: set[int] = set()
    died: dict[int, str] = {}
    raised: dict[int, str] = {}
    killed: dict[int, str] = {}
    first_failure: tuple[float, int] | None = None  # (when, which rank)
    try:
        while len(reported) + len(died) < world_size:
            exits = [proc.exitcode for proc in procs]  # before draining: a result comes first
            while not results.empty():
                rank, value, error = results.get()
                reported.add(rank)
                outputs[rank] = value
                if error is not None:
                    raised[rank] = error
                    first_failure = first_failure or (time.monotonic(), rank)
            for rank, code in enumerate(exits):
                if code is not None and rank not in reported and rank not in died:
                    died[rank] = f"{describe_exit(code)} before reporting a result"
                    first_failure = first_failure or (time.monotonic(), rank)
            if len(reported) + len(died) == world_size:
                break
            now = time.monotonic()
            if first_failure is not None and now > first_failure[0] + 2 * timeout:
                reason = (
                    f"still running {now - first_failure[0]:.1f} s after rank {first_failure[1]} "
                    "failed; killed"
                )
            elif now > start + limit:
                reason = f"still running after the run's limit of {limit} s; killed"
            else:
                time.sleep(0.02)
                continue
            for rank in range(world_size):
                if rank not in reported and rank not in died:
                    killed[rank] = reason
                    procs[rank].kill()
            break
    finally:
        _stop(procs)
    failures = {**died, **dict(sorted(raised.items())), **killed}  # root causes first
    if failures:
        raise DistributedRunError(failures, outputs)
    return outputs


def _stop(procs: list[Any], wait: float = 10.0) -> None:
    """Join every process within ``wait`` seconds in all, then kill whatever is left."""
    deadline = time.monotonic() + wait
    for proc in procs:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5.0)
