"""Gradient synchronisation and the optimizer wrapper: identical replicas on every rank, exact
averaging with the identity codec, bit-exact resume, all-or-nothing steps, real == simulated."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
import torch

import gradzip
from gradzip.comm.local import run_local
from gradzip.comm.transport import Transport
from gradzip.errors import GradzipError, NonFiniteInputError, PayloadMismatchError
from gradzip.optim import CompressedOptimizer
from gradzip.schemes import VARIANTS, AllGatherDecode, SchemeSpec, make_scheme
from gradzip.schemes._grid_scheme import GridScheme
from gradzip.sync import GradientSync

if TYPE_CHECKING:
    from tests.conftest import RunSimulatedAndProcesses

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


def make(
    transport: Transport, net: torch.nn.Module, name: str, ef: bool, variant: str = "allgather"
) -> CompressedOptimizer:
    cls = gradzip.get(name)
    scheme = make_scheme(variant, cls(**cls.example_params), error_feedback=ef, run_seed=RUN_SEED)
    sync = GradientSync(transport, scheme=scheme)
    return CompressedOptimizer(torch.optim.SGD(net.parameters(), lr=0.05), sync)


def train(
    transport: Transport,
    name: str,
    ef: bool,
    steps: int,
    state: bytes | None = None,
    first: int = 0,
    variant: str = "allgather",
) -> tuple[list[np.ndarray], bytes]:
    """Train ``steps`` steps from step ``first`` (resuming from ``state`` if given); returns the
    parameters and a checkpoint. Module level, so spawned processes can import it."""
    net = model()
    opt = make(transport, net, name, ef, variant)
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


def variant_setups() -> list[tuple[str, str, bool]]:
    """One (variant, compressor, error feedback) per scheme variant, with every buffer in use."""
    return [
        (v, "ndqsg", False)
        if v.startswith("nested")
        else (v, "dqsg", SchemeSpec.parse(v).scheme_class.feedback_roles != ())
        for v in VARIANTS
    ]


@pytest.mark.parametrize(("variant", "name", "ef"), variant_setups())
def test_resume_from_a_checkpoint_is_bit_exact(variant: str, name: str, ef: bool) -> None:
    straight = run_local(3, lambda t: train(t, name, ef, steps=6, variant=variant))
    first = run_local(3, lambda t: train(t, name, ef, steps=3, variant=variant))
    resumed = run_local(
        3,
        lambda t: train(t, name, ef, steps=3, state=first[t.rank][1], first=3, variant=variant),
    )
    for rank in range(3):
        assert params_bytes(resumed[rank][0]) == params_bytes(straight[rank][0])
    interrupted = [params_bytes(p) for p, _ in first]
    assert interrupted[0] != params_bytes(straight[0][0])  # the resumed half did something


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
def test_real_processes_train_exactly_like_the_simulation(
    simulated_and_processes: RunSimulatedAndProcesses,
) -> None:
    runs = simulated_and_processes(2, train, "dqsg", True, 3)
    real, simulated = runs.processes, runs.simulated
    for rank in range(2):
        assert params_bytes(real[rank][0]) == params_bytes(simulated[rank][0])


@pytest.mark.parametrize(("variant", "name", "ef"), [s for s in variant_setups() if s[2]])
def test_a_failed_step_leaves_every_scheme_buffer_unchanged(
    variant: str, name: str, ef: bool
) -> None:
    """Tensor 0 goes through (its buffers change), then rank 1 sends tensor 1 with another
    run seed: every rank raises, and the whole scheme state is as before the step."""

    def body(transport: Transport) -> tuple[bool, int]:
        scheme = make_scheme(variant, gradzip.create(name), error_feedback=ef, run_seed=4)
        sync = GradientSync(transport, scheme=scheme)
        gen = torch.Generator().manual_seed(transport.rank)
        sync.synchronize([torch.randn(6, 3, generator=gen)])
        before = sync.state_dict()
        mean = sync.scheme.reduce

        def sabotage(t: Transport, g: torch.Tensor, step: int, index: int = 0) -> torch.Tensor:
            if index == 1 and t.rank == 1:
                scheme.run_seed = 99  # this rank's payloads now carry another run seed
            return mean(t, g, step, index)

        sync.scheme.reduce = sabotage  # type: ignore[method-assign]
        grid = getattr(scheme, "inner", scheme)  # hierarchical's leaders run a grid scheme
        if isinstance(grid, GridScheme):
            # these reduce both tensors in one batch: rank 1 takes another run seed once the
            # scales are agreed, before the codes (no residual may change then either)
            codes = grid._means_of_batch

            def sabotage_codes(
                t: Transport, symbols: Any, scales: Any, step: int, indices: Any
            ) -> list[torch.Tensor]:
                if step == 1 and transport.rank == 1:
                    scheme.run_seed = 99
                return codes(t, symbols, scales, step, indices)

            grid._means_of_batch = sabotage_codes  # type: ignore[method-assign]
        try:
            sync.synchronize([torch.randn(6, 3, generator=gen), torch.randn(4, generator=gen)])
        except GradzipError:
            scheme.run_seed = 4
            after = sync.state_dict()
            return str(after) == str(before) and _same_tensors(before, after), sync.step
        return False, sync.step

    for restored, step in run_local(3, body, timeout=3.0):
        assert restored and step == 1


def _same_tensors(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_tensors(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_tensors(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def test_a_step_failing_half_way_restores_error_feedback() -> None:
    def body(transport: Transport) -> tuple[bool, str]:
        sync = GradientSync(
            transport, scheme=AllGatherDecode(gradzip.create("topk", k=2), error_feedback=True)
        )
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


def test_skipped_steps_counts_each_skipped_step_and_resumes() -> None:
    def body(transport: Transport) -> tuple[int, int, int, int]:
        sync = GradientSync(
            transport, gradzip.create("dqsg"), run_seed=RUN_SEED, on_nonfinite="skip"
        )
        good = [torch.ones(3)]
        bad = [torch.tensor([1.0, float("nan") if transport.rank == 1 else 0.0, 2.0])]
        assert sync.synchronize(good) is not None
        assert sync.synchronize(bad) is None
        assert sync.synchronize(bad) is None
        resumed = GradientSync(transport, gradzip.create("dqsg"), run_seed=RUN_SEED)
        resumed.load_state_dict(sync.state_dict())
        return sync.step, sync.skipped_steps, resumed.step, resumed.skipped_steps

    assert run_local(2, body) == [(1, 2, 1, 2)] * 2


def flag_rounds(transport: Transport, variant: str) -> dict[str, object]:
    """Two steps of three tensors: all finite, then a NaN in rank 1's last tensor (skip)."""
    scheme = make_scheme(variant, gradzip.create("topk", k=2), run_seed=1, error_feedback=True)
    sync = GradientSync(transport, scheme=scheme, on_nonfinite="skip")
    gen = torch.Generator().manual_seed(transport.rank)
    grads = [torch.randn(n, generator=gen) for n in (5, 4, 3)]
    sync.synchronize(grads)
    saved = sync.state_dict()
    if transport.rank == 1:
        grads[2][1] = float("nan")
    skipped = sync.synchronize(grads) is None
    meter = transport.meter.entries()
    after = sync.state_dict()
    return {
        "skipped": skipped and after["skipped_steps"] == 1 and after["step"] == 1,
        "unchanged": str(saved["scheme"]) == str(after["scheme"]),
        "traffic": {
            (step, name): t.messages for (step, name), t in meter.items() if step is not None
        },
    }


def test_the_finite_flags_ride_on_the_first_all_gather_and_skip_on_every_rank() -> None:
    for res in run_local(3, lambda t: flag_rounds(t, "allgather")):
        assert res["skipped"] and res["unchanged"]
        # step 0: one all-gather round per tensor (P - 1 = 2 messages each), no flag message;
        # the skipped step stops after the first tensor's all-gather
        assert res["traffic"] == {(0, "all_gather"): 3 * 2, (1, "all_gather"): 2}


def test_schemes_without_an_all_gather_first_still_agree_on_every_rank() -> None:
    for res in run_local(3, lambda t: flag_rounds(t, "ring")):
        assert res["skipped"] and res["unchanged"]
        traffic = res["traffic"]
        assert traffic[1, "finite_check"] == 2 and (1, "reduce_scatter") not in traffic  # type: ignore[index,operator]
