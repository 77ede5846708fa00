"""Simulation equals reality: for every compressor x scheme, P simulated ranks (threads) and P
gloo processes give bit-identical averaged gradients and parameters."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import torch

import gradzip
from gradzip.comm.transport import Transport
from gradzip.compressors.base import Compressor
from gradzip.optim import CompressedOptimizer
from gradzip.schemes import VARIANTS, SchemeSpec, make_scheme, scheme_accepts
from gradzip.sync import GradientSync

if TYPE_CHECKING:
    from tests.conftest import RunSimulatedAndProcesses

BIASED = {"onebit", "topk", "randk", "threshold", "adaptive"}


def compressor(name: str) -> Compressor:
    cls = gradzip.get(name)
    return cls(**cls.example_params)


def combinations() -> list[tuple[str, str, bool]]:
    """(variant, compressor, error feedback) for every compatible pair of the registries;
    biased compressors run with error feedback where the scheme keeps any."""
    out = []
    for variant in VARIANTS:
        scheme = SchemeSpec.parse(variant).name
        for name in gradzip.names():
            if not scheme_accepts(variant, compressor(name)):
                continue
            ef = name in BIASED and scheme != "nested"
            out.append((variant, name, ef))
    return out


def net() -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return model


def train_all(transport: Transport, steps: int) -> dict[str, bytes]:
    """Train a small model for ``steps`` steps with every combination; the parameters and the
    last averaged gradients as bytes. Module level, so spawned processes can import it."""
    results = {}
    for variant, name, ef in combinations():
        model = net()
        scheme = make_scheme(variant, compressor(name), run_seed=21, error_feedback=ef)
        opt = CompressedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), GradientSync(transport, scheme=scheme)
        )
        for step in range(steps):
            gen = torch.Generator().manual_seed(100 * step + transport.rank)
            x, y = torch.randn(8, 6, generator=gen), torch.randn(8, 2, generator=gen)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        state = [p.detach() for p in model.parameters()] + [
            p.grad for p in model.parameters() if p.grad is not None
        ]
        results[f"{variant}/{name}/{ef}"] = b"".join(t.numpy().tobytes() for t in state)
    return results


def test_the_combinations_cover_every_scheme_and_compressor() -> None:
    combos = combinations()
    assert {v for v, _, _ in combos} == set(VARIANTS)
    assert {n for _, n, _ in combos} == set(gradzip.names())


@pytest.mark.distributed
@pytest.mark.parametrize("world_size", [2, 3])
def test_simulated_ranks_equal_gloo_processes_bit_for_bit(
    world_size: int, simulated_and_processes: RunSimulatedAndProcesses
) -> None:
    runs = simulated_and_processes(world_size, train_all, 2)
    real, simulated = runs.processes, runs.simulated
    for rank in range(world_size):
        assert real[rank].keys() == simulated[rank].keys()
        differ = [k for k in real[rank] if real[rank][k] != simulated[rank][k]]
        assert not differ, f"rank {rank}: simulation and processes differ for {differ}"
    # and every rank holds the same model
    for key in real[0]:
        assert len({real[r][key] for r in range(world_size)}) == 1, key
