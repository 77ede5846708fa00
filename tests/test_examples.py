"""The torchrun example, launched as a user would: two processes, a few steps, ranks agree."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "torchrun_train.py"


def torchrun(*args: str, nproc: int = 2) -> subprocess.CompletedProcess[str]:
    """``torchrun --standalone --nproc_per_node=nproc examples/torchrun_train.py args``."""
    launcher = Path(sys.executable).with_name("torchrun")
    command = (
        [str(launcher)] if launcher.exists() else [sys.executable, "-m", "torch.distributed.run"]
    )
    return subprocess.run(
        [*command, "--standalone", f"--nproc_per_node={nproc}", str(SCRIPT), *args],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=240,
    )


def checked(run: subprocess.CompletedProcess[str], steps: int, nproc: int = 2) -> str:
    """The parameter checksum rank 0 printed, after checking the rest of the printout."""
    assert run.returncode == 0, run.stdout + run.stderr
    assert re.findall(r"^step +(\d+) +loss \d+\.\d+$", run.stdout, re.M) == [
        str(s) for s in range(steps)
    ]
    traffic = re.findall(r"^  rank (\d+): sent ([\d,.]+) B, received ([\d,.]+) B", run.stdout, re.M)
    assert [int(rank) for rank, _, _ in traffic] == list(range(nproc))
    assert all(float(sent.replace(",", "")) > 0 for _, sent, _ in traffic)
    found = re.search(r"^parameter checksum ([0-9a-f]{16}): all ranks agree$", run.stdout, re.M)
    assert found is not None, run.stdout
    return found.group(1)


ARGS = ("--steps", "3", "--compressor", "topk", "--error-feedback", "--timeout", "30")


@pytest.mark.distributed
def test_torchrun_example_trains_and_every_rank_agrees() -> None:
    checked(torchrun(*ARGS), steps=3)


@pytest.mark.slow
@pytest.mark.distributed
def test_torchrun_example_with_the_ddp_hook_trains_the_same_parameters_as_the_optimizer() -> None:
    # the DDP hook encodes each parameter on its own, keyed by its index, as CompressedOptimizer
    # does: with a lossy codec and error feedback they train the very same parameters, whatever
    # DDP's buckets; a lossy run differs from the identity codec's
    lossy = checked(torchrun(*ARGS, "--ddp"), steps=3)
    assert lossy == checked(torchrun(*ARGS), steps=3)
    exact = ("--steps", "3", "--compressor", "identity", "--timeout", "30")
    identity = checked(torchrun(*exact, "--ddp"), steps=3)
    assert identity == checked(torchrun(*exact), steps=3) and identity != lossy


@pytest.mark.distributed
def test_ddp_hook_example_runs_on_two_gloo_ranks_which_agree() -> None:
    # examples/ddp_hook.py as its docstring says: torchrun --nproc_per_node 2, CPU, gloo
    launcher = Path(sys.executable).with_name("torchrun")
    command = (
        [str(launcher)] if launcher.exists() else [sys.executable, "-m", "torch.distributed.run"]
    )
    script = ROOT / "examples" / "ddp_hook.py"
    assert len(script.read_text().splitlines()) <= 40  # a short example, as promised
    run = subprocess.run(
        [*command, "--standalone", "--nproc_per_node=2", str(script)],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    losses = re.findall(r"^step (\d) loss \d+\.\d+$", run.stdout, re.M)
    assert losses == [str(s) for s in range(5)], run.stdout
    assert re.search(r"^parameters agree on every rank: True$", run.stdout, re.M), run.stdout
