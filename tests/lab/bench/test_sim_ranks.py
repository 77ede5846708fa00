"""``gradzip bench sim-ranks``: simulated ranks' means with device tensors against CPU tensors
(CPU against CPU here: the same code path, trivially equal), and a difference is reported."""

from __future__ import annotations

import pytest
import torch

from gradzip.cli import main
from gradzip_lab.bench import sim_ranks


def test_cpu_ranks_equal_cpu_ranks() -> None:
    results = sim_ranks.check(torch.device("cpu"), world_size=4, steps=2)
    assert [r.spec for r in results] == list(sim_ranks.CASES)
    assert all(r.equal and not r.detail for r in results)


def test_a_difference_fails_the_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = sim_ranks.run_ranks
    calls: list[str] = []

    def drifted_first_run(
        spec: str, device: torch.device, world_size: int, steps: int
    ) -> list[list[list[torch.Tensor]]]:
        """The first case's device run, its rank 0's step-1 mean of tensor 1 nudged."""
        means = real(spec, device, world_size, steps)
        calls.append(spec)
        if len(calls) == 1:
            means[0][1][1] = means[0][1][1] + 1e-3
        return means

    monkeypatch.setattr(sim_ranks, "run_ranks", drifted_first_run)
    assert main(["bench", "sim-ranks", "--world-size", "3", "--steps", "2"]) == 1
    captured = capsys.readouterr()
    assert "DIFFERENT (rank 0, step 1, tensor 1: max |diff| 0.001)" in captured.out
    assert captured.out.count(" equal") == len(sim_ranks.CASES) - 1
    assert "the device's means differ from the CPU's" in captured.err


def test_the_command_passes_on_the_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "sim-ranks", "--world-size", "4", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count(" equal") == len(sim_ranks.CASES)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_ranks_equal_cpu_ranks() -> None:
    results = sim_ranks.check(torch.device("cuda"), world_size=4, steps=3)
    assert all(r.equal for r in results), [r.detail for r in results if not r.equal]
