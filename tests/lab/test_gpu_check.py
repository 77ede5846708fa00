"""``make gpu-check`` (``tools/gpu_check.sh``): without a CUDA device it stops at once, non-zero,
saying why (it is a GPU check: passing on a CPU would say nothing)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "gpu_check.sh"


@pytest.mark.distributed  # starts bash (the conftest allows processes in these tests only)
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_without_cuda_it_fails_saying_why() -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert "gpu-check: no CUDA device" in done.stderr
    assert "pytest" not in done.stdout  # nothing else ran


def test_the_makefile_runs_it_with_the_users_cuda_interpreter() -> None:
    """Not after ``setup``: the .venv's torch is the CPU build, which would make the check refuse
    on every GPU machine."""
    makefile = (SCRIPT.parents[1] / "Makefile").read_text()
    assert "gpu-check:\n\tPYTHON=$(GPU_PYTHON) tools/gpu_check.sh" in makefile
    assert "GPU_PYTHON ?= python3" in makefile
