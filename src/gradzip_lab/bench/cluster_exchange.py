"""One rank of the timing reproductions: ``python -m gradzip_lab.bench.cluster_exchange CONFIG OUT``.

Where ``gradzip bench cluster`` (:mod:`.cluster_rank`) trains a model under DDP, this program
times gradient exchanges alone, with the compute of a step emulated, so that papers' timing
results (all-reduce against quantized all-reduce, parameter-server speed-ups, the split of a
round into computation, encoding, transmission and decoding) can be measured with the real
compressed payloads on the emulated links. The launcher (:func:`.cluster_launch.launch`) starts
it inside the rank's namespace; ``CONFIG`` is an :class:`ExchangeConfig` as JSON, ``OUT`` the
JSON file the rank's figures go to.

A rank joins the gloo group at rank 0's address over its veth (``GLOO_SOCKET_IFNAME``), builds
every :class:`ExchangeCase` (its own process group and transport, its scheme around its
compressor, or PyTorch's float32 ``all_reduce``), then runs the steps interleaved: each step,
every case in turn: a barrier on the default group, then the timed exchange of the rank's
gradient. [CHOICE] The computation of a step is not run: the case's ``compute_seconds`` (a time
the launcher measured or estimated, and reports) is recorded as the step's compute and added to
the exchange's time. Real forward and backward passes of ``P`` ranks on a 2-core machine would
run one after another, which no cluster does (each node computes on its own GPU or cores), and
a sleep in their place measured mostly the loaded machine's wake-up delays; the schemes here are
synchronous (nothing overlaps the exchange), so a step is its compute plus its exchange.
Encoding and decoding are real work on the shared cores, one thread per rank.

Per step and case the rank records: the compute (as given) and exchange seconds, the seconds spent inside
the compressor's ``encode`` and ``decode`` (:class:`CodecClock`; the rest of the exchange is
transmission and waiting), the bytes its veth sent and received (``tx_bytes``/``rx_bytes``: the
real wire, TCP/IP headers included) and the payload bytes gradzip's meter counted.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from gradzip_lab.bench.cluster_launch import PROGRESS, join_group
from gradzip_lab.bench.cluster_netns import RANK_DEVICE
from gradzip_lab.bench.collective_ranks import bench_gradient

RUN_SEED = 2024
#: distinct gradients a case cycles through (a few are enough: the codecs' cost and size do not
#: depend on the step, and generating one per step of a 16 M-element case would cost seconds)
GRADIENTS = 2


@dataclass(frozen=True)
class ExchangeCase:
    """One timed exchange. ``kind``: ``scheme`` (gradzip's ``scheme``, a label of
    scheme spec (:mod:`gradzip.schemes.spec`), around ``compressor(**params)``) or ``allreduce``
    (``torch.distributed.all_reduce`` of the float32 tensor, then division by ``P``: the
    uncompressed MPI-style baseline)."""

    label: str
    kind: str
    shape: tuple[int, ...]
    compressor: str = "identity"
    params: dict[str, Any] = field(default_factory=dict)
    scheme: str = "allgather"
    error_feedback: bool = False
    #: the step's computation, added to the measured exchange (see the module docstring)
    compute_seconds: float = 0.0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExchangeCase:
        return cls(**{**data, "shape": tuple(data["shape"])})


@dataclass
class ExchangeConfig:
    """What the launcher tells each rank."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int
    cases: list[ExchangeCase]
    steps: int
    warmup: int
    timeout: float
    device: str = RANK_DEVICE

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExchangeConfig:
        cases = [ExchangeCase.from_dict(c) for c in data["cases"]]
        return cls(**{**data, "cases": cases})


class CodecClock:
    """Seconds spent in one compressor instance's encoding (``encode``, ``round_trip``) and
    decoding (``decode``, ``decode_add_``, ``decode_into_``) since the last :meth:`take`. The
    methods are wrapped on the instance, so the scheme's error feedback and a server's decodes
    count too; a call made from inside another wrapped call is not counted twice."""

    ENCODING = ("encode", "round_trip")
    DECODING = ("decode", "decode_add_", "decode_into_")

    def __init__(self, compressor: Any) -> None:
        self.encode = 0.0
        self.decode = 0.0
        self._depth = 0
        for name in self.ENCODING + self.DECODING:
            part = "encode" if name in self.ENCODING else "decode"
            setattr(compressor, name, self._timed(getattr(compressor, name), part))

    def _timed(self, method: Callable[..., Any], part: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._depth:
                return method(*args, **kwargs)
            self._depth += 1
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self._depth -= 1
                setattr(self, part, getattr(self, part) + time.perf_counter() - start)

        return timed

    def take(self) -> tuple[float, float]:
        """The encode and decode seconds since the last call, and start again from zero."""
        spent = (self.encode, self.decode)
        self.encode = self.decode = 0.0
        return spent


def counter(device: str, name: str) -> int:
    """A statistics counter of ``device`` in this process's network namespace (0 if absent)."""
    try:
        return int(Path(f"/sys/class/net/{device}/statistics/{name}").read_text())
    except OSError:
        return 0


FIGURES = (
    "compute_s",
    "exchange_s",
    "encode_s",
    "decode_s",
    "tx_bytes",
    "rx_bytes",
    "payload_bytes",
)


class Exchange:
    """One case on this rank: its group, transport or baseline, gradients and figures."""

    def __init__(self, case: ExchangeCase, config: ExchangeConfig) -> None:
        import gradzip
        from gradzip.comm.distributed import DistributedTransport
        from gradzip.schemes import make_scheme

        self.case = case
        self.world_size = config.world_size
        self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=config.timeout))
        numel = 1
        for extent in case.shape:
            numel *= extent
        self.grads = [
            bench_gradient(config.rank, step, numel).reshape(case.shape)
            for step in range(GRADIENTS)
        ]
        self.figures: dict[str, list[float]] = {name: [] for name in FIGURES}
        self.transport: DistributedTransport | None = None
        self.clock: CodecClock | None = None
        if case.kind == "scheme":
            compressor = gradzip.create(case.compressor, **case.params)
            self.clock = CodecClock(compressor)
            self.scheme = make_scheme(
                case.scheme, compressor, run_seed=RUN_SEED, error_feedback=case.error_feedback
            )
            self.transport = DistributedTransport(group=self.group, timeout=config.timeout)
        elif case.kind != "allreduce":
            raise ValueError(f"unknown exchange kind {case.kind!r}; choose scheme or allreduce")

    def step(self, step: int, device: str, timed: bool) -> None:
        grad = self.grads[step % GRADIENTS]
        sent_before = self.transport.meter.total().sent if self.transport is not None else 0
        if self.clock is not None:
            self.clock.take()
        tx, rx = counter(device, "tx_bytes"), counter(device, "rx_bytes")
        computed = time.perf_counter()
        if self.transport is not None:
            self.scheme.reduce(self.transport, grad, step, 0)
        else:
            tensor = grad.clone()
            dist.all_reduce(tensor, group=self.group)
            tensor.div_(self.world_size)
        done = time.perf_counter()
        tx_after, rx_after = counter(device, "tx_bytes"), counter(device, "rx_bytes")
        encode, decode = self.clock.take() if self.clock is not None else (0.0, 0.0)
        if not timed:
            return
        sent = self.transport.meter.total().sent - sent_before if self.transport else 0
        for name, value in zip(
            FIGURES,
            (
                self.case.compute_seconds,
                done - computed,
                encode,
                decode,
                tx_after - tx,
                rx_after - rx,
                sent,
            ),
            strict=True,
        ):
            self.figures[name].append(value)


def _one_numba_thread() -> None:
    """One thread for numba's parallel kernels too: the ranks already share the machine's cores,
    and on a loaded machine a parallel region's threads wait for each other for a time slice."""
    import numba

    numba.set_num_threads(1)


def exchange_cases(config: ExchangeConfig) -> dict[str, Any]:
    """Every case, interleaved step by step, on an initialised default group (see the module
    docstring); this rank's figures per case label."""
    torch.set_num_threads(1)
    _one_numba_thread()
    exchanges = [Exchange(case, config) for case in config.cases]
    start = time.perf_counter()
    launcher = os.getppid()
    for step in range(config.warmup + config.steps):
        if os.getppid() != launcher:
            raise SystemExit("the launcher died: stopping")  # no orphan runs on
        for exchange in exchanges:
            dist.barrier()
            exchange.step(step, config.device, timed=step >= config.warmup)
        if config.rank == 0:  # the launcher forwards these lines
            print(
                f"{PROGRESS}step {step + 1}/{config.warmup + config.steps} done after "
                f"{time.perf_counter() - start:.0f} s",
                flush=True,
            )
    dist.barrier()
    return {"rank": config.rank, "cases": {e.case.label: e.figures for e in exchanges}}


def run_rank(config: ExchangeConfig) -> dict[str, Any]:
    """Join the group over the rank's veth, run :func:`exchange_cases`, leave the group."""
    join_group(config)
    try:
        return exchange_cases(config)
    finally:
        dist.destroy_process_group()


def main(argv: list[str]) -> int:
    config = ExchangeConfig.from_dict(json.loads(Path(argv[0]).read_text()))
    Path(argv[1]).write_text(json.dumps(run_rank(config)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
