"""The DDP communication hook: with the identity codec it trains exactly like DDP's own
all-reduce; with lossy codecs it trains exactly like GradientSync + CompressedOptimizer, across
DDP's bucket rebuild; a non-finite gradient on one rank is handled on every rank; checkpoints
resume bit-exactly.

The DDP runs all happen in one spawned pair of gloo processes (``ddp_runs``, shared by the
tests of this module: starting processes costs seconds); the references run in this process on
simulated ranks.
"""

from __future__ import annotations

import gc
import io
from typing import Any

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

import gradzip
from gradzip.comm.local import LocalGroup, run_local
from gradzip.comm.spawn import run_processes
from gradzip.comm.transport import Transport
from gradzip.errors import GradzipError, NonFiniteInputError, PayloadMismatchError
from gradzip.integrations.ddp import GradzipHookState, gradzip_hook, register_gradzip_hook
from gradzip.optim import CompressedOptimizer
from gradzip.schemes import SCHEMES, make_scheme
from gradzip.schemes.base import Scheme
from gradzip.sync import GradientSync

RUN_SEED = 11
LR = 0.05
STEPS = 4
BUCKET_MB = 0.0001  # about 100 bytes: several buckets for this small model
IDENTITY_SCHEMES = [
    name for name, cls in SCHEMES.items() if cls.compatible(gradzip.create("identity"))
]
LOSSY = [("dqsg", False), ("qsgd", False), ("onebit", True), ("topk", True)]
LOSSY_CONFIGS = [
    (comp, ef, name)
    for comp, ef in LOSSY
    for name, cls in SCHEMES.items()
    if cls.compatible(gradzip.create(comp, **gradzip.get(comp).example_params))
]
NAN_STEP = 1  # the step at which rank 1 has a NaN gradient in the non-finite scenarios


# -- model, data, schemes (module level: the spawned processes import them) --------------------
def model() -> torch.nn.Module:
    """Four layers, the same weights on every rank, from an explicit generator."""
    net = torch.nn.Sequential(
        torch.nn.Linear(6, 10),
        torch.nn.ReLU(),
        torch.nn.Linear(10, 8),
        torch.nn.Tanh(),
        torch.nn.Linear(8, 4),
        torch.nn.ReLU(),
        torch.nn.Linear(4, 1),
    )
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.4)
    return net


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + 10 * step + rank)
    x = torch.randn(12, 6, generator=gen)
    return x, x.sum(dim=1, keepdim=True).sin() + 0.1 * torch.randn(12, 1, generator=gen)


def scheme(name: str, comp: str, ef: bool) -> Scheme:
    compressor = gradzip.create(comp, **gradzip.get(comp).example_params)
    options: dict[str, Any] = {"run_seed": RUN_SEED}
    if ef:
        options["error_feedback"] = True
    return make_scheme(name, compressor, **options)


def loss(net: torch.nn.Module, rank: int, step: int) -> torch.Tensor:
    x, y = batch(rank, step)
    return torch.nn.functional.mse_loss(net(x), y)


def flat(net: torch.nn.Module) -> bytes:
    return b"".join(p.detach().numpy().tobytes() for p in net.parameters())


def poison(net: torch.nn.Module) -> torch.utils.hooks.RemovableHandle:
    """A NaN in the gradient of the first layer's weight: the last bucket once DDP has rebuilt
    its buckets, so earlier buckets of the step were already reduced when it is found."""
    weight = next(net.parameters())

    def hook(grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        grad[0, 0] = float("nan")
        return grad

    return weight.register_hook(hook)


def residuals(state: dict[str, Any]) -> list[torch.Tensor]:
    return [r for role in state["feedback"].values() for r in role["residual"]]


class RecordingState(GradzipHookState):
    """Records which parameters (by model position) each step's buckets held."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.layouts: list[list[tuple[int, ...]]] = []

    def reduce_bucket(self, bucket: Any) -> torch.futures.Future[torch.Tensor]:
        if bucket.index() == 0:
            self.layouts.append([])
        self.layouts[-1].append(tuple(self._index[id(p)] for p in bucket.parameters()))
        return super().reduce_bucket(bucket)


# -- what the spawned ranks run -------------------------------------------------------------
def _train_ddp(
    transport: Transport, hook_scheme: Scheme | None, steps: int
) -> tuple[bytes, list[list[tuple[int, ...]]]]:
    net = model()
    ddp = DistributedDataParallel(net, bucket_cap_mb=BUCKET_MB)
    layouts: list[list[tuple[int, ...]]] = []
    if hook_scheme is not None:
        state = RecordingState(hook_scheme, ddp, transport)
        ddp.register_comm_hook(state, gradzip_hook)
        layouts = state.layouts
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    for step in range(steps):
        opt.zero_grad()
        loss(ddp, transport.rank, step).backward()
        opt.step()
    return flat(net), layouts


def _non_finite(transport: Transport, mode: str) -> dict[str, Any]:
    """One good step, a step where rank 1 has a NaN, then one more good step (skip mode with
    DDP's ``gradient_as_bucket_view``: the gradients are the bucket buffers themselves)."""
    net = model()
    ddp = DistributedDataParallel(
        net, bucket_cap_mb=BUCKET_MB, gradient_as_bucket_view=mode == "skip"
    )
    state = register_gradzip_hook(ddp, scheme("allgather", "topk", True), on_nonfinite=mode)
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    opt.zero_grad()
    loss(ddp, transport.rank, 0).backward()
    opt.step()
    out: dict[str, Any] = {"error": None}
    before_params, before_state = flat(net), state.state_dict()
    opt.zero_grad()
    handle = poison(net) if transport.rank == 1 else None
    try:
        loss(ddp, transport.rank, NAN_STEP).backward()
    except Exception as err:
        out["error"] = (type(err).__name__, str(err))
    else:
        out["grads_zero"] = all(not p.grad.any() for p in net.parameters())
        opt.step()  # plain SGD with zero gradients
    if handle is not None:
        handle.remove()
    after_state = state.state_dict()
    out["params_unchanged"] = flat(net) == before_params
    out["scheme_unchanged"] = all(
        torch.equal(a, b)
        for a, b in zip(
            residuals(before_state["scheme"]), residuals(after_state["scheme"]), strict=True
        )
    )
    out["step"], out["skipped"] = state.step, state.skipped_steps
    if out["error"] is not None:
        # DDP refuses another forward of a wrapper whose backward raised: wrap again
        del ddp
        gc.collect()
        ddp = DistributedDataParallel(net, bucket_cap_mb=BUCKET_MB)
        ddp.register_comm_hook(state, gradzip_hook)
    opt.zero_grad()
    loss(ddp, transport.rank, NAN_STEP + 1).backward()
    opt.step()
    out["final"], out["final_step"] = flat(net), state.step
    return out


def _checkpoint_run(
    transport: Transport, steps: int, first: int, saved: bytes | None, keep_hook_state: bool
) -> tuple[bytes, bytes]:
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9)
    loaded = torch.load(io.BytesIO(saved), weights_only=True) if saved is not None else None
    if loaded is not None:
        net.load_state_dict(loaded["model"])
        opt.load_state_dict(loaded["opt"])
    ddp = DistributedDataParallel(net, bucket_cap_mb=BUCKET_MB)
    state = register_gradzip_hook(ddp, scheme("allgather", "dqsg", True), transport)
    if loaded is not None and keep_hook_state:
        state.load_state_dict(loaded["hook"])
    for step in range(first, first + steps):
        opt.zero_grad()
        loss(ddp, transport.rank, step).backward()
        opt.step()
    buf = io.BytesIO()
    torch.save(
        {"model": net.state_dict(), "opt": opt.state_dict(), "hook": state.state_dict()}, buf
    )
    return flat(net), buf.getvalue()


def _all_ddp_runs(transport: Transport) -> dict[str, Any]:
    out: dict[str, Any] = {"plain": _train_ddp(transport, None, STEPS)[0]}
    for name in IDENTITY_SCHEMES:
        out["identity", name] = _train_ddp(transport, scheme(name, "identity", False), STEPS)
    for comp, ef, name in LOSSY_CONFIGS:
        out[comp, name] = _train_ddp(transport, scheme(name, comp, ef), STEPS)
    out["raise"] = _non_finite(transport, "raise")
    out["skip"] = _non_finite(transport, "skip")
    straight, _ = _checkpoint_run(transport, 6, 0, None, True)
    _, saved = _checkpoint_run(transport, 3, 0, None, True)
    out["checkpoint"] = {
        "straight": straight,
        "resumed": _checkpoint_run(transport, 3, 3, saved, True)[0],
        "hook_state_lost": _checkpoint_run(transport, 3, 3, saved, False)[0],
    }
    return out


@pytest.fixture(scope="module")
def ddp_runs() -> list[dict[str, Any]]:
    return run_processes(2, _all_ddp_runs, timeout=30.0, run_timeout=240.0)


# -- in-process references ------------------------------------------------------------------
def _reference(transport: Transport, sch: Scheme, steps: int) -> bytes:
    net = model()
    opt = CompressedOptimizer(
        torch.optim.SGD(net.parameters(), lr=LR), GradientSync(transport, scheme=sch)
    )
    for step in range(steps):
        opt.zero_grad()
        loss(net, transport.rank, step).backward()
        opt.step()
    return flat(net)


def _reference_non_finite(transport: Transport, mode: str) -> bytes:
    net = model()
    sync = GradientSync(transport, scheme=scheme("allgather", "topk", True), on_nonfinite=mode)
    opt = CompressedOptimizer(torch.optim.SGD(net.parameters(), lr=LR), sync)
    for step in range(NAN_STEP + 2):
        opt.zero_grad()
        handle = poison(net) if step == NAN_STEP and transport.rank == 1 else None
        loss(net, transport.rank, step).backward()
        if step == NAN_STEP and mode == "raise":
            with pytest.raises(NonFiniteInputError):
                opt.step()
        else:
            opt.step()
        if handle is not None:
            handle.remove()
    return flat(net)


# -- the tests ------------------------------------------------------------------------------
@pytest.mark.distributed
def test_identity_through_every_scheme_equals_plain_ddp(ddp_runs: list[dict[str, Any]]) -> None:
    assert "allgather" in IDENTITY_SCHEMES
    initial = flat(model())
    for rank in range(2):
        plain = ddp_runs[rank]["plain"]
        assert plain != initial and plain == ddp_runs[0]["plain"]
        for name in IDENTITY_SCHEMES:
            assert ddp_runs[rank]["identity", name][0] == plain, name


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("comp", "ef", "name"), LOSSY_CONFIGS, ids=[f"{c}-{n}" for c, _, n in LOSSY_CONFIGS]
)
def test_hook_equals_gradient_sync_across_bucket_rebuilds(
    ddp_runs: list[dict[str, Any]], comp: str, ef: bool, name: str
) -> None:
    reference = run_local(2, lambda t: _reference(t, scheme(name, comp, ef), STEPS))
    for rank in range(2):
        params, layouts = ddp_runs[rank][comp, name]
        assert params == reference[rank]
        # DDP rebuilt its buckets after the first step, and there were several of them
        assert len(layouts) == STEPS and layouts[1] != layouts[0] and len(layouts[1]) > 2
        assert sorted(i for b in layouts[1] for i in b) == list(range(8))
    assert reference[0] != flat(model()) and reference[0] == reference[1]
    # the lossy codec mattered: identity through the same scheme trains differently
    if ("identity", name) in ddp_runs[0]:
        assert ddp_runs[0]["identity", name][0] != reference[0]


@pytest.mark.distributed
def test_non_finite_gradient_on_one_rank_raises_on_every_rank(
    ddp_runs: list[dict[str, Any]],
) -> None:
    reference = run_local(2, lambda t: _reference_non_finite(t, "raise"))
    for rank in range(2):
        run = ddp_runs[rank]["raise"]
        assert run["error"] is not None, f"rank {rank} did not raise"
        kind, message = run["error"]
        assert kind == "NonFiniteInputError" and "rank(s) [1]" in message
        assert "bucket 0" not in message  # earlier buckets had been reduced, then undone
        assert run["params_unchanged"] and run["scheme_unchanged"]
        assert (run["step"], run["skipped"]) == (1, 0)
        # the same state, registered on a new DDP wrapper, trains on as GradientSync does
        assert run["final"] == reference[rank] and run["final_step"] == 2


@pytest.mark.distributed
def test_skip_mode_zeroes_the_step_on_every_rank(ddp_runs: list[dict[str, Any]]) -> None:
    reference = run_local(2, lambda t: _reference_non_finite(t, "skip"))
    for rank in range(2):
        run = ddp_runs[rank]["skip"]
        assert run["error"] is None and run["grads_zero"]
        assert run["params_unchanged"] and run["scheme_unchanged"]
        assert (run["step"], run["skipped"]) == (1, 1)
        assert run["final"] == reference[rank] and run["final_step"] == 2


@pytest.mark.distributed
def test_resume_from_a_checkpoint_is_bit_exact(ddp_runs: list[dict[str, Any]]) -> None:
    for rank in range(2):
        runs = ddp_runs[rank]["checkpoint"]
        assert runs["resumed"] == runs["straight"]
        assert runs["hook_state_lost"] != runs["straight"]  # the hook's state is needed


# -- in-process checks of the hook's bookkeeping, with stand-in buckets -----------------------
class FakeBucket:
    """What the hook uses of ``torch.distributed.GradBucket``: a flat buffer and views."""

    def __init__(
        self, index: int, last: bool, params: list[torch.Tensor], grads: list[torch.Tensor]
    ) -> None:
        self._index, self._last, self._params = index, last, params
        self._buffer = torch.cat([g.reshape(-1) for g in grads])
        self._views, offset = [], 0
        for g in grads:
            self._views.append(self._buffer[offset : offset + g.numel()].view(g.shape))
            offset += g.numel()

    def index(self) -> int:
        return self._index

    def is_last(self) -> bool:
        return self._last

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def gradients(self) -> list[torch.Tensor]:
        return self._views

    def parameters(self) -> list[torch.Tensor]:
        return self._params


def _grads(rank: int, step: int, shapes: list[tuple[int, ...]]) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(100 * step + rank)
    return [torch.randn(s, generator=gen) for s in shapes]


def test_buckets_in_any_grouping_and_dtype_match_gradient_sync() -> None:
    """Half-precision gradients in two bucketings (as before and after a rebuild), against
    GradientSync on the same gradients."""
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)).half()
    params = list(net.parameters())
    shapes = [tuple(p.shape) for p in params]
    groupings = [[[0, 1, 2, 3]], [[3, 2], [1], [0]], [[3], [2, 1, 0]]]

    def body(transport: Transport) -> tuple[list[list[torch.Tensor]], list[list[torch.Tensor]]]:
        state = GradzipHookState(scheme("allgather", "topk", True), net, transport)
        sync = GradientSync(transport, scheme=scheme("allgather", "topk", True))
        hooked, synced = [], []
        for step, grouping in enumerate(groupings):
            grads = [g.half() for g in _grads(transport.rank, step, shapes)]
            out: list[torch.Tensor] = [torch.empty(0)] * len(params)
            for position, members in enumerate(grouping):
                bucket = FakeBucket(
                    position,
                    position == len(grouping) - 1,
                    [params[i] for i in members],
                    [grads[i] for i in members],
                )
                state.reduce_bucket(bucket).wait()
                for i, view in zip(members, bucket.gradients(), strict=True):
                    assert view.dtype == torch.float16
                    out[i] = view.clone()
            hooked.append(out)
            means = sync.synchronize(grads)
            assert means is not None
            synced.append(means)
        assert state.step == len(groupings)
        return hooked, synced

    for hooked, synced in run_local(2, body):
        for step_hooked, step_synced in zip(hooked, synced, strict=True):
            for a, b in zip(step_hooked, step_synced, strict=True):
                assert a.dtype == b.dtype and torch.equal(a, b)


def test_a_bucket_failing_half_way_restores_the_whole_step() -> None:
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    params = list(net.parameters())
    shapes = [tuple(p.shape) for p in params]

    def body(transport: Transport) -> tuple[str, bool, int, bool]:
        state = GradzipHookState(scheme("allgather", "topk", True), net, transport)

        def step(index: int, bad: bool = False, abandon: bool = False) -> None:
            grads = _grads(transport.rank, index, shapes)
            if bad and transport.rank == 1:
                grads[0] = grads[0].double()  # a dtype the other rank does not expect
            state.reduce_bucket(FakeBucket(0, False, params[2:], grads[2:]))
            if not abandon:
                state.reduce_bucket(FakeBucket(1, True, params[:2], grads[:2]))

        step(0)
        before = residuals(state.state_dict()["scheme"])
        try:
            step(1, bad=True)
        except GradzipError as err:
            message = f"{err} | {type(err.__cause__).__name__}"
            restored = all(
                torch.equal(a, b)
                for a, b in zip(before, residuals(state.state_dict()["scheme"]), strict=True)
            )
            failed_step = state.step
        else:
            return "no error", False, state.step, False
        # a backward pass abandoned after its first bucket is undone when the next one starts
        step(2, abandon=True)
        step(3)
        return message, restored, failed_step, state.step == 2

    for message, restored, failed_step, continued in run_local(2, body, timeout=10.0):
        assert "step 1, bucket 1" in message and PayloadMismatchError.__name__ in message
        assert restored and failed_step == 1 and continued


def test_abandoned_step_leaves_no_trace() -> None:
    """After an abandoned backward pass (bucket 0 only), the next step gives the same averages
    as a run that never saw it."""
    net = torch.nn.Linear(5, 6)
    params = list(net.parameters())
    shapes = [tuple(p.shape) for p in params]

    def body(transport: Transport, abandon: bool) -> list[torch.Tensor]:
        state = GradzipHookState(scheme("allgather", "onebit", True), net, transport)
        for index in range(3):
            grads = _grads(transport.rank, index, shapes)
            if abandon and index == 1:
                state.reduce_bucket(FakeBucket(0, False, params[1:], grads[1:]))
            state.reduce_bucket(FakeBucket(0, False, params[1:], grads[1:]))
            last = FakeBucket(1, True, params[:1], grads[:1])
            state.reduce_bucket(last)
        assert state.step == 3
        return [last.buffer(), *residuals(state.state_dict()["scheme"])]

    clean = run_local(2, lambda t: body(t, False))
    interrupted = run_local(2, lambda t: body(t, True))
    for a, b in zip(clean, interrupted, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_state_checks() -> None:
    net = torch.nn.Linear(2, 2)
    transport = LocalGroup(1).endpoint(0)
    state = GradzipHookState(scheme("allgather", "dqsg", True), net, transport)
    other = GradzipHookState(
        make_scheme("allgather", gradzip.create("dqsg", M=1), run_seed=RUN_SEED + 1), net, transport
    )
    with pytest.raises(GradzipError, match=f"run_seed {RUN_SEED + 1}, not {RUN_SEED}"):
        state.load_state_dict(other.state_dict())
    no_feedback = GradzipHookState(
        make_scheme("allgather", gradzip.create("dqsg", M=1), run_seed=RUN_SEED), net, transport
    )
    with pytest.raises(GradzipError, match="does not fit this scheme"):
        state.load_state_dict(no_feedback.state_dict())
    with pytest.raises(ValueError, match="on_nonfinite"):
        GradzipHookState(scheme("allgather", "dqsg", False), net, transport, on_nonfinite="ignore")
    with pytest.raises(TypeError, match="Scheme"):
        GradzipHookState(gradzip.create("dqsg"), net, transport)  # type: ignore[arg-type]
    with pytest.raises(GradzipError, match="not initialised"):
        GradzipHookState(scheme("allgather", "dqsg", False), net)  # no process group here
    stranger = torch.nn.Parameter(torch.zeros(2))
    bucket = FakeBucket(0, True, [stranger], [torch.zeros(2)])
    with pytest.raises(GradzipError, match="not among the model's parameters"):
        state.reduce_bucket(bucket)  # type: ignore[arg-type]
    assert state.step == 0
