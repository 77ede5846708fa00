"""The DDP communication hook: with the identity codec it trains exactly like DDP's own
all-reduce; with lossy codecs it trains exactly like the scheme run on each parameter without
DDP (``GradientSync``), whatever DDP's buckets; a non-finite gradient on one rank is handled on
every rank; checkpoints resume bit-exactly against an uninterrupted run, into any buckets.

The DDP runs all happen in one spawned pair of gloo processes (``ddp_runs``, shared by the
tests of this module: starting processes costs seconds); the references run in this process on
simulated ranks.
"""

from __future__ import annotations

import gc
import io
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

import gradzip
from gradzip.comm.local import LocalGroup, run_local
from gradzip.comm.spawn import run_processes
from gradzip.comm.transport import Send, Transport
from gradzip.errors import CheckpointError, GradzipError, PayloadMismatchError
from gradzip.integrations.ddp import GradzipHookState, gradzip_hook, register_gradzip_hook
from gradzip.schemes import SCHEMES, AllGatherDecode, PowerSGD, make_scheme
from gradzip.schemes.base import Scheme, row_pieces
from gradzip.sync import GradientSync

RUN_SEED = 11
LR = 0.05
STEPS = 4
BUCKET_MB = 0.0001  # about 100 bytes: several buckets for this small model
OTHER_BUCKET_MB = 0.0003  # other buckets, for a resumed run
IDENTITY_SCHEMES = [
    name
    for name, cls in SCHEMES.items()
    if cls.compatible(gradzip.create("identity")) and cls.exact_with_lossless_codec
]
LOSSY = [("dqsg", False), ("qsgd", False), ("onebit", True), ("topk", True)]
LOSSY_CONFIGS = [
    (comp, ef, name)
    for comp, ef in LOSSY
    for name, cls in SCHEMES.items()
    if cls.compatible(gradzip.create(comp, **gradzip.get(comp).example_params))
    # PowerSGD's own checks: tests/schemes/test_powersgd.py (and the resume matrix below)
    and not cls.needs_shapes
]
NAN_STEP = 1  # the step at which rank 1 has a NaN gradient in the non-finite scenarios
#: values per message of the chunked runs: parameters of more than 4 values are encoded in
#: pieces of their rows, and a bucket travels as several messages
CHUNK = 4
CHUNKED = [("dqsg", False), ("onebit", True), ("topk", True)]


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
    """The error-feedback residuals in a hook checkpoint (the scheme's, per parameter and
    piece)."""
    return [r for role in state["scheme"]["feedback"].values() for r in role["residual"]]


Layout = list[tuple[int, ...]]


class RecordingState(GradzipHookState):
    """Records which parameters (by model position) each step's buckets held."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.layouts: list[Layout] = []

    def reduce_bucket(self, bucket: Any) -> torch.futures.Future[torch.Tensor]:
        if bucket.index() == 0:
            self.layouts.append([])
        self.layouts[-1].append(tuple(self._index[id(p)] for p in bucket.parameters()))
        return super().reduce_bucket(bucket)


# -- what the spawned ranks run -------------------------------------------------------------
def _train_ddp(
    transport: Transport, hook_scheme: Scheme | None, steps: int, chunk: int | None = None
) -> tuple[bytes, list[Layout]]:
    net = model()
    ddp = DistributedDataParallel(net, bucket_cap_mb=BUCKET_MB)
    layouts: list[Layout] = []
    state: GradzipHookState | None = None
    if hook_scheme is not None and hook_scheme.compressor.name == "identity":
        state = register_gradzip_hook(ddp, hook_scheme, transport)
    elif hook_scheme is not None:
        options = {} if chunk is None else {"chunk_elements": chunk}
        state = RecordingState(hook_scheme, ddp, transport, **options)
        ddp.register_comm_hook(state, gradzip_hook)
        layouts = state.layouts
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    for step in range(steps):
        opt.zero_grad()
        loss(ddp, transport.rank, step).backward()
        opt.step()
    if state is not None:
        state.close()
    return flat(net), layouts


def _non_finite(transport: Transport, mode: str) -> dict[str, Any]:
    """One good step, a step where rank 1 has a NaN, then one more good step (skip mode with
    DDP's ``gradient_as_bucket_view``: the gradients are the bucket buffers themselves)."""
    net = model()
    ddp = DistributedDataParallel(
        net, bucket_cap_mb=BUCKET_MB, gradient_as_bucket_view=mode == "skip"
    )
    state = RecordingState(scheme("allgather", "topk", True), ddp, transport, on_nonfinite=mode)
    ddp.register_comm_hook(state, gradzip_hook)
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
    before_residuals = residuals(before_state)
    out["scheme_unchanged"] = bool(before_residuals) and all(
        torch.equal(a, b) for a, b in zip(before_residuals, residuals(after_state), strict=True)
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
    out["final"], out["final_step"], out["layouts"] = flat(net), state.step, state.layouts
    return out


def _checkpoint_run(
    transport: Transport,
    segments: list[tuple[int, float]],
    first: int,
    saved: bytes | None,
    keep_hook_state: bool,
) -> tuple[bytes, bytes, list[Layout]]:
    """``(steps, bucket_cap_mb)`` per segment: each segment wraps the module in a new DDP
    wrapper (new buckets) and registers the same hook state on it."""
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9)
    loaded = torch.load(io.BytesIO(saved), weights_only=True) if saved is not None else None
    if loaded is not None:
        net.load_state_dict(loaded["model"])
        opt.load_state_dict(loaded["opt"])
    state = RecordingState(scheme("ring", "onebit", True), net, transport)
    if loaded is not None and keep_hook_state:
        state.load_state_dict(loaded["hook"])
    start = first
    for steps, bucket_mb in segments:
        ddp = DistributedDataParallel(net, bucket_cap_mb=bucket_mb)
        ddp.register_comm_hook(state, gradzip_hook)
        for step in range(start, start + steps):
            opt.zero_grad()
            loss(ddp, transport.rank, step).backward()
            opt.step()
        start += steps
    buf = io.BytesIO()
    torch.save(
        {"model": net.state_dict(), "opt": opt.state_dict(), "hook": state.state_dict()}, buf
    )
    return flat(net), buf.getvalue(), state.layouts


def _all_ddp_runs(transport: Transport) -> dict[str, Any]:
    out: dict[str, Any] = {"plain": _train_ddp(transport, None, STEPS)[0]}
    for name in IDENTITY_SCHEMES:
        out["identity", name] = _train_ddp(transport, scheme(name, "identity", False), STEPS)
    for comp, ef, name in LOSSY_CONFIGS:
        out[comp, name] = _train_ddp(transport, scheme(name, comp, ef), STEPS)
    for comp, ef in CHUNKED:
        out["chunked", comp] = _train_ddp(transport, scheme("allgather", comp, ef), STEPS, CHUNK)
    out["raise"] = _non_finite(transport, "raise")
    out["skip"] = _non_finite(transport, "skip")
    # the hook state is needed: resumed without it, the run differs from the uninterrupted one
    straight = _checkpoint_run(transport, [(6, BUCKET_MB)], 0, None, True)[0]
    _, saved, _ = _checkpoint_run(transport, [(3, BUCKET_MB)], 0, None, True)
    out["checkpoint"] = {
        "straight": straight,
        "resumed": _checkpoint_run(transport, [(3, BUCKET_MB)], 3, saved, True)[0],
        "hook_state_lost": _checkpoint_run(transport, [(3, BUCKET_MB)], 3, saved, False)[0],
    }
    return out


@pytest.fixture(scope="module")
def ddp_runs() -> list[dict[str, Any]]:
    return run_processes(2, _all_ddp_runs, timeout=30.0, run_timeout=240.0)


# -- resuming: every compressor through every scheme it fits, against an uninterrupted run ----
#: a bucket size that puts this model in one bucket (DDP's first bucket holds up to 1 MB)
ONE_BUCKET_MB = 25.0
RESUME_STEPS, RESUME_AT = 5, 2


def _resume_configs() -> list[tuple[str, str, int | None]]:
    """``(compressor, scheme, chunk_elements)``: every registered compressor (its example
    parameters) through every scheme that accepts it, and the allgather's pieces."""
    configs: list[tuple[str, str, int | None]] = []
    for comp in gradzip.names():
        compressor = gradzip.create(comp, **gradzip.get(comp).example_params)
        configs += [
            (comp, name, None) for name, cls in SCHEMES.items() if cls.compatible(compressor)
        ]
    return [*configs, ("dqsg", "allgather", CHUNK), ("topk", "allgather", CHUNK)]


RESUME_CONFIGS = _resume_configs()
#: the default suite's share of the matrix: each scheme once, the pieces, and one sparse codec;
#: the rest runs with the slow tests (about 20 s a configuration on a loaded 2-core machine)
RESUME_QUICK = [
    ("dqsg", "allgather", None),
    ("topk", "allgather", None),
    ("dqsg", "allgather", CHUNK),
    ("onebit", "ring", None),
    ("qsgd", "ps", None),
    ("lpc", "ps_intsum", None),
    ("terngrad", "allreduce", None),
    ("ndqsg", "nested", None),
    ("fp16", "powersgd", None),
]


def resume_scheme(comp: str, name: str) -> Scheme:
    """The scheme with error feedback where it keeps any (the hardest state to carry over)."""
    compressor = gradzip.create(comp, **gradzip.get(comp).example_params)
    try:
        return make_scheme(name, compressor, run_seed=RUN_SEED, error_feedback=True)
    except (TypeError, ValueError):
        return make_scheme(name, compressor, run_seed=RUN_SEED)


def _hook_state(
    transport: Transport, net: torch.nn.Module, comp: str, name: str, chunk: int | None
) -> RecordingState:
    options = {} if chunk is None else {"chunk_elements": chunk}
    return RecordingState(resume_scheme(comp, name), net, transport, **options)


def _train_steps(
    transport: Transport,
    net: torch.nn.Module,
    opt: torch.optim.Optimizer,
    state: GradzipHookState,
    bucket_mb: float,
    steps: range,
    at: int | None = None,
) -> bytes | None:
    """``steps`` on a new DDP wrapper of ``net``; the checkpoint taken before step ``at``."""
    ddp = DistributedDataParallel(net, bucket_cap_mb=bucket_mb)
    ddp.register_comm_hook(state, gradzip_hook)
    saved = None
    for step in steps:
        if step == at:
            buf = io.BytesIO()
            torch.save(
                {"model": net.state_dict(), "opt": opt.state_dict(), "hook": state.state_dict()},
                buf,
            )
            saved = buf.getvalue()
        opt.zero_grad()
        loss(ddp, transport.rank, step).backward()
        opt.step()
    return saved


def _resume_run(
    transport: Transport, comp: str, name: str, chunk: int | None, bucket_mb: float
) -> dict[str, Any]:
    """An uninterrupted run of ``RESUME_STEPS`` (one DDP wrapper: its buckets rebuilt after the
    first step), and a run resumed from its checkpoint at ``RESUME_AT`` in fresh objects (a new
    wrapper, whose first iteration uses DDP's initial buckets)."""
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9)
    state = _hook_state(transport, net, comp, name, chunk)
    saved = _train_steps(transport, net, opt, state, bucket_mb, range(RESUME_STEPS), RESUME_AT)
    state.close()
    assert saved is not None
    loaded = torch.load(io.BytesIO(saved), weights_only=True)
    resumed_net = model()
    resumed_net.load_state_dict(loaded["model"])
    resumed_opt = torch.optim.SGD(resumed_net.parameters(), lr=LR, momentum=0.9)
    resumed_opt.load_state_dict(loaded["opt"])
    resumed = _hook_state(transport, resumed_net, comp, name, chunk)
    resumed.load_state_dict(loaded["hook"])
    steps = range(RESUME_AT, RESUME_STEPS)
    _train_steps(transport, resumed_net, resumed_opt, resumed, bucket_mb, steps)
    resumed.close()
    return {
        "straight": flat(net),
        "resumed": flat(resumed_net),
        "layouts": (state.layouts[RESUME_AT], resumed.layouts[0]),
    }


def _resume_runs(transport: Transport, quick: bool) -> dict[Any, Any]:
    return {
        (comp, name, chunk, bucket_mb): _resume_run(transport, comp, name, chunk, bucket_mb)
        for comp, name, chunk in RESUME_CONFIGS
        if ((comp, name, chunk) in RESUME_QUICK) == quick
        for bucket_mb in (ONE_BUCKET_MB, BUCKET_MB)
    }


def _quick_resume_runs(transport: Transport) -> dict[Any, Any]:
    return _resume_runs(transport, True)


def _slow_resume_runs(transport: Transport) -> dict[Any, Any]:
    return _resume_runs(transport, False)


@pytest.fixture(scope="module")
def quick_resume_runs() -> list[dict[Any, Any]]:
    return run_processes(2, _quick_resume_runs, timeout=60.0, run_timeout=600.0)


@pytest.fixture(scope="module")
def slow_resume_runs() -> list[dict[Any, Any]]:
    return run_processes(2, _slow_resume_runs, timeout=60.0, run_timeout=2400.0)


# -- in-process references: the scheme on each parameter, without DDP ------------------------
def reduce_parameters(
    transport: Transport,
    sync: GradientSync,
    grads: list[torch.Tensor],
    chunk: int | None = None,
) -> list[torch.Tensor]:
    """The means of ``grads`` as :class:`GradientSync` computes them (each parameter its own
    tensor, keyed by its index); ``chunk`` (all-gather only): each parameter cut into the
    hook's pieces of its rows, each reduced on its own with its piece number in its key and
    residual slot, through the scheme's phases (the rank decodes its own payload too)."""
    if chunk is None:
        means = sync.synchronize(grads)
        assert means is not None
        return means
    sch = sync.scheme
    assert isinstance(sch, AllGatherDecode)
    means = []
    for index, grad in enumerate(grads):
        parts = []
        for number, (lo, hi, shape) in enumerate(sch.parameter_pieces(grad.shape, chunk)):
            part = grad.reshape(-1)[lo:hi].view(shape)
            outgoing = sch.encode_flagged(transport.rank, part, sync.step, index, chunk=number)
            payloads, down = sch.gather_flagged(transport, outgoing, sync.step)
            assert not down
            mean = sch.average(payloads, sync.step, index, shape, outgoing.dtype, chunk=number)
            parts.append(mean.reshape(-1))
        means.append(torch.cat(parts).view(grad.shape).to(grad.dtype))
    sync.step += 1
    return means


def _reference(
    transport: Transport,
    sch: Scheme,
    steps: int,
    poisoned: int = -1,
    chunk: int | None = None,
) -> bytes:
    """Train with the scheme applied to each parameter's gradient (``poisoned``: a data step
    whose NaN makes the step apply nothing)."""
    net = model()
    params = list(net.parameters())
    opt = torch.optim.SGD(params, lr=LR)
    sync = GradientSync(transport, scheme=sch)
    for data_step in range(steps):
        opt.zero_grad()
        handle = poison(net) if data_step == poisoned and transport.rank == 1 else None
        loss(net, transport.rank, data_step).backward()
        if handle is not None:
            handle.remove()
        if data_step == poisoned:
            continue
        grads = [p.grad for p in params if p.grad is not None]
        means = reduce_parameters(transport, sync, grads, chunk)
        for grad, mean in zip(grads, means, strict=True):
            grad.copy_(mean)
        opt.step()
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
def test_hook_trains_like_gradient_sync_whatever_the_buckets(
    ddp_runs: list[dict[str, Any]], comp: str, ef: bool, name: str
) -> None:
    layouts = ddp_runs[0][comp, name][1]
    assert ddp_runs[1][comp, name][1] == layouts  # DDP gives every rank rank 0's buckets
    # DDP rebuilt its buckets after the first step, and there were several of them
    assert len(layouts) == STEPS and layouts[1] != layouts[0] and len(layouts[1]) > 2
    assert sorted(i for b in layouts[1] for i in b) == list(range(8))
    reference = run_local(2, lambda t: _reference(t, scheme(name, comp, ef), STEPS))
    for rank in range(2):
        assert ddp_runs[rank][comp, name][0] == reference[rank]
    assert reference[0] != flat(model()) and reference[0] == reference[1]
    # the lossy codec mattered: identity through the same scheme trains differently
    if ("identity", name) in ddp_runs[0]:
        assert ddp_runs[0]["identity", name][0] != reference[0]


@pytest.mark.distributed
@pytest.mark.parametrize(("comp", "ef"), CHUNKED)
def test_chunked_hook_equals_the_scheme_piece_by_piece(
    ddp_runs: list[dict[str, Any]], comp: str, ef: bool
) -> None:
    """Parameters of more than ``CHUNK`` values encoded in pieces of their rows, each its own
    payload (keys and residual slots numbered by piece), several to a message: the same
    training as the scheme run piece by piece on each parameter, whose rank decodes its own
    payload too (the hook adds its own reconstruction instead)."""
    trained, layouts = ddp_runs[0]["chunked", comp]
    assert ddp_runs[1]["chunked", comp] == (trained, layouts)
    assert max(sum(1 for _ in b) for b in layouts[1]) > 1
    sch = lambda: scheme("allgather", comp, ef)  # noqa: E731
    reference = run_local(2, lambda t: _reference(t, sch(), STEPS, chunk=CHUNK))
    assert reference[0] == reference[1] == trained
    # the pieces mattered: the same parameters whole train differently
    whole = run_local(2, lambda t: _reference(t, sch(), STEPS))
    assert whole[0] != trained


def test_parameter_pieces_cut_whole_rows_independently_of_buckets() -> None:
    parameter_pieces = scheme("allgather", "dqsg", False).parameter_pieces
    assert parameter_pieces(torch.Size((10, 6)), 4) == [
        (6 * r, 6 * (r + 1), torch.Size((1, 6))) for r in range(10)
    ]
    assert parameter_pieces(torch.Size((10,)), 4) == [
        (0, 4, torch.Size((4,))),
        (4, 7, torch.Size((3,))),
        (7, 10, torch.Size((3,))),
    ]
    assert parameter_pieces(torch.Size((6, 4)), 12) == [
        (0, 12, torch.Size((3, 4))),
        (12, 24, torch.Size((3, 4))),
    ]
    # small enough, a scalar, one row of more than 12 values (rows are never split), empty
    for shape in [(4, 3), (), (1, 50), (0,)]:
        size = torch.Size(shape)
        assert parameter_pieces(size, 12) == [(0, size.numel(), size)]
    assert parameter_pieces(torch.Size((10, 6)), 4) == row_pieces(torch.Size((10, 6)), 4)
    # a scheme that does not pipeline keeps every parameter whole
    ring = scheme("ring", "dqsg", False)
    assert not ring.pipelines
    assert ring.parameter_pieces(torch.Size((10, 6)), 4) == [(0, 60, torch.Size((10, 6)))]


def _non_finite_steps(run: dict[str, Any]) -> None:
    layouts = run["layouts"]
    assert len(layouts) == 3 and layouts[0] != layouts[1]


@pytest.mark.distributed
def test_non_finite_gradient_on_one_rank_raises_on_every_rank(
    ddp_runs: list[dict[str, Any]],
) -> None:
    _non_finite_steps(ddp_runs[0]["raise"])
    sch = lambda: scheme("allgather", "topk", True)  # noqa: E731
    reference = run_local(2, lambda t: _reference(t, sch(), NAN_STEP + 2, poisoned=NAN_STEP))
    for rank in range(2):
        run = ddp_runs[rank]["raise"]
        assert run["error"] is not None, f"rank {rank} did not raise"
        kind, message = run["error"]
        assert kind == "NonFiniteInputError" and "rank(s) [1]" in message
        assert "bucket 0" not in message  # earlier buckets had been reduced, then undone
        assert run["params_unchanged"] and run["scheme_unchanged"]
        assert (run["step"], run["skipped"]) == (1, 0)
        # the same state, registered on a new DDP wrapper (initial buckets again), trains on
        # as the reference does
        assert run["layouts"][2] == run["layouts"][0]
        assert run["final"] == reference[rank] and run["final_step"] == 2


@pytest.mark.distributed
def test_skip_mode_zeroes_the_step_on_every_rank(ddp_runs: list[dict[str, Any]]) -> None:
    _non_finite_steps(ddp_runs[0]["skip"])
    sch = lambda: scheme("allgather", "topk", True)  # noqa: E731
    reference = run_local(2, lambda t: _reference(t, sch(), NAN_STEP + 2, poisoned=NAN_STEP))
    for rank in range(2):
        run = ddp_runs[rank]["skip"]
        assert run["error"] is None and run["grads_zero"]
        assert run["params_unchanged"] and run["scheme_unchanged"]
        assert (run["step"], run["skipped"]) == (1, 1)
        assert run["final"] == reference[rank] and run["final_step"] == 2


@pytest.mark.distributed
def test_the_hook_state_is_what_a_resume_needs(ddp_runs: list[dict[str, Any]]) -> None:
    for rank in range(2):
        runs = ddp_runs[rank]["checkpoint"]
        assert runs["resumed"] == runs["straight"]
        assert runs["hook_state_lost"] != runs["straight"]


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("comp", "name", "chunk"),
    [
        pytest.param(*config, marks=() if config in RESUME_QUICK else pytest.mark.slow)
        for config in RESUME_CONFIGS
    ],
    ids=[f"{c}-{n}" + ("" if k is None else f"-pieces{k}") for c, n, k in RESUME_CONFIGS],
)
@pytest.mark.parametrize("bucket_mb", [ONE_BUCKET_MB, BUCKET_MB], ids=["one-bucket", "buckets"])
def test_resume_is_bit_exact_against_an_uninterrupted_run(
    request: pytest.FixtureRequest, comp: str, name: str, chunk: int | None, bucket_mb: float
) -> None:
    """The checkpoint at step 2 of a run, loaded into a fresh model, optimizer, hook state and
    DDP wrapper, trains on to the very bits of the run that was never stopped, though the
    resumed wrapper's first step puts the parameters in other buckets (DDP's initial ones, in
    reverse model order; the uninterrupted run had rebuilt them in gradient-ready order)."""
    quick = (comp, name, chunk) in RESUME_QUICK
    runs = request.getfixturevalue("quick_resume_runs" if quick else "slow_resume_runs")
    for rank in range(2):
        run = runs[rank][comp, name, chunk, bucket_mb]
        straight_layout, resumed_layout = run["layouts"]
        assert straight_layout != resumed_layout  # the layouts differ at the resumed step
        if bucket_mb == ONE_BUCKET_MB:
            assert len(straight_layout) == len(resumed_layout) == 1
        else:
            assert len(straight_layout) > 2
        assert run["straight"] != flat(model())
        assert run["resumed"] == run["straight"]


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


def _run_step(
    state: GradzipHookState, params: list[torch.Tensor], grads: list[torch.Tensor], layout: Layout
) -> list[torch.Tensor]:
    """One backward pass's buckets through the hook; the averaged gradients in model order."""
    out: list[torch.Tensor] = [torch.empty(0)] * len(params)
    buckets = [
        FakeBucket(k, k == len(layout) - 1, [params[i] for i in g], [grads[i] for i in g])
        for k, g in enumerate(layout)
    ]
    futures = [state.reduce_bucket(b) for b in buckets]  # type: ignore[arg-type]
    for bucket, group, future in zip(buckets, layout, futures, strict=True):
        # DDP copies the future's tensor into the gradients: the bucket's buffer or the mean
        result = future.wait()
        assert result.shape == bucket.buffer().shape and result.dtype == bucket.buffer().dtype
        offset = 0
        for i, view in zip(group, bucket.gradients(), strict=True):
            out[i] = result[offset : offset + view.numel()].view_as(view).clone()
            offset += view.numel()
    return out


@pytest.mark.parametrize("name", ["allgather", "ring", "ps"])
def test_buckets_in_any_grouping_and_dtype_match_gradient_sync(name: str) -> None:
    """Half-precision gradients in changing bucketings (as at a rebuild, or a resumed run with
    another bucket size) against the scheme on each parameter (``GradientSync``)."""
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)).half()
    params = list(net.parameters())
    shapes = [tuple(p.shape) for p in params]
    groupings = [[(0, 1, 2, 3)], [(3, 2), (1,), (0,)], [(3,), (2, 1, 0)], [(3,), (2, 1, 0)]]

    def body(transport: Transport) -> tuple[list[list[torch.Tensor]], list[list[torch.Tensor]]]:
        state = GradzipHookState(scheme(name, "topk", True), net, transport)
        sync = GradientSync(transport, scheme=scheme(name, "topk", True))
        hooked, referenced = [], []
        for step, grouping in enumerate(groupings):
            grads = [g.half() for g in _grads(transport.rank, step, shapes)]
            hooked.append(_run_step(state, params, grads, grouping))
            referenced.append(reduce_parameters(transport, sync, grads))
        assert state.step == len(groupings)
        state.close()
        return hooked, referenced

    for hooked, referenced in run_local(2, body):
        for step_hooked, step_referenced in zip(hooked, referenced, strict=True):
            for a, b in zip(step_hooked, step_referenced, strict=True):
                assert a.dtype == b.dtype == torch.float16 and torch.equal(a, b)


class GatedTransport(Transport):
    """A transport whose first message waits for ``gate``: shows who waits for the network."""

    def __init__(self, inner: Transport, gate: threading.Event) -> None:
        super().__init__(inner.rank, inner.world_size)
        self.inner, self.gate, self.meter = inner, gate, inner.meter
        self.threads: set[str] = set()

    def _transfer(self, sends: Sequence[Send], sources: Sequence[int]) -> list[tuple[bytes, bool]]:
        self.gate.wait()
        self.threads.add(threading.current_thread().name)
        return self.inner._transfer(sends, sources)


def test_the_hook_returns_before_its_bucket_is_communicated() -> None:
    """The main thread queues a bucket and goes on while a worker thread communicates; the
    future completes when the step's last bucket is done, the last call waits for it."""
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    params = list(net.parameters())
    shapes = [tuple(p.shape) for p in params]

    def body(transport: Transport) -> tuple[bool, bool, set[str], str]:
        gated = GatedTransport(transport, threading.Event())
        state = GradzipHookState(scheme("ring", "onebit", True), net, gated)
        grads = _grads(transport.rank, 0, shapes)
        first = state.reduce_bucket(FakeBucket(0, False, params[2:], grads[2:]))  # type: ignore[arg-type]
        pending = not first.done()  # the worker is held at the gate: nothing sent yet
        gated.gate.set()
        last = state.reduce_bucket(FakeBucket(1, True, params[:2], grads[:2]))  # type: ignore[arg-type]
        done = first.done() and last.done() and state.step == 1
        state.close()
        return pending, done, gated.threads, threading.current_thread().name

    for pending, done, threads, main in run_local(2, body):
        assert pending and done
        assert len(threads) == 1 and main not in threads
        assert next(iter(threads)).startswith("gradzip-ddp-hook")


def test_allgather_encodes_the_next_bucket_while_one_is_on_the_wire() -> None:
    """The allgather scheme's pipeline: with bucket 0's exchange held at the gate, the encode
    stage goes on to bucket 1 (its payload is produced before anything was sent), and the
    step's averages are those of the unpipelined reference."""
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    params = list(net.parameters())
    shapes = [tuple(p.shape) for p in params]
    layout = [(2, 3), (0,), (1,)]

    def body(transport: Transport) -> tuple[bool, set[str], list[torch.Tensor], list[torch.Tensor]]:
        gated = GatedTransport(transport, threading.Event())
        state = GradzipHookState(scheme("allgather", "dqsg", True), net, gated)
        grads = _grads(transport.rank, 0, shapes)
        buckets = [
            FakeBucket(k, k == 2, [params[i] for i in g], [grads[i] for i in g])
            for k, g in enumerate(layout)
        ]
        futures = [state.reduce_bucket(b) for b in buckets[:2]]  # type: ignore[arg-type]
        produced = state.scheme.produced
        for _ in range(3000):  # a liveness bound (30 s), not a speed check
            if ("worker", 0, 0) in produced:
                break
            time.sleep(0.01)
        ahead = ("worker", 0, 0) in produced and not gated.threads  # bucket 1 encoded, none sent
        gated.gate.set()
        futures.append(state.reduce_bucket(buckets[2]))  # type: ignore[arg-type]
        hooked = [torch.empty(0)] * len(params)
        for group, bucket, future in zip(layout, buckets, futures, strict=True):
            result, offset = future.wait(), 0
            for i, view in zip(group, bucket.gradients(), strict=True):
                hooked[i] = result[offset : offset + view.numel()].view_as(view).clone()
                offset += view.numel()
        state.close()
        sync = GradientSync(transport, scheme=scheme("allgather", "dqsg", True))
        reference = reduce_parameters(transport, sync, grads)
        return ahead, gated.threads, hooked, reference

    for ahead, threads, hooked, reference in run_local(2, body):
        assert ahead
        assert {t.rsplit("-", 1)[0] for t in threads} == {"gradzip-ddp-hook-transfer"}
        assert all(torch.equal(a, b) for a, b in zip(hooked, reference, strict=True))


def _hook_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("gradzip-ddp-hook")]


def test_the_worker_thread_stops_on_close_and_when_the_state_is_collected() -> None:
    net = torch.nn.Linear(3, 2)
    params = list(net.parameters())
    transport = LocalGroup(1).endpoint(0)
    before = set(_hook_threads())

    def used_state() -> GradzipHookState:
        state = GradzipHookState(scheme("allgather", "onebit", True), net, transport)
        grads = _grads(0, 0, [tuple(p.shape) for p in params])
        state.reduce_bucket(FakeBucket(0, True, params, grads))  # type: ignore[arg-type]
        return state

    state = used_state()
    threads = set(_hook_threads()) - before
    names = sorted(t.name.rsplit("-", 1)[0] for t in threads)
    assert names == [f"gradzip-ddp-hook-{s}" for s in ("decode", "encode", "transfer")]
    assert all(t.daemon and t.is_alive() for t in threads)
    state.close()
    assert not any(t.is_alive() for t in threads) and state.step == 1
    state.close()  # idempotent
    with pytest.raises(GradzipError, match="closed"):
        state.reduce_bucket(FakeBucket(0, True, params, [torch.zeros(2, 3), torch.zeros(2)]))  # type: ignore[arg-type]
    assert state.state_dict()["step"] == 1

    state = used_state()
    threads = set(_hook_threads()) - before
    del state
    gc.collect()
    for thread in threads:
        thread.join(timeout=30.0)  # a liveness bound, not a speed check
    assert len(threads) == 3 and not any(t.is_alive() for t in threads)


def test_a_bucket_failing_half_way_restores_the_whole_step() -> None:
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    params = list(net.parameters())
    shapes = [tuple(p.shape) for p in params]

    def body(transport: Transport) -> tuple[str, bool, int, bool, bool]:
        state = GradzipHookState(scheme("allgather", "topk", True), net, transport)
        futures: list[torch.futures.Future[torch.Tensor]] = []

        def step(index: int, bad: bool = False, abandon: bool = False) -> None:
            grads = _grads(transport.rank, index, shapes)
            if bad and transport.rank == 1:
                grads[0] = grads[0].double()  # a dtype the other rank does not expect
            futures[:] = [state.reduce_bucket(FakeBucket(0, False, params[2:], grads[2:]))]  # type: ignore[arg-type]
            if not abandon:
                state.reduce_bucket(FakeBucket(1, True, params[:2], grads[:2]))  # type: ignore[arg-type]

        step(0)
        before = residuals(state.state_dict())
        try:
            step(1, bad=True)
        except GradzipError as err:
            message = f"{err} | {type(err.__cause__).__name__}"
            restored = all(
                torch.equal(a, b)
                for a, b in zip(before, residuals(state.state_dict()), strict=True)
            )
            failed_step = state.step
        else:
            return "no error", False, state.step, False, False
        # the earlier bucket's future holds the step's error too
        with pytest.raises(GradzipError, match="step 1, bucket 1"):
            futures[0].wait()
        # a backward pass abandoned after its first bucket is undone when the next one starts
        step(2, abandon=True)
        abandoned = futures[0]
        step(3)
        with pytest.raises(GradzipError, match="abandoned"):
            abandoned.wait()
        state.close()
        return message, restored, failed_step, state.step == 2, bool(before)

    for message, restored, failed_step, continued, had in run_local(2, body, timeout=10.0):
        assert "step 1, bucket 1" in message and PayloadMismatchError.__name__ in message
        assert restored and had and failed_step == 1 and continued


def test_powersgd_in_the_hook_skips_a_non_finite_step_on_every_rank_and_keeps_its_state() -> None:
    """PowerSGD's warm starts and residuals live in the scheme, keyed by parameter: a step
    some rank cannot take (a NaN in a weight, "skip") zeroes every bucket on every rank and
    leaves them as they were, and the next step goes on from there."""
    net = torch.nn.Sequential(torch.nn.Linear(12, 10), torch.nn.Linear(10, 9))
    params = list(net.parameters())
    shapes = [tuple(p.shape) for p in params]
    layout = [(3, 2), (1, 0)]

    def body(transport: Transport, poisoned: bool) -> tuple[list[torch.Tensor], bool, int]:
        psgd = PowerSGD(gradzip.create("identity"), run_seed=RUN_SEED, error_feedback=True)
        state = GradzipHookState(psgd, net, transport, on_nonfinite="skip")
        _run_step(state, params, _grads(transport.rank, 0, shapes), layout)
        before = psgd.state_dict()
        assert set(before["q"]) == set(before["residual"]) == {0, 2}  # the two weights
        unchanged, zeros = True, True
        if poisoned:
            grads = _grads(transport.rank, 1, shapes)
            if transport.rank == 1:
                grads[2][0, 0] = float("nan")
            means = _run_step(state, params, grads, layout)
            zeros = all(not m.any() for m in means)
            after = psgd.state_dict()
            unchanged = all(
                torch.equal(after[part][i], before[part][i])
                for part in ("q", "residual")
                for i in before[part]
            )
        means = _run_step(state, params, _grads(transport.rank, 2, shapes), layout)
        skipped = state.skipped_steps
        state.close()
        return means, unchanged and zeros, skipped

    clean = run_local(2, lambda t: body(t, False))
    poisoned = run_local(2, lambda t: body(t, True))
    for (a, _, none_skipped), (b, kept, skipped) in zip(clean, poisoned, strict=True):
        assert kept and (none_skipped, skipped) == (0, 1)
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
        assert len(a) == 4 and all(x.shape == p.shape for x, p in zip(a, params, strict=True))


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
                state.reduce_bucket(FakeBucket(0, False, params[1:], grads[1:]))  # type: ignore[arg-type]
            state.reduce_bucket(FakeBucket(0, False, params[1:], grads[1:]))  # type: ignore[arg-type]
            last = FakeBucket(1, True, params[:1], grads[:1])
            state.reduce_bucket(last)  # type: ignore[arg-type]
        assert state.step == 3
        out = [last.buffer(), *residuals(state.state_dict())]
        state.close()
        return out

    clean = run_local(2, lambda t: body(t, False))
    interrupted = run_local(2, lambda t: body(t, True))
    for a, b in zip(clean, interrupted, strict=True):
        assert len(a) == 3 and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


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
    unbound = GradzipHookState(scheme("allgather", "dqsg", False), net)  # no process group
    with pytest.raises(GradzipError, match="not initialised"):
        unbound.state_dict()  # its transport is bound on first use
    stranger = torch.nn.Parameter(torch.zeros(2))
    bucket = FakeBucket(0, True, [stranger], [torch.zeros(2)])
    with pytest.raises(GradzipError, match="not among the model's parameters"):
        state.reduce_bucket(bucket)  # type: ignore[arg-type]
    assert state.step == 0
    state.close()
    other.close()


def test_a_refused_checkpoint_changes_nothing() -> None:
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    params = list(net.parameters())
    transport = LocalGroup(1).endpoint(0)
    state = GradzipHookState(scheme("allgather", "onebit", True), net, transport, chunk_elements=6)
    _run_step(state, params, _grads(0, 0, [tuple(p.shape) for p in params]), [(3, 2, 1, 0)])
    good = state.state_dict()
    worker = good["scheme"]["feedback"]["worker"]
    # the 4x3 weight in two pieces of two rows, the 2x4 weight in two of one row; the biases
    # whole
    assert list(zip(worker["tensor_index"], worker["chunk"], strict=True)) == [
        (0, 0),
        (0, 1),
        (1, 0),
        (2, 0),
        (2, 1),
        (3, 0),
    ]

    def broken(edit: Any) -> dict[str, Any]:
        role = dict(worker)
        bad = {**good, "scheme": {**good["scheme"], "feedback": {"worker": role}}}
        edit(role, bad)
        return bad

    def set_key(key: str, value: Any) -> Any:
        return lambda role, _: role.__setitem__(key, value)

    shapes = [r.shape for r in worker["residual"]]
    fresh = GradzipHookState(scheme("allgather", "onebit", True), net, transport, chunk_elements=6)
    cases = {
        "twice": set_key("chunk", [0, 0, 0, 0, 1, 0]),
        "parameter 9; this model has 4": set_key("tensor_index", [0, 0, 1, 2, 2, 9]),
        # the first index past the parameters: a CheckpointError, not an IndexError
        "parameter 4; this model has 4": set_key("tensor_index", [0, 0, 1, 2, 2, 4]),
        "no such piece": set_key("chunk", [0, 1, 0, 0, 1, 5]),
        "this model's piece is": set_key("residual", [torch.zeros(1)] * 6),
        "NaN": set_key("residual", [torch.full(s, float("nan")) for s in shapes]),
        "shapes": lambda _, top: top.__setitem__("shapes", [[1], [2]]),
        "chunk_elements": lambda _, top: top.__setitem__("chunk_elements", 7),
        "version": lambda _, top: top.__setitem__("version", 2),
    }
    for match, edit in cases.items():
        with pytest.raises(CheckpointError, match=match):
            fresh.load_state_dict(broken(edit))
        assert fresh.step == 0 and residuals(fresh.state_dict()) == []
    fresh.load_state_dict(good)
    assert fresh.step == 1
    assert all(
        torch.equal(a, b)
        for a, b in zip(residuals(good), residuals(fresh.state_dict()), strict=True)
    )
    state.close()
    fresh.close()


def test_timeline_records_every_piece_through_the_three_stages_in_order() -> None:
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    params = list(net.parameters())
    shapes = [tuple(p.shape) for p in params]
    # bucket 0: the bias of 2 (one piece), the 2x4 weight (two pieces of 4 values: one row
    # each); bucket 1: the bias of 4 (two pieces of 2), the 4x3 weight (four pieces of 3). At
    # most 3 values to a message, unless a piece is larger: 3 and 6 messages
    grouping = [(3, 2), (1, 0)]

    def body(transport: Transport) -> list[Any]:
        sch = scheme("allgather", "dqsg", False)
        assert GradzipHookState(sch, net, transport).timeline is None  # off by default
        state = GradzipHookState(sch, net, transport, chunk_elements=3, record_timeline=True)
        _run_step(state, params, _grads(transport.rank, 0, shapes), grouping)
        state.close()
        assert state.timeline is not None
        return state.timeline.spans

    for spans in run_local(2, body):
        pieces = {(s.bucket, s.chunk) for s in spans}
        assert pieces == {(0, c) for c in range(3)} | {(1, c) for c in range(6)}
        for piece in pieces:
            stages = {s.stage: s for s in spans if (s.bucket, s.chunk) == piece}
            assert set(stages) == {"encode", "transfer", "decode"}
            assert stages["encode"].end <= stages["transfer"].start
            assert stages["transfer"].end <= stages["decode"].start
            assert all(s.step == 0 and s.start <= s.end for s in stages.values())
