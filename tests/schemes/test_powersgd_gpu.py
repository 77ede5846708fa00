"""PowerSGD on a real GPU: the torch twins on CUDA tensors give the CPU kernels' bits, and
simulated ranks holding CUDA gradients give the CPU run's means, factors and payloads bit for
bit. Runs where a CUDA device exists; skipped elsewhere (CI has none: there the same
properties are checked through the forced device path and fake CUDA tensors,
tests/schemes/test_powersgd_device.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from gradzip.comm.local import run_local
from gradzip.comm.transport import Transport
from gradzip.compressors import registry
from gradzip.kernels import lowrank, lowrank_torch
from gradzip.schemes.powersgd import PowerSGD

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SHAPES = [(40,), (33, 20), (16, 3, 3, 3), (300, 513)]


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).cpu().view(torch.int32)


@pytest.mark.parametrize("rank", [1, 4])
@pytest.mark.parametrize("shape", [(4096, 4096), (1030, 9), (65, 130)])
def test_cuda_twins_equal_cpu_kernels(shape: tuple[int, int], rank: int) -> None:
    n, m = shape
    g = torch.Generator().manual_seed(n + m + rank)
    matrix = torch.randn(n, m, generator=g)
    qt = torch.randn(rank, m, generator=g)
    pt = torch.empty(rank, n)
    lowrank.project_into(matrix, qt, pt)
    lowrank.orthonormalize_(pt)
    back = torch.empty(rank, m)
    lowrank.back_project_into(matrix, pt, back)
    out = torch.empty(n, m)
    lowrank.reconstruct_into(pt, back, out)
    mc, qc = matrix.cuda(), qt.cuda()
    pc = lowrank_torch.project(mc, qc)
    pc = lowrank_torch.orthonormalized(pc)
    assert torch.equal(bits(pc), bits(pt))
    bc = lowrank_torch.back_project(mc, pc)
    assert torch.equal(bits(bc), bits(back))
    assert torch.equal(bits(lowrank_torch.reconstruct(pc, bc)), bits(out))


def train(world: int, codec: str, cuda: bool) -> list[Any]:
    def body(t: Transport) -> Any:
        scheme = PowerSGD(registry.get(codec)(), run_seed=7, error_feedback=True, rank=2)
        out = []
        for step in range(3):
            g = torch.Generator().manual_seed(1000 * step + t.rank)
            grads = [torch.randn(s, generator=g) * 0.01 for s in SHAPES]
            if cuda:
                grads = [x.cuda() for x in grads]
            means, down = scheme.reduce_many_if_all_finite(
                t, grads, list(range(len(grads))), step, True
            )
            assert not down
            out.append([bits(m) for m in means])
        state = scheme.snapshot()
        return out, {p: {k: bits(v) for k, v in state[p].items()} for p in state}

    return run_local(world, body)


@pytest.mark.parametrize("codec", ["fp16", "identity"])
@pytest.mark.parametrize("world", [2, 3])
def test_cuda_ranks_equal_cpu_ranks(world: int, codec: str) -> None:
    cpu, gpu = train(world, codec, False), train(world, codec, True)
    for (c_means, c_state), (g_means, g_state) in zip(cpu, gpu, strict=True):
        for c_step, g_step in zip(c_means, g_means, strict=True):
            for c, g in zip(c_step, g_step, strict=True):
                assert torch.equal(c, g)
        for part in c_state:
            for slot, value in c_state[part].items():
                assert torch.equal(value, g_state[part][slot])
