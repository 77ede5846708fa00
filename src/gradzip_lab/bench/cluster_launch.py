"""Starting rank processes inside the emulated cluster's namespaces, and its safe lifetime.

Shared by ``gradzip bench cluster`` (:mod:`.cluster`, DDP training steps) and the timing
reproductions (:mod:`.cluster_exchange`, compressed exchanges): :func:`launch` runs one rank
program per namespace (``ip netns exec ... python -m MODULE CONFIG OUT``) and collects the JSON
each writes; :func:`built_cluster` builds a :class:`~.cluster_netns.ClusterNetwork` and always
deletes it again; :func:`signals_raise` turns SIGINT / SIGTERM into an exception, so that the
``finally`` doing the teardown is reached (the ranks, in sessions of their own, are killed
first).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

import torch.distributed as dist

import gradzip
from gradzip.errors import GradzipError
from gradzip_lab.bench.cluster_netns import ClusterNetwork

#: rank 0's output lines that the launcher shows while the ranks run
PROGRESS = "[progress] "
TRAINING_RANK = "gradzip_lab.bench.cluster_rank"


class ClusterInterruptedError(GradzipError):
    """SIGINT or SIGTERM reached the launcher; the cluster was torn down."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"interrupted by {signal.Signals(signum).name}")


class ClusterRunError(GradzipError):
    """A rank failed or the ranks ran past their time limit."""


class RankAddress(Protocol):
    """What a rank program needs to join its cluster's gloo group."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int
    timeout: float
    device: str


def join_group(config: RankAddress) -> None:
    """Join the gloo group over the veth of the rank's node (``GLOO_SOCKET_IFNAME``), so that
    every byte between ranks of different nodes crosses the rate-limited links. Ranks of one
    node bind the same address and reach each other over the namespace's loopback (the
    kernel routes a namespace's own addresses there), as processes of one machine do."""
    os.environ["GLOO_SOCKET_IFNAME"] = config.device
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{config.master_addr}:{config.master_port}",
        rank=config.rank,
        world_size=config.world_size,
        timeout=timedelta(seconds=config.timeout),
    )


def _raise_on_signal(signum: int, _: FrameType | None) -> None:
    raise ClusterInterruptedError(signum)


@contextmanager
def signals_raise() -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`ClusterInterruptedError` inside the block."""
    previous = {s: signal.signal(s, _raise_on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextmanager
def built_cluster(
    world_size: int, run: int = 0, ranks_per_node: int = 1
) -> Iterator[ClusterNetwork]:
    """A cluster of ``world_size`` ranks in node namespaces of ``ranks_per_node``, deleted when
    the block ends (errors included); a second Ctrl-C cannot cut the teardown short."""
    net = ClusterNetwork(world_size, run=run, ranks_per_node=ranks_per_node)
    try:
        net.setup()
        yield net
    finally:
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            left = net.teardown()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        if left:
            print(f"WARNING: namespaces still listed after teardown: {', '.join(left)}")


@dataclass
class PeakMemory:
    """The most resident memory (bytes) the ranks of a launch held at once, summed over the
    ranks, sampled every poll of :func:`launch` (so a peak between two polls can be missed)."""

    bytes: int = 0

    def sample(self, pids: list[int]) -> None:
        self.bytes = max(self.bytes, sum(resident_bytes(pid) for pid in pids))


def resident_bytes(pid: int) -> int:
    """``VmRSS`` of process ``pid`` in bytes (0 once it has gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def rank_env() -> dict[str, str]:
    """The ranks' environment: this gradzip first on the path (the ranks import the same code)."""
    env = dict(os.environ)
    source = str(Path(gradzip.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [source, env.get("PYTHONPATH", "")]))
    return env


def launch(
    net: ClusterNetwork,
    configs: list[Any],
    timeout: float,
    workdir: Path,
    module: str = TRAINING_RANK,
    env: dict[str, str] | None = None,
    memory: PeakMemory | None = None,
) -> list[dict[str, Any]]:
    """Start ``python -m module CONFIG OUT`` for every rank in its namespace (``configs`` are
    dataclasses with a ``rank`` field, written as JSON; ``env``: variables added to the ranks'
    environment), wait for all (at most ``timeout`` s; ``memory``: their peak resident memory),
    return their results. A failed rank, or the limit, kills the others and raises
    :class:`ClusterRunError` with the failed ranks' last output lines."""
    procs: list[subprocess.Popen[bytes]] = []
    logs, outs = [], []
    try:
        for config in configs:
            cfg = workdir / f"rank{config.rank}.json"
            cfg.write_text(json.dumps(asdict(config)))
            out, log = workdir / f"rank{config.rank}.out.json", workdir / f"rank{config.rank}.log"
            outs.append(out)
            logs.append(log)
            argv = [*net.exec_prefix(config.rank), sys.executable, "-m", module, str(cfg), str(out)]
            with log.open("wb") as sink:
                # a session of its own: a terminal's Ctrl-C reaches the launcher only, which
                # kills the ranks and tears the cluster down
                procs.append(
                    subprocess.Popen(
                        argv, stdout=sink, stderr=subprocess.STDOUT, env={**rank_env(), **(env or {})},
                        start_new_session=True,
                    )
                )  # fmt: skip
        deadline = time.monotonic() + timeout
        shown = 0  # bytes of rank 0's log already scanned for progress lines
        while any(p.poll() is None for p in procs):
            shown = _show_progress(logs[0], shown)
            if memory is not None:
                memory.sample([p.pid for p in procs])  # ip netns exec execs: the rank's pid
            failed = [i for i, p in enumerate(procs) if p.returncode not in (None, 0)]
            if failed:
                time.sleep(5.0)  # let the peers report their side of it before they go
                raise ClusterRunError(_failure(failed, procs, logs, "failed"))
            if time.monotonic() > deadline:
                running = [i for i, p in enumerate(procs) if p.poll() is None]
                raise ClusterRunError(_failure(running, procs, logs, f"ran past {timeout:.0f} s"))
            time.sleep(0.2)
        failed = [i for i, p in enumerate(procs) if p.returncode != 0]
        if failed:
            raise ClusterRunError(_failure(failed, procs, logs, "failed"))
        return [json.loads(out.read_text()) for out in outs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)


def _show_progress(log: Path, offset: int) -> int:
    """Print rank 0's complete progress lines after ``offset``; returns the new offset."""
    try:
        with log.open("rb") as source:
            source.seek(offset)
            text = source.read().decode(errors="replace")
    except OSError:
        return offset
    complete = text[: text.rfind("\n") + 1]
    for line in complete.splitlines():
        if line.startswith(PROGRESS):
            print(f"    {line[len(PROGRESS) :]}", flush=True)
    return offset + len(complete.encode())


def _failure(ranks: list[int], procs: list[Any], logs: list[Path], what: str) -> str:
    parts = []
    for i in ranks:
        tail = logs[i].read_text(errors="replace").strip().splitlines()[-6:]
        parts.append(f"rank {i} {what} (exit {procs[i].returncode}): " + " | ".join(tail))
    return "; ".join(parts)
