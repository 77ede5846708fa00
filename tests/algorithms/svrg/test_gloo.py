"""LPC-SVRG, ALPC-SVRG and the baselines on 2 gloo processes give bit for bit what 2 simulated
ranks give: every iterate after every round, the output and the measured bits."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import pytest
import torch

from gradzip.algorithms.svrg import (
    ALPCSVRG,
    L1,
    LPCSVRG,
    ALPCSVRGConfig,
    DistributedAlgorithm,
    LPCSVRGConfig,
    QuantizedSGD,
    SGDConfig,
    synthetic_regression,
)
from gradzip.comm.transport import Transport

if TYPE_CHECKING:
    from tests.conftest import RunSimulatedAndProcesses


def state_bytes(algo: DistributedAlgorithm) -> bytes:
    """Every iterate the algorithm holds (x; x_tilde, y, z for ALPC-SVRG)."""
    tensors = [algo.point(), algo.output()]
    if isinstance(algo, ALPCSVRG):
        tensors += [algo.z, algo.x_tilde]
    return b"".join(t.numpy().tobytes() for t in tensors)


def run_all(transport: Transport) -> dict[str, tuple[str, int, int]]:
    """Each method for a few epochs on a small problem: (digest of the states after every
    round, inner bits, full-gradient bits). Module level, so spawned processes import it."""
    torch.set_num_threads(1)
    problem, _ = synthetic_regression(200, 24, seed=9)
    runs: dict[str, DistributedAlgorithm] = {}
    for scheme in "abc":
        config = LPCSVRGConfig(epochs=2, inner=6, lr=0.05, batch=4, b=3, theta=0.8, scheme=scheme)
        runs[f"lpc-{scheme}"] = LPCSVRG(transport, problem, config, prox=L1(0.01))
    alpc = ALPCSVRGConfig(epochs=2, inner=6, L=10.0, sigma=0.3, batch=4, b=4, scheme="b")
    runs["alpc-2"] = ALPCSVRG(transport, problem, alpc)
    runs["alpc-3"] = ALPCSVRG(
        transport, problem, ALPCSVRGConfig(epochs=2, inner=6, L=10.0, strongly_convex=False)
    )
    runs["ecq-sgd"] = QuantizedSGD(
        transport, problem, SGDConfig(steps=10, lr=0.02, batch=4, method="ecq-sgd", levels=1)
    )
    out = {}
    for name, algo in runs.items():
        h = hashlib.sha256()
        result = algo.run(on_step=lambda a, h=h: h.update(state_bytes(a)))
        h.update(result.x.numpy().tobytes())
        out[name] = (h.hexdigest(), result.bits, result.full_bits)
    return out


@pytest.mark.distributed
def test_gloo_processes_equal_simulated_ranks(
    simulated_and_processes: RunSimulatedAndProcesses,
) -> None:
    runs = simulated_and_processes(2, run_all)
    real, simulated = runs.processes, runs.simulated
    assert real == simulated
    # and every rank holds the same iterates (the bits differ: the ranks' roles differ)
    for name in real[0]:
        assert real[0][name][0] == real[1][name][0], name
