"""PowerSGD's device path (issue 28): torch operations in the numba kernels' order give the host
path's factors, means and state bit for bit, and read nothing gradient-sized on the host."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import gradzip
from gradzip.comm.local import run_local
from gradzip.comm.transport import Transport
from gradzip.device.host_reads import count_host_reads
from gradzip.device.mode import forced_device_payloads
from gradzip.kernels import lowrank, lowrank_torch
from gradzip.schemes import PowerSGD

SHAPES = [(3, 5), (7, 13), (16, 33), (100, 257), (64, 3, 3, 3)]


@pytest.mark.parametrize("rank", [1, 2, 4])
@pytest.mark.parametrize("shape", SHAPES)
def test_torch_kernels_equal_the_numba_kernels_bit_for_bit(
    shape: tuple[int, ...], rank: int
) -> None:
    gen = torch.Generator().manual_seed(rank)
    n = shape[0]
    m = torch.Size(shape).numel() // n
    r = min(rank, n, m)
    matrix = torch.randn(n, m, generator=gen) * 3
    qt = torch.rand(r, m, generator=gen) * 2 - 1
    pt = torch.empty(r, n)
    lowrank.project_into(matrix, qt, pt)
    assert torch.equal(lowrank_torch.project(matrix, qt), pt)
    ortho = lowrank_torch.orthonormalize(pt)
    lowrank.orthonormalize_(pt)
    assert torch.equal(ortho, pt)
    back = torch.empty(r, m)
    lowrank.back_project_into(matrix, pt, back)
    assert torch.equal(lowrank_torch.back_project(matrix, pt), back)
    out = torch.empty(n, m)
    lowrank.reconstruct_into(pt, back, out)
    assert torch.equal(lowrank_torch.reconstruct(pt, back), out)


def _steps(codec: str, rank: int, steps: int = 3) -> list[tuple[list[torch.Tensor], list[bytes]]]:
    def run(t: Transport) -> tuple[list[torch.Tensor], list[bytes]]:
        scheme = PowerSGD(gradzip.create(codec), run_seed=5, error_feedback=True, rank=rank)
        gen = torch.Generator().manual_seed(10 + t.rank)
        outs: list[torch.Tensor] = []
        for step in range(steps):
            grads = [torch.randn(*s, generator=gen) for s in SHAPES] + [
                torch.randn(9, generator=gen)
            ]
            means, down = scheme.reduce_many_if_all_finite(
                t, grads, list(range(len(grads))), step, True
            )
            assert not down
            outs += [mm.clone() for mm in means]
        state = scheme.snapshot()
        outs += [state["q"][k].clone() for k in sorted(state["q"])]
        outs += [state["residual"][k].clone() for k in sorted(state["residual"])]
        payloads = [
            bytes(p.numpy().tobytes()) if isinstance(p, torch.Tensor) else bytes(p)
            for p in getattr(scheme.produced, "payloads", [])
        ]
        return outs, payloads

    return run_local(2, run)


@pytest.mark.parametrize("rank", [1, 2, 4])
@pytest.mark.parametrize("codec", ["fp16", "identity"])
def test_the_device_path_gives_the_host_paths_means_and_state(codec: str, rank: int) -> None:
    host = _steps(codec, rank)
    with forced_device_payloads():
        device = _steps(codec, rank)
    for (h, _), (d, _) in zip(host, device, strict=True):
        assert len(h) == len(d)
        for a, b in zip(h, d, strict=True):
            assert a.dtype == b.dtype and torch.equal(a, b)


def test_powersgds_own_device_work_reads_nothing_on_the_host() -> None:
    """The products, the orthonormalisation, the residual and the result read nothing back
    (the factor scheme replaced by a device-side mean of one rank)."""
    grads = [torch.randn(100, 257), torch.randn(64, 27), torch.randn(9)]

    def run(t: Transport) -> int:
        scheme = PowerSGD(gradzip.create("fp16"), run_seed=5, error_feedback=True, rank=2)
        scheme.reduce_many_if_all_finite(t, grads, [0, 1, 2], 0, True)  # first Q from the host

        def mean(
            transport: Transport, values: torch.Tensor, step: int, index: int, finite: bool
        ) -> torch.Tensor:
            return values.clone()

        scheme.factors.reduce_if_all_finite = mean  # type: ignore[method-assign,assignment]
        with count_host_reads() as reads:
            scheme.reduce_many_if_all_finite(t, grads, [0, 1, 2], 1, True)
        assert reads.count == 0, reads.describe()
        return reads.count

    with forced_device_payloads():
        run_local(1, run)


def test_one_reduction_on_the_device_reads_only_headers_and_flags() -> None:
    """Bound, with P ranks: per factor message (two) and rank, the encoding's flag and a header
    and a flag per payload averaged (the all-gather's ``2P + 1`` without error feedback on the
    factors), each at most 128 bytes; counted over every rank of the second step (the first
    draws the warm-start Q)."""
    grads = [torch.randn(100, 257), torch.randn(64, 27)]
    ranks, messages = 2, 2
    schemes = [
        PowerSGD(gradzip.create("fp16"), run_seed=5, error_feedback=True, rank=2)
        for _ in range(ranks)
    ]

    def step(number: int) -> Callable[[Transport], None]:
        def run(t: Transport) -> None:
            schemes[t.rank].reduce_many_if_all_finite(t, grads, [0, 1], number, True)

        return run

    with forced_device_payloads():
        run_local(ranks, step(0))
        with count_host_reads() as reads:
            run_local(ranks, step(1))
    assert reads.largest <= 128, reads.describe()
    assert 0 < reads.count <= ranks * messages * (2 * ranks + 1), reads.describe()
