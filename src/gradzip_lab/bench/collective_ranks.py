"""What every rank runs in ``gradzip bench collectives``: the cases, the gradients, the timing.

One spawn per world size runs :func:`rank_main` on every rank, which loops over all the cases
(scheme x compressor) and then the PyTorch baselines, so process start-up is paid once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from gradzip.comm.transport import Transport
from gradzip.compressors.registry import create
from gradzip.schemes import Scheme, make_scheme
from gradzip_lab.bench.collective_baselines import ddp_fp16_hook, fp32_allreduce
from gradzip_lab.bench.collective_figures import RankFigures, barrier

RUN_SEED = 2024
NOISE = 0.5  # per-rank spread around the common gradient (ranks' gradients are correlated)


@dataclass(frozen=True)
class Case:
    """One row of the table: a scheme (with its own options) around one compressor."""

    label: str  # the scheme's name, with its options in brackets where it has variants
    scheme: str
    compressor: str
    error_feedback: bool
    options: tuple[tuple[str, Any], ...] = ()

    def build(self) -> Scheme:
        return make_scheme(
            self.scheme,
            create(self.compressor),
            run_seed=RUN_SEED,
            error_feedback=self.error_feedback,
            **dict(self.options),
        )


def bench_gradient(rank: int, step: int, numel: int) -> torch.Tensor:
    """Rank ``rank``'s float32 gradient at ``step``: a common N(0, 1) part plus N(0, NOISE^2)
    noise of its own, both reproducible from ``(step, rank)``."""
    common = torch.randn(numel, generator=torch.Generator().manual_seed(1_000_003 * step + 7))
    own = torch.Generator().manual_seed(1_000_003 * step + 11 + 7919 * (rank + 1))
    return common.add_(torch.randn(numel, generator=own), alpha=NOISE)


def measure_scheme(transport: Transport, scheme: Scheme, grads: list[torch.Tensor]) -> RankFigures:
    """Run ``scheme.reduce`` once per gradient (the first is the warm-up); bytes are what the
    transport's meter counted during each call, time is the call's wall time on this rank."""
    figures = RankFigures()
    for step, grad in enumerate(grads):
        barrier(transport)
        before = transport.meter.total()
        start = time.perf_counter()
        scheme.reduce(transport, grad, step, 0)
        elapsed = time.perf_counter() - start
        after = transport.meter.total()
        if step:
            figures.sent.append(after.sent - before.sent)
            figures.received.append(after.received - before.received)
            figures.seconds.append(elapsed)
    return figures


def rank_main(
    transport: Transport, cases: list[Case], numel: int, steps: int, baselines: bool
) -> list[RankFigures]:
    """Every case in order, then (if ``baselines``) fp32 all-reduce and DDP's fp16 hook."""
    grads = [bench_gradient(transport.rank, step, numel) for step in range(steps + 1)]
    out = [measure_scheme(transport, case.build(), grads) for case in cases]
    if baselines:
        out.append(fp32_allreduce(transport, grads))
        out.append(ddp_fp16_hook(transport, grads))
    return out
