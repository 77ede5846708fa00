"""``dqgan-speedup``: DQGAN's speed-up against the number of workers (Fig. 4, spec 4.6), timed on
the emulated cluster (needs root).

The paper plots, for DCGAN on CIFAR-10 and CelebA with up to 32 workers, the speed-up of
training with 8-bit quantized gradients (DQGAN) and with float32 ones (CPOAdam); its text gives
no numbers, only the shape: the speed-up grows with the number of workers, and 8 bits beat 32
bits, most clearly at 32 workers. Here ``P`` ranks each compute a GAN step on a fixed batch per
worker and exchange the model's gradient through a parameter server (Algorithm 2: the workers'
messages averaged at rank 0, the mean sent back in float32: ``ps[fp32]``), with Hou's 8-bit
quantizer (``hou``, ``b=8``) or in float32 (``identity``), interleaved. An epoch of ``N``
examples takes ``N / (P b)`` such steps, so the speed-up over one worker (no communication) is
``P * compute / step time``.

Model [RECON, spec 4.6]: DCGAN for 32-pixel images with ``nz = 100`` and ``ngf = ndf = 64``
(generator 100 -> 4ngf x 4 x 4 -> 2ngf x 8 x 8 -> ngf x 16 x 16 -> 3 x 32 x 32, critic the
mirror image, batch normalisation in neither). Its step's compute (critic on real and fake
images, then the generator through the critic) is measured on one thread of this machine and
added to each step (see :mod:`gradzip_lab.bench.cluster_exchange`).

The shape depends on ``rho``, one float32 gradient's transfer time on a link over a worker's
compute per step: with a parameter server the step's exchange grows like ``P - 1`` gradients,
so the speed-up ``P c / (c + e_P)`` grows with ``P`` only while the compute ``c`` outweighs the
transfers. The paper gives neither its compute nor its network, and the one-thread compute
measured here moves ``rho`` with the machine's load (several-fold between loaded and quiet). So besides
the measured compute, the speed-ups are also given at stated ratios ``RATIOS`` [CHOICE], with
the compute ``32 d / rate / rho``: the computation is added, never run, so the same measured
exchanges serve every ``rho``, and those rows depend on this machine only through the codecs'
cost.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from gradzip_lab.bench.cluster_exchange import ExchangeCase
from gradzip_lab.bench.cluster_timing import (
    case_summaries,
    measure_exchanges,
    median_step,
    paired_ratio,
)
from gradzip_lab.reproduce.outcome import Outcome, Row
from gradzip_lab.reproduce.timing_setup import method_notes, one_thread_seconds

RATE, RATE_BITS_PER_S = "100mbit", 100e6
#: rho: one float32 gradient's transfer time over a worker's compute per step [CHOICE]
RATIOS = (0.25, 1.0)
NZ, WIDTH = 100, 64
FULL_WORKERS, QUICK_WORKERS = (2, 4, 8), (2, 4)
FULL_BATCH, QUICK_BATCH = 128, 32
FULL_STEPS, QUICK_STEPS = 4, 2
VARIANTS = {"CPOAdam fp32": ("identity", {}), "DQGAN 8-bit": ("hou", {"b": 8})}


def dcgan32() -> tuple[nn.Module, nn.Module]:
    """The generator and critic of the module docstring."""
    g = nn.Sequential(
        nn.Unflatten(1, (NZ, 1, 1)),
        nn.ConvTranspose2d(NZ, 4 * WIDTH, 4, 1, 0),
        nn.ReLU(),
        nn.ConvTranspose2d(4 * WIDTH, 2 * WIDTH, 4, 2, 1),
        nn.ReLU(),
        nn.ConvTranspose2d(2 * WIDTH, WIDTH, 4, 2, 1),
        nn.ReLU(),
        nn.ConvTranspose2d(WIDTH, 3, 4, 2, 1),
        nn.Tanh(),
    )
    d = nn.Sequential(
        nn.Conv2d(3, WIDTH, 4, 2, 1),
        nn.LeakyReLU(0.2),
        nn.Conv2d(WIDTH, 2 * WIDTH, 4, 2, 1),
        nn.LeakyReLU(0.2),
        nn.Conv2d(2 * WIDTH, 4 * WIDTH, 4, 2, 1),
        nn.LeakyReLU(0.2),
        nn.Conv2d(4 * WIDTH, 1, 4, 1, 0),
        nn.Flatten(),
    )
    return g, d


def parameters() -> int:
    """Values in the generator's and the critic's gradients together."""
    g, d = dcgan32()
    return sum(p.numel() for m in (g, d) for p in m.parameters())


def gan_step_seconds(batch: int) -> float:
    """One thread's time for a WGAN step of the DCGAN on ``batch`` images: the critic's loss on
    real and generated images and its backward, then the generator's through the critic."""
    torch.manual_seed(0)
    g, d = dcgan32()
    real = torch.randn(batch, 3, 32, 32)

    def step() -> None:
        fake = g(torch.randn(batch, NZ))
        (d(fake.detach()).mean() - d(real).mean()).backward()
        (-d(fake).mean()).backward()

    return one_thread_seconds(step)


def cases(numel: int, compute: float) -> list[ExchangeCase]:
    return [
        ExchangeCase(
            name, "scheme", (numel,), compressor, params, "ps[fp32]", compute_seconds=compute
        )
        for name, (compressor, params) in VARIANTS.items()
    ]


def transfer_seconds(numel: int) -> float:
    """One float32 gradient of ``numel`` values on a link of ``RATE``, headers aside."""
    return 32 * numel / RATE_BITS_PER_S


def speedup_rows(
    ranks: list[dict[str, Any]], world: int, compute: float, rho: float | None = None
) -> list[Row]:
    """At ``world`` workers and ``compute`` seconds per step: each variant's speed-up over one
    worker, and 8-bit's over fp32 (``rho``: the stated ratio that set ``compute``, named in
    the rows; ``None``: the compute measured here, which the ranks recorded)."""
    at = "" if rho is None else f", rho {rho:g}"
    stated = None if rho is None else compute
    rows = [
        Row(
            f"speed-up over 1 worker, {name}, {world} workers{at}",
            None,
            world * compute / median_step(ranks, name, stated),
            "x",
        )
        for name in VARIANTS
    ]
    fp32, q8 = VARIANTS
    rows.append(
        Row(
            f"8-bit over fp32 step time ratio, {world} workers{at}",
            None,
            paired_ratio(ranks, fp32, q8, stated),
            "x",
        )
    )
    return rows


def run(out: Path, quick: bool) -> Outcome:
    workers = QUICK_WORKERS if quick else FULL_WORKERS
    batch = QUICK_BATCH if quick else FULL_BATCH
    steps = QUICK_STEPS if quick else FULL_STEPS
    numel, compute = parameters(), gan_step_seconds(batch)
    rows: list[Row] = []
    measured: dict[str, Any] = {}
    for index, world in enumerate(workers):
        ranks = measure_exchanges(
            world, RATE, cases(numel, compute), steps=steps, warmup=1, run=index
        )
        rows += speedup_rows(ranks, world, compute)
        for rho in RATIOS:
            rows += speedup_rows(ranks, world, transfer_seconds(numel) / rho, rho)
        measured[str(world)] = case_summaries(ranks)
    return Outcome(
        id="dqgan-speedup",
        title="DQGAN Fig. 4: speed-up against the number of workers",
        quick=quick,
        rows=rows,
        scaled_down=[
            f"{', '.join(map(str, workers))} workers, not up to 32: every rank runs on this "
            "machine's 2 shared cores.",
            f"DCGAN for 32-pixel images ({numel:,} parameters), {batch} images per worker and "
            f"step; its compute, {compute:.3f} s measured on one thread here, is added to each "
            "rank (a CPU core is some 100 times slower than the paper's GPUs).",
            f"Links of {RATE} [CHOICE]: the paper used NCCL between GPUs, far faster, and "
            "gives neither its network nor its compute per step. What sets the shape is rho, "
            f"one float32 gradient's transfer time ({transfer_seconds(numel):.3f} s here) over "
            f"the compute per step: {transfer_seconds(numel) / compute:.2f} with the compute "
            "measured here, and the stated ratios "
            f"{', '.join(f'{r:g}' for r in RATIOS)} [CHOICE] in the rows that name rho (compute "
            "= transfer / rho; the compute is added, not run, so the same exchanges serve "
            "every rho).",
            "CIFAR-10 only: the CelebA curve (larger images, larger model) and the claim that "
            "the gain grows with the data size are not measured.",
            f"{steps} timed steps per variant after one warm-up.",
        ],
        notes=[
            *method_notes(RATE, f"P = {', '.join(map(str, workers))}"),
            "Shape: the paper's speed-up grows with the number of workers and 8-bit gradients "
            "give more of it than float32 ones, the more so the more workers. The rows give the "
            "speed-up of each variant at each P and the ratio of their step times; the paper "
            "prints no numbers (its Fig. 4 is a plot), so no paper column.",
            "Differences to expect: a parameter server's link carries P - 1 gradients each way, "
            "so the speed-up flattens sooner than over NCCL's all-reduce; the server decodes "
            "P - 1 payloads on the shared cores.",
        ],
        extra={
            "rate": RATE,
            "parameters": numel,
            "batch": batch,
            "compute_s": compute,
            "transfer_s": transfer_seconds(numel),
            "ratios": list(RATIOS),
            "steps": steps,
            "cases": measured,
        },
    )
