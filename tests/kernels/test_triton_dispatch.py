"""When the Triton kernels may run (:mod:`gradzip.kernels.triton_dispatch`)."""

from __future__ import annotations

import pytest
import torch

from gradzip.kernels.triton_dispatch import forced_triton, triton_available, triton_installed
from tests.kernels.triton_modes import load_kernels


def test_triton_is_installed() -> None:
    # the dev extra installs it: the kernel tests must fail, not skip, without it
    assert triton_installed()
    import triton  # noqa: F401


def test_cpu_tensors_only_under_forced_triton_with_the_interpreter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    x = torch.zeros(3)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not triton_available(x)
    with forced_triton():
        assert not triton_available(x)  # no interpreter: a CPU tensor cannot run
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not triton_available(x)  # the interpreter, but not forced
    with forced_triton():
        assert triton_available(x)
    assert not triton_available(x)


def test_entry_points_refuse_a_cpu_tensor_outside_forced_triton(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    k = load_kernels(interpret=True)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    x = torch.ones(8)
    with pytest.raises(ValueError, match="CUDA"):
        k.stochastic.triton_symmetric_encode(x, torch.ones(1), 0, 1, 1, False, 1, 2)
