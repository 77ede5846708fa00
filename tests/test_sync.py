"""Gradient synchronisation and the optimizer wrapper: identical replicas on every rank, exact
averaging with the identity codec, bit-exact resume, all-or-nothing steps, real == simulated."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

import gradzip
from gradzip.comm.local import run_local
from gradzip.comm.spawn import run_processes
from gradzip.comm.transport import Transport
from gradzip.errors import GradzipError, NonFiniteInputError, PayloadMismatchError
from gradzip.optim import CompressedOptimizer
from gradzip.sync import GradientSync

RUN_SEED = 5


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(10_000 + 100 * step + rank)
    x = torch.randn(16, 8, generator=gen)
    return x, x @ torch.arange(8.0).view(8, 1) + 0.1 * torch.randn(16, 1, generator=gen)


def model() -> torch.nn.Module:
    """The same initial weights on every rank, from an explicit generator (simulated ranks are
    threads: the global RNG is shared between them)."""
    net = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return net


def make(transport: Transport, net: torch.nn.Module, name: str, ef: bool) -> CompressedOptimizer:
    cls = gradzip.get(name)
    compressor = cls(**cls.example_params)
    sync = GradientSync(transport, compressor, error_feedback=ef, run_seed=RUN_SEED)
    return CompressedOptimizer(torch.optim.SGD(net.parameters(), lr=0.05), sync)


def train(
    transport: Transport,
    name: str,
    ef: bool,
    steps: int,
    state: bytes | None = None,
    first: int = 0,
) -> tuple[list[np.ndarray], bytes]:
    """Train ``steps`` steps from step ``first`` (resuming from ``state`` if given); returns the
    parameters and a checkpoint. Module level, so spawned processes can import it."""
    net = model()
    opt = make(transport, net, name, ef)
    if state is not None:
        saved = torch.load(io.BytesIO(state), weights_only=True)
        net.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
    for step in range(first, first + steps):
        x, y = batch(transport.rank, step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    buf = io.BytesIO()
    torch.save({"model": net.state_dict(), "opt": opt.state_dict()}, buf)
    return [p.detach().numpy().copy() for p in net.parameters()], buf.getvalue()


def params_bytes(params: list[np.ndarray]) -> bytes:
    return b"".join(p.tobytes() for p in params)


@pytest.mark.parametrize(("name", "ef"), [("dqsg", False), ("topk", True), ("onebit", True)])
def test_every_rank_holds_the_same_model(name: str, ef: bool) -> None:
    results = run_local(3, lambda t: train(t, name, ef, steps=4))
    assert len({params_bytes(p) for p, _ in results}) == 1


def test_identity_equals_exact_gradient_averaging() -> None:
    results = run_local(2, lambda t: train(t, "identity", False, steps=3))
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    for step in range(3):
        grads = []
        for rank in range(2):
            net.zero_grad()
            x, y = batch(rank, step)
            torch.nn.functional.mse_loss(net(x), y).backward()
            grads.append([p.grad.clone() for p in net.parameters()])
        for i, p in enumerate(net.parameters()):
            p.grad = (grads[0][i] + grads[1][i]) / 2  # rank order, float32, as the scheme sums
        opt.step()
    reference = [p.detach().numpy() for p in net.parameters()]
    assert params_bytes(results[0][0]) == params_bytes(reference)


def test_resume_from_a_checkpoint_is_bit_exact() -> None:
    straight = run_local(2, lambda t: train(t, "dqsg", True, steps=6))
    first = run_local(2, lambda t: train(t, "dqsg", True, steps=3))
    resumed = run_local(
        2, lambda t: train(t, "dqsg", True, steps=3, state=first[t.rank][1], first=3)
    )
    for rank in range(2):
        assert params_bytes(resumed[rank][0]) == params_bytes(straight[rank][0])


def test_non_finite_gradient_on_one_rank_stops_every_rank_and_changes_nothing() -> None:
    def body(transport: Transport) -> tuple[str, bool, int]:
        net = model()
        opt = make(transport, net, "topk", ef=True)
        x, y = batch(transport.rank, 0)
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()  # a good step first, so there is error-feedback state to protect
        before = [p.detach().clone() for p in net.parameters()]
        ef_before = opt.sync.state_dict()["scheme"]["feedback"]["worker"]["residual"]
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        if transport.rank == 1:
            next(net.parameters()).grad[0, 0] = float("nan")
        try:
            opt.step()
        except NonFiniteInputError as err:
            unchanged = all(
                torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True)
            )
            residuals = opt.sync.state_dict()["scheme"]["feedback"]["worker"]["residual"]
            unchanged &= all(torch.equal(a, b) for a, b in zip(ef_before, residuals, strict=True))
            return str(err), unchanged, opt.sync.step
        return "no error", False, opt.sync.step

    for message, unchanged, step in run_local(3, body):
        assert "rank(s) [1]" in message
        assert unchanged and step == 1


def test_state_from_another_rank_or_run_is_refused() -> None:
    def body(transport: Transport) -> None:
        sync = GradientSync(transport, gradzip.create("dqsg"), run_seed=1)
        other = GradientSync(transport, gradzip.create("dqsg"), run_seed=2)
        sync.load_state_dict(other.state_dict())

    with pytest.raises(GradzipError, match="run_seed 2, not 1"):
        run_local(1, body)


@pytest.mark.distributed
def test_real_processes_train_exactly_like_the_simulation() -> None:
    real = run_processes(2, train, "dqsg", True, 3)
    simulated = run_local(2, lambda t: train(t, "dqsg", True, 3))
    for rank in range(2):
        assert params_bytes(real[rank][0]) == params_bytes(simulated[rank][0])


def test_a_step_failing_half_way_restores_error_feedback() -> None:
    def body(transport: Transport) -> tuple[bool, str]:
        sync = GradientSync(transport, gradzip.create("topk", k=2), error_feedback=True)
        gen = torch.Generator().manual_seed(transport.rank)
        sync.synchronize([torch.randn(6, generator=gen)])
        before = sync.state_dict()["scheme"]["feedback"]["worker"]["residual"]
        # tensor 0 goes through and updates its residual, then rank 1's tensor 1 has another
        # shape, so every rank rejects a payload
        second = torch.randn(5 if transport.rank == 1 else 4, generator=gen)
        try:
            sync.synchronize([torch.randn(6, generator=gen), second])
        except PayloadMismatchError as err:
            after = sync.state_dict()["scheme"]["feedback"]["worker"]["residual"]
            same = len(after) == 1 and torch.equal(before[0], after[0])
            return same and sync.step == 1, str(err)
        return False, "no error"

    for restored, message in run_local(2, body, timeout=10.0):
        assert restored and "shape" in message
