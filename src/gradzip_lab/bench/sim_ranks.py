"""``gradzip bench sim-ranks``: simulated ranks with device tensors average exactly as on the CPU.

P ranks run as threads over the in-process transport (:func:`gradzip.comm.local.run_local`,
what the tests use to simulate ranks), each handing its gradients to a
:class:`~gradzip.sync.GradientSync` for a few steps. The run is done twice, once with the
gradients on ``device`` and once on the CPU, and every rank's every mean of every step must be
equal bit for bit (``torch.equal`` after ``.cpu()``): the payloads are the same bytes wherever
the tensor lives, so the averages must be too. On a CPU-only machine the device is the CPU and
the check is trivially true, but the same code path runs.

The cases are exchange specs as ``gradzip bench cluster`` names them: error feedback and
PowerSGD's warm start keep state across steps, so a device-only drift would compound there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gradzip.comm.local import run_local
from gradzip.comm.transport import Transport
from gradzip.schemes.spec import ExchangeSpec
from gradzip.sync import GradientSync

#: the exchanges checked: the all-gathered quantizers, a biased one under error feedback, and
#: PowerSGD with fp16 factors (compressed from its first step: no vanilla warm-up steps)
CASES = (
    "gradzip:dqsg[M=2]:allgather",
    "gradzip:qsgd:allgather",
    "gradzip:onebit+ef:allgather",
    "gradzip:fp16+ef:powersgd[r1]",
)
#: the gradients' shapes: two matrices (PowerSGD compresses those) and a bias
SHAPES = ((64, 48), (48,), (300, 100))
RUN_SEED = 2024


@dataclass
class CaseResult:
    """One exchange's verdict: whether the device run equals the CPU run, and where not."""

    spec: str
    equal: bool
    detail: str  # empty when equal; else the first (rank, step, tensor) that differs


def gradients(rank: int, step: int, device: torch.device) -> list[torch.Tensor]:
    """Rank ``rank``'s gradients of step ``step``: drawn on the CPU from one seed per (rank,
    step), then moved, so that both runs see the same values."""
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return [torch.randn(shape, generator=gen).to(device) for shape in SHAPES]


def run_ranks(
    spec: str, device: torch.device, world_size: int, steps: int
) -> list[list[list[torch.Tensor]]]:
    """The means every simulated rank got at every step (``[rank][step][tensor]``, on the CPU)."""

    def rank_body(transport: Transport) -> list[list[torch.Tensor]]:
        sync = GradientSync(transport, scheme=ExchangeSpec.parse(spec).build(RUN_SEED))
        out = []
        for step in range(steps):
            means = sync.synchronize(gradients(transport.rank, step, device))
            assert means is not None  # finite gradients: no step is skipped
            out.append([m.cpu() for m in means])
        return out

    return run_local(world_size, rank_body)


def _first_difference(
    got: list[list[list[torch.Tensor]]], want: list[list[list[torch.Tensor]]]
) -> str:
    for rank, (g_rank, w_rank) in enumerate(zip(got, want, strict=True)):
        for step, (g_step, w_step) in enumerate(zip(g_rank, w_rank, strict=True)):
            for index, (g, w) in enumerate(zip(g_step, w_step, strict=True)):
                if not torch.equal(g, w):
                    worst = float((g - w).abs().max()) if g.shape == w.shape else float("nan")
                    return f"rank {rank}, step {step}, tensor {index}: max |diff| {worst:.3g}"
    return ""


def check(
    device: torch.device,
    world_size: int = 4,
    steps: int = 3,
    specs: Sequence[str] = CASES,
) -> list[CaseResult]:
    """Each exchange of ``specs`` on ``world_size`` simulated ranks for ``steps`` steps, with
    the gradients on ``device`` and on the CPU; whether the two give equal means."""
    results = []
    for spec in specs:
        on_device = run_ranks(spec, device, world_size, steps)
        on_cpu = run_ranks(spec, torch.device("cpu"), world_size, steps)
        detail = _first_difference(on_device, on_cpu)
        results.append(CaseResult(spec, not detail, detail))
    return results
