"""Run a function on P real processes joined by a gloo (or NCCL) group on 127.0.0.1.

For tests, benchmarks and quick experiments on one machine; for real jobs use ``torchrun``. The
results come back through a multiprocessing queue (harness plumbing, not the payload wire).

The harness never hangs: a rank that raises is reported with its error, a process that dies
(an exit code, or a signal) is reported as such, and the ranks still running some time after a
failure are killed. A rank waiting for a dead or stalled peer raises after the per-operation
``timeout``, so a run needs no overall limit: a long healthy run is never cut short (an explicit
``run_timeout`` is still available).

Once a rank has failed, the others get :data:`FAILURE_GRACE` seconds to report (a peer's closed
connection is noticed at once); those still running then, such as a rank stuck outside any
communication (or stopped), are killed.

SIGINT and SIGTERM sent to the launching process are passed on to the ranks as a stop request
(:func:`stop_requested`, which a rank polls between steps; the ranks ignore SIGINT themselves,
so Ctrl-C in a terminal reaches them only this way, once, and never as a traceback). A rank
that has never polled it (still starting: importing torch, loading its data) could act on it
only once started, and has nothing to save yet, so it is killed at once; the others get a
grace period to stop cleanly. A second signal kills every rank still running. Every process
is reaped before :class:`~gradzip.comm.signals.Interrupted` is raised.

A rank exits as soon as it has reported its result (``os._exit`` after its process group is
destroyed): the interpreter's own shutdown with torch loaded takes seconds on a loaded
machine, which every stop and every run would otherwise wait for.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gradzip.comm.distributed import DistributedTransport
from gradzip.comm.signals import Interrupted, SignalCatcher, signal_name
from gradzip.errors import GradzipError

#: seconds the rendezvous may take: starting the processes, importing torch
START_UP_ALLOWANCE = 60.0

#: seconds the other ranks get to report once a rank has failed, before those still running are
#: killed (a rank waiting on the failed one notices its closed connection at once)
FAILURE_GRACE = 5.0

# In a rank: the launcher's shared stop flag (0, or the number of the signal it caught), its
# flags of the ranks that have polled the stop flag, this rank's number, and the launcher's
# process id (a rank whose launcher died is orphaned and stops too).
_stop_flag: Any = None
_polled: Any = None
_rank = 0
_launcher_pid: int | None = None


def stop_requested() -> int | None:
    """In a rank started by :func:`run_processes`: the signal the launcher caught and passed
    on (SIGINT or SIGTERM), ``signal.SIGHUP`` if the launcher has died, else None (also in any
    other process). Cheap enough to poll once per step; the first call tells the launcher that
    this rank acts on stop requests (until then a signal kills it)."""
    if _stop_flag is None:
        return None
    _polled[_rank] = 1
    if _stop_flag.value:
        return int(_stop_flag.value)
    if os.getppid() != _launcher_pid:
        return int(signal.SIGHUP)
    return None


def in_launched_rank() -> bool:
    """Whether this process is a rank started by :func:`run_processes`."""
    return _stop_flag is not None


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
    stop_flag: Any,
    polled: Any,
    launcher: int,
) -> None:
    global _stop_flag, _polled, _rank, _launcher_pid
    _stop_flag, _polled, _rank, _launcher_pid = stop_flag, polled, rank, launcher
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
            # the rendezvous may wait for slow-starting peers (a loaded machine imports torch
            # slowly), so it gets the start-up allowance; every operation afterwards is bounded
            # by the transport's own ``timeout`` (DistributedTransport waits on each work item)
            timeout=timedelta(seconds=max(timeout, START_UP_ALLOWANCE)),
            device_id=device,
        )
        results.put((rank, fn(DistributedTransport(timeout=timeout), *args), None))
    except BaseException as err:
        results.put((rank, None, f"{type(err).__name__}: {err}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    # reported: exit now, without the interpreter's shutdown (see the module's docstring)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


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
    stop_grace: float | None = None,
) -> list[Any]:
    """``fn(transport, *args)`` on ``world_size`` spawned processes; results in rank order.

    ``fn`` must be importable by name (a module-level function). ``timeout`` is each rank's
    :class:`~gradzip.comm.distributed.DistributedTransport` timeout: a rank waiting longer
    than that for a peer raises. The rendezvous alone may take up to ``START_UP_ALLOWANCE``
    seconds (a loaded machine starts the processes and imports torch slowly). ``run_timeout`` limits the whole run
    (default: no limit, so a run may take as long as its work does). Once a rank has failed,
    the others have :data:`FAILURE_GRACE` seconds to finish before they are killed.
    ``backend="nccl"`` gives rank ``r`` the CUDA device ``r % torch.cuda.device_count()``.

    SIGINT or SIGTERM (caught while this runs in the main thread) sets the ranks'
    :func:`stop_requested`. The ranks that have not polled it yet are killed at once (they are
    still starting); the others still running ``stop_grace`` seconds later (default
    ``2 * timeout``), or at once on a second signal, are killed. Once every process is reaped
    it raises :class:`~gradzip.comm.signals.Interrupted` with the signal, what the ranks
    returned and what happened to the others.

    Raises :class:`DistributedRunError` (a :class:`~gradzip.errors.GradzipError`) naming every
    failed rank: its exception, the exit code or signal of a process that died before
    reporting, or that it was killed (still running after a failure or past ``run_timeout``).
    """
    grace = 2 * timeout if stop_grace is None else stop_grace
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    stop_flag = ctx.Value("i", 0)
    polled = ctx.Array("b", world_size)  # which ranks have polled stop_requested()
    port = free_port()
    common = (results, timeout, backend, stop_flag, polled, os.getpid())
    procs = [
        ctx.Process(target=_worker, args=(r, world_size, port, fn, args, *common))
        for r in range(world_size)
    ]
    outputs: list[Any] = [None] * world_size
    reported: set[int] = set()
    died: dict[int, str] = {}
    raised: dict[int, str] = {}
    killed: dict[int, str] = {}
    first_failure: tuple[float, int] | None = None  # (when, which rank)
    stop_deadline: float | None = None
    with SignalCatcher() as caught:
        _start(procs)
        start = time.monotonic()
        try:

            def running() -> list[int]:
                """The ranks that have neither reported, nor died, nor been killed."""
                return [r for r in range(world_size) if r not in {*reported, *died, *killed}]

            while running():
                exits = [proc.exitcode for proc in procs]  # before draining: a result comes first
                while not results.empty():
                    rank, value, error = results.get()
                    reported.add(rank)
                    killed.pop(rank, None)  # it reported just before it was killed
                    outputs[rank] = value
                    if error is not None:
                        raised[rank] = error
                        first_failure = first_failure or (time.monotonic(), rank)
                for rank in running():
                    code = exits[rank]
                    if code is not None:
                        died[rank] = f"{describe_exit(code)} before reporting a result"
                        first_failure = first_failure or (time.monotonic(), rank)
                if not running():
                    break
                now = time.monotonic()
                name = signal_name(caught.signum or 0)
                if caught.signum is not None and stop_deadline is None:
                    stop_flag.value = caught.signum  # the ranks stop at their next step
                    stop_deadline = now + grace
                    for rank in running():  # still starting: it cannot act on the request yet
                        if not polled[rank]:
                            killed[rank] = f"still starting when {name} asked to stop; killed"
                            procs[rank].kill()
                    continue
                if caught.count > 1:
                    reason = f"killed on a second {name}"
                elif stop_deadline is not None and now > stop_deadline:
                    reason = f"still running {grace:.1f} s after {name} asked it to stop; killed"
                elif first_failure is not None and now > first_failure[0] + FAILURE_GRACE:
                    reason = (
                        f"still running {now - first_failure[0]:.1f} s after rank "
                        f"{first_failure[1]} failed; killed"
                    )
                elif run_timeout is not None and now > start + run_timeout:
                    reason = f"still running after the run's limit of {run_timeout} s; killed"
                else:
                    time.sleep(0.02)
                    continue
                for rank in running():
                    killed[rank] = reason
                    procs[rank].kill()
                break
        finally:
            _stop(procs)
    failures = {**died, **dict(sorted(raised.items())), **killed}  # root causes first
    if caught.signum is not None:
        raise Interrupted(caught.signum, outputs, failures)
    if failures:
        raise DistributedRunError(failures, outputs)
    return outputs


def _start(procs: list[Any]) -> None:
    """Start every process with SIGINT ignored: they inherit that, so Ctrl-C in a terminal
    (sent to the whole process group) reaches them only through the launcher's stop flag, and
    never as a ``KeyboardInterrupt`` while they import torch. The launcher's own handler comes
    back at once (a Ctrl-C in those few milliseconds is lost)."""
    if threading.current_thread() is not threading.main_thread():
        for proc in procs:
            proc.start()
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        for proc in procs:
            proc.start()
    finally:
        signal.signal(signal.SIGINT, previous)


def _stop(procs: list[Any], wait: float = 10.0) -> None:
    """Join every process within ``wait`` seconds in all, then kill whatever is left."""
    procs = [proc for proc in procs if proc.pid is not None]  # started ones only
    deadline = time.monotonic() + wait
    for proc in procs:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5.0)
