"""DQGAN on 2 gloo processes gives bit for bit what 2 simulated ranks give: the parameters
after every step, for every variant, on the bilinear game and on a small WGAN."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

import pytest
import torch

import gradzip
from gradzip.algorithms.dqgan import DQGAN, BilinearGame, WGANGame, make_method
from gradzip.algorithms.dqgan.game import Game
from gradzip.comm.transport import Transport
from gradzip_lab.reproduce.dqgan.gaussian_ring import GaussianRing, ring_gan

if TYPE_CHECKING:
    from tests.conftest import RunSimulatedAndProcesses

#: (name, compressor, its parameters, DQGAN options) on the bilinear game
BILINEAR: tuple[tuple[str, str, dict[str, Any], dict[str, Any]], ...] = (
    ("hou-default", "hou", {"b": 4}, {}),
    ("topk-corrected-server-ef", "topk", {"ratio": 0.2}, {"extrapolation": "error_corrected", "server_ef": True}),
    ("topk-no-ef", "topk", {"ratio": 0.2}, {"error_feedback": False}),
    ("hou-optimistic-adam", "hou", {}, {"optimizer": "optimistic_adam"}),
)  # fmt: skip


def _digest(game: Game, algorithm: DQGAN, steps: int) -> tuple[str, int]:
    """SHA-256 of the parameters after every step, and the uplink wire bits of the run."""
    h, wire = hashlib.sha256(), 0
    for _ in range(steps):
        stats = algorithm.step()
        assert stats is not None
        wire += stats.wire_bits
        for p in game.parameters():
            h.update(p.detach().numpy().tobytes())
    return h.hexdigest(), wire


def run_all(transport: Transport) -> dict[str, tuple[str, int]]:
    """Every variant for a few steps. Module level, so spawned processes import it."""
    torch.set_num_threads(1)
    out = {}
    for name, compressor, params, options in BILINEAR:
        game = BilinearGame(12, workers=transport.world_size, heterogeneity=0.3, noise=0.1)
        algorithm = DQGAN(
            game, transport, gradzip.create(compressor, **params), lr=0.1, run_seed=5, **options
        )
        out[name] = _digest(game, algorithm, 6)
    for method in ("dqgan", "cpoadam", "cpoadam-gq"):
        generator, critic = ring_gan(seed=1, noise_dim=4, hidden=16)
        wgan = WGANGame(generator, critic, GaussianRing(), batch_size=8, noise_shape=(4,))
        out[f"wgan-{method}"] = _digest(wgan, make_method(method, wgan, transport, lr=1e-3), 4)
    return out


@pytest.mark.distributed
def test_gloo_processes_equal_simulated_ranks(
    simulated_and_processes: RunSimulatedAndProcesses,
) -> None:
    runs = simulated_and_processes(2, run_all)
    real, simulated = runs.processes, runs.simulated
    assert real == simulated
    for name in real[0]:  # every rank holds the same parameters after every step
        assert real[0][name][0] == real[1][name][0], name
