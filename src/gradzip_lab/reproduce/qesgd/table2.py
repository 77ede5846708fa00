"""``qesgd-table2``: the communication of the QESGD paper's Table 2 (parameter server, 4 and 8
GPUs), measured: bits per worker per epoch of distributed QESGD (Algorithm 3: fp32 gradients up,
8-bit offset codes down, ``w_{t+1}`` once per epoch) against SGD on the same parameter server
(fp32 up, fp32 mean down: the ``ps[fp32]`` scheme with the ``identity`` compressor).

The paper's speedups (time per epoch of SGD over QESGD, ideal ``2 / (1 + 8/32) = 1.6``) need
bandwidth-limited links between machines and are left for later; what is recorded now is the
traffic those speedups come from, counted by the transports (payloads, headers and 8-byte length
prefixes). The ratio of the two is the speedup a purely bandwidth-bound epoch would get.

What runs: the real SPMD code of both algorithms on P simulated ranks (rank 0 is the server and
also a worker, so P - 1 gradients cross the wire), the parameter vector of ResNet-56 (853,018
parameters; the paper's row says 0.85M), and one epoch of ``K`` iterations. The gradients are deterministic pseudo-random vectors rather than real ones
[CHOICE]: with fixed-width packing a payload's size does not depend on the values, and the
ResNet-56 forward and backward passes would cost 2 CPU cores hours per epoch. AlexNet (57M) and
VGG-19 (140M) are not run (their gradients would not fit several simulated workers in memory);
the per-coordinate traffic, and so the ratio, does not depend on the model's size beyond the
headers.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

import gradzip
from gradzip.algorithms.qesgd.schedule import DeltaSchedule
from gradzip.algorithms.qesgd.server import DistributedQESGD
from gradzip.comm.local import run_local
from gradzip.comm.transport import Transport
from gradzip.models.resnet import resnet
from gradzip.schemes import make_scheme
from gradzip.sync import GradientSync
from gradzip_lab.reproduce.outcome import Outcome, Row

#: Table 2: model -> (parameters in M, speedup at 4 GPUs, at 8 GPUs)
PAPER_TABLE2 = {
    "ResNet-56": (0.85, 1.12, 1.31),
    "AlexNet": (57.0, 1.34, 1.49),
    "VGG-19": (140.0, 1.39, 1.38),
}
IDEAL_SPEEDUP = 2 / (1 + 8 / 32)
#: CIFAR-10 iterations per epoch at batch 128 (50,000 images, whole batches)
FULL_K, QUICK_K = 390, 4
MODELS = {"ResNet-56": 56}


def gradient(rank: int, step: int, d: int) -> torch.Tensor:
    """A worker's stand-in gradient (sum over its batch): deterministic, small."""
    return torch.randn(d, generator=torch.Generator().manual_seed(1000 * step + rank)) * 1e-3


def worker_traffic(transport: Transport, skip: tuple[str, ...] = ()) -> dict[str, int]:
    """Bytes this rank sent and received over the run, less the collectives in ``skip``."""
    total = transport.meter.total()
    sent, received = total.sent, total.received
    for name in skip:
        t = transport.meter.total(collective=name)
        sent, received = sent - t.sent, received - t.received
    return {"sent": sent, "received": received}


def qesgd_epoch(transport: Transport, w0: torch.Tensor, steps: int) -> dict[str, int]:
    """One epoch of Algorithm 3 (8 bits); this rank's traffic, set-up excluded."""
    q = DistributedQESGD(transport, w0, batch_size=128, bits=8)
    q.set_schedule(DeltaSchedule((1.0,), 8, 10.0))
    transport.meter.reset()  # w_0's broadcast happens once per run, not per epoch
    for step in range(steps):
        q.step(gradient(transport.rank, step, w0.numel()), lr=0.1, end_epoch=step == steps - 1)
    return worker_traffic(transport)


def sgd_epoch(transport: Transport, d: int, steps: int) -> dict[str, int]:
    """One epoch of parameter-server SGD with fp32 both ways; this rank's traffic (the
    finite-gradient flags of the library's synchronisation excluded: the paper has none)."""
    scheme = make_scheme("ps[fp32]", gradzip.create("identity"), run_seed=0)
    sync = GradientSync(transport, scheme=scheme)
    for step in range(steps):
        sync.synchronize([gradient(transport.rank, step, d) / 128])
    return worker_traffic(transport, skip=("finite_check",))


def measure(d_model: int, workers: int, steps: int) -> dict[str, Any]:
    """Per remote worker (mean over ranks 1..P-1): bits per epoch for both algorithms."""
    w0 = torch.nn.utils.parameters_to_vector(resnet(d_model).parameters()).detach()
    d = w0.numel()
    q = run_local(workers, lambda t: qesgd_epoch(t, w0, steps))
    s = run_local(workers, lambda t: sgd_epoch(t, d, steps))

    def per_worker(results: list[dict[str, int]]) -> float:
        return sum(8 * (r["sent"] + r["received"]) for r in results[1:]) / (workers - 1)

    return {
        "d": d,
        "steps": steps,
        "qesgd_bits": per_worker(q),
        "sgd_bits": per_worker(s),
        "qesgd_uplink_bits": sum(8 * r["sent"] for r in q[1:]) / (workers - 1),
        "qesgd_downlink_bits": sum(8 * r["received"] for r in q[1:]) / (workers - 1),
    }


def run(out: Path, quick: bool) -> Outcome:
    steps = QUICK_K if quick else FULL_K
    started = time.perf_counter()
    measured: dict[str, dict[str, Any]] = {}
    rows: list[Row] = []
    for name, depth in MODELS.items():
        for workers in (4, 8):
            m = measure(depth, workers, steps)
            measured[f"{name}/{workers}"] = m
            ratio = m["sgd_bits"] / m["qesgd_bits"]
            paper = PAPER_TABLE2.get(name)
            speedup = None if paper is None else paper[1 if workers == 4 else 2]
            rows += [
                Row(
                    f"{name}, {workers} workers: SGD Mbit per worker per epoch",
                    None,
                    m["sgd_bits"] / 1e6,
                    "Mbit",
                ),
                Row(
                    f"{name}, {workers} workers: QESGD Mbit per worker per epoch",
                    None,
                    m["qesgd_bits"] / 1e6,
                    "Mbit",
                ),
                Row(
                    f"{name}, {workers} workers: traffic ratio SGD / QESGD (ideal speedup 1.6)",
                    IDEAL_SPEEDUP,
                    ratio,
                    "x",
                ),
            ]
            if speedup is not None:
                rows.append(
                    Row(f"{name}, {workers} GPUs: measured speedup (paper)", speedup, None, "x")
                )
    for name in ("AlexNet", "VGG-19"):
        for i, workers in ((1, 4), (2, 8)):
            rows.append(
                Row(
                    f"{name}, {workers} GPUs: measured speedup (paper)",
                    PAPER_TABLE2[name][i],
                    None,
                    "x",
                )
            )
    scaled = [
        f"One epoch of {steps} iterations per configuration"
        + (
            " (CIFAR-10 at batch 128)"
            if not quick
            else f" (--quick: {QUICK_K} iterations, so "
            "the once-per-epoch w_{t+1} weighs far more than in a real epoch)"
        )
        + "; simulated ranks on one machine, real payloads and transports.",
        "Gradients are pseudo-random stand-ins (payload sizes do not depend on the values); "
        "AlexNet and VGG-19 are not run; no wall-clock speedup is measured (left for "
        "bandwidth-limited links), so those rows have no value of ours.",
    ]
    return Outcome(
        id="qesgd-table2",
        title="QESGD paper, Table 2: parameter-server traffic per epoch, SGD vs QESGD (8 bits)",
        quick=quick,
        rows=rows,
        scaled_down=scaled,
        notes=[
            "Bits per worker per epoch = 8 x (bytes sent + bytes received) by a non-server rank, "
            "as its transport counted them (payload headers and length prefixes included), mean "
            "over the P - 1 remote workers. QESGD: each iteration 32 d up (fp32 gradient) and 8 d "
            "down (codes), plus 32 d down once per epoch (w_{t+1}); SGD: 32 d each way.",
            "The ratio is the speedup of an epoch whose time is all communication on "
            "bandwidth-bound links; the paper's measured speedups are below 1.6 because "
            "computation does not shrink.",
            f"Wall time: {time.perf_counter() - started:.1f} s.",
        ],
        extra={"measured": measured},
    )
