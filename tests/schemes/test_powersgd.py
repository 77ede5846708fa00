"""PowerSGD over gradzip's transport: the projection of the ranks' mean onto span(P), real and
counted factor payloads, error feedback and warm start, whole small tensors, state that
survives a checkpoint and a failed step, bits independent of threads, and sim equal to real."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numba
import pytest
import torch

import gradzip
from gradzip.comm.local import run_local
from gradzip.comm.spawn import run_processes
from gradzip.comm.transport import LENGTH_PREFIX_BYTES, Transport
from gradzip.errors import CheckpointError
from gradzip.optim import CompressedOptimizer
from gradzip.payload import parse_payload
from gradzip.schemes import AllGatherDecode, PowerSGD
from gradzip.sync import GradientSync

if TYPE_CHECKING:
    from tests.conftest import RunSimulatedAndProcesses


def matrices(world: int, n: int, m: int, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(n, m, generator=gen) for _ in range(world)]


def scheme(codec: str = "identity", **options: object) -> PowerSGD:
    """PowerSGD as the paper runs it: error feedback on unless ``options`` say otherwise."""
    options = {"error_feedback": True, **options}
    return PowerSGD(gradzip.create(codec), run_seed=3, **options)  # type: ignore[arg-type]


def reference(mean: torch.Tensor, q0t: torch.Tensor) -> torch.Tensor:
    """``P P^T mean`` with ``P`` an orthonormal basis of ``mean Q0`` (float64, QR)."""
    basis, _ = torch.linalg.qr(mean.double() @ q0t.double().T)
    return basis @ (basis.T @ mean.double())


@pytest.mark.parametrize(("world", "rank"), [(2, 1), (3, 4)])
def test_first_step_is_the_projection_of_the_mean_and_every_rank_agrees(
    world: int, rank: int
) -> None:
    grads = matrices(world, 40, 36, seed=world)
    outs = run_local(world, lambda t: scheme(rank=rank).reduce(t, grads[t.rank], 0, 5))
    for out in outs[1:]:
        assert torch.equal(out, outs[0])
    mean = torch.stack(grads).double().mean(0)
    expected = reference(mean, scheme(rank=rank).initial_q(5, rank, 36))
    # float32 products of length 36-40: errors of a few ulps of the entries
    assert torch.allclose(outs[0].double(), expected, atol=1e-5, rtol=1e-4)


def test_a_rank_one_mean_is_reproduced_and_warm_starts_converge_on_a_rank_two_mean() -> None:
    gen = torch.Generator().manual_seed(1)
    u, v = torch.randn(30, 1, generator=gen), torch.randn(1, 20, generator=gen)
    one = run_local(2, lambda t: scheme().reduce(t, u @ v, 0, 0))[0]
    assert torch.allclose(one, u @ v, atol=1e-5)
    # rank 2 on a mean with singular values 10, 6, 1, 0.5, 0.25, without error feedback: the
    # warm-started power iteration converges to the best rank-2 approximation, whose error is
    # the norm of the dropped singular values
    left, _ = torch.linalg.qr(torch.randn(30, 5, generator=gen))
    right, _ = torch.linalg.qr(torch.randn(20, 5, generator=gen))
    sing = torch.tensor([10.0, 6.0, 1.0, 0.5, 0.25])
    target = (left * sing) @ right.T
    best = float(sing[2:].norm())

    def run(t: Transport) -> list[float]:
        s = scheme(rank=2, error_feedback=False)
        return [float((s.reduce(t, target, step, 0) - target).norm()) for step in range(8)]

    errors = run_local(2, run)[0]
    assert errors[0] > 1.05 * best and errors[-1] < 1.001 * best


def test_error_feedback_keeps_what_was_not_delivered_and_sends_it_next() -> None:
    grads = matrices(2, 24, 20, seed=2)

    def run(t: Transport) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        with_ef, without = scheme(), scheme(error_feedback=False)
        first = with_ef.reduce(t, grads[t.rank], 0, 1)
        residual = with_ef.snapshot()["residual"][(1, 0)]
        without.reduce(t, grads[t.rank], 0, 1)
        # the second step sends g + e: it differs from the step without the residual
        return (
            first,
            residual,
            with_ef.reduce(t, grads[t.rank], 1, 1),
            without.reduce(t, grads[t.rank], 1, 1),
        )

    outs = run_local(2, run)
    for rank, (first, residual, second, plain) in enumerate(outs):
        assert torch.equal(residual, (grads[rank] - first))
        assert float(residual.norm()) > 0.5 * float(grads[rank].norm())
        assert not torch.equal(second, plain)
    assert torch.equal(outs[0][2], outs[1][2])


def test_factor_payloads_are_real_and_counted_and_fp16_halves_them() -> None:
    n, m, r = 64, 48, 4
    grads = matrices(2, n, m, seed=3)

    def run(codec: str) -> int:
        def one(t: Transport) -> int:
            scheme(codec, rank=r).reduce(t, grads[t.rank], 0, 0)
            return t.meter.total().sent

        return run_local(2, one)[0]

    identity = run("identity")
    # two payloads: P^T (r x n) and Q^T (r x m) as float32, each with its header and prefix
    p = gradzip.create("identity").encode(torch.zeros(r, n)).payload
    q = gradzip.create("identity").encode(torch.zeros(r, m)).payload
    assert identity == len(p) + len(q) + 2 * LENGTH_PREFIX_BYTES
    assert parse_payload(p)[0].numel == r * n
    half = run("fp16")
    assert half < 0.56 * identity
    assert identity < 0.2 * 4 * n * m  # against the float32 matrix


def test_factors_summed_as_integers_agree_on_every_rank_and_cost_less_at_four_ranks() -> None:
    """factor_scheme="allreduce": a quantizer on a common scale whose integer codes a ring
    sums exactly; every rank gets the same bits, the approximation stays within the codec's
    error of the float32 factors', and at P = 4 each rank sends less than with all-gathered
    quantized factors (about 2 (P-1)/P of a payload instead of P - 1)."""
    world, n, m = 4, 400, 300
    grads = matrices(world, n, m, seed=12)

    def run(t: Transport, factor_scheme: str, codec: str) -> tuple[torch.Tensor, int]:
        compressor = gradzip.create(codec, **({"s": 127} if codec == "qsgd" else {}))
        s = PowerSGD(
            compressor, run_seed=3, rank=2, factor_scheme=factor_scheme, error_feedback=True
        )
        return s.reduce(t, grads[t.rank], 0, 0), t.meter.total().sent

    summed = run_local(world, lambda t: run(t, "allreduce", "qsgd"))
    gathered = run_local(world, lambda t: run(t, "allgather", "qsgd"))
    exact = run_local(world, lambda t: run(t, "allgather", "identity"))[0][0]
    assert all(torch.equal(r[0], summed[0][0]) for r in summed)
    # QSGD at s = 127 per factor: errors of about 1% of the factors' scale, not more
    error = float((summed[0][0] - exact).norm() / exact.norm())
    assert 0 < error < 0.05, error
    assert max(r[1] for r in summed) < 0.75 * min(r[1] for r in gathered)
    with pytest.raises(ValueError, match="fp16"):
        PowerSGD(gradzip.create("fp16"), factor_scheme="allreduce")
    with pytest.raises(ValueError, match="factor_scheme"):
        PowerSGD(gradzip.create("identity"), factor_scheme="ring")


def test_steps_before_start_step_send_the_exact_mean_and_keep_no_state() -> None:
    """``start_step`` (PyTorch's start_powerSGD_iter): whole tensors before it, then the
    power iteration from the shared first Q, as if those steps had not been."""
    grads = [matrices(2, 30, 20, seed=20 + k) for k in range(3)]

    def run(t: Transport, start: int) -> tuple[list[torch.Tensor], list[int]]:
        s = scheme(rank=1, start_step=start)
        means, states = [], []
        for step in range(3):
            means.append(s.reduce(t, grads[step][t.rank], step, 0))
            states.append(len(s.state_dict()["q"]))
        return means, states

    late = run_local(2, lambda t: run(t, 2))[0]
    early = run_local(2, lambda t: run(t, 0))[0]
    for step in range(2):
        exact = (grads[step][0] + grads[step][1]) / 2
        assert torch.equal(late[0][step], exact)
    assert late[1] == [0, 0, 1]
    # the first compressed step starts from the shared first Q, with no residual: the same
    # approximation as step 0 of a run that compresses from the start, of its own gradients
    assert torch.equal(
        late[0][2], run_local(2, lambda t: scheme(rank=1).reduce(t, grads[2][t.rank], 2, 0))[0]
    )
    assert not torch.equal(late[0][2], early[0][2])
    with pytest.raises(ValueError, match="start_step"):
        scheme(start_step=-1)


def test_vectors_and_small_matrices_are_sent_whole() -> None:
    bias = [torch.randn(7), torch.randn(7)]
    small = [torch.randn(3, 3), torch.randn(3, 3)]

    def run(t: Transport) -> list[torch.Tensor]:
        s, exact = scheme(), AllGatherDecode(gradzip.create("identity"), run_seed=3)
        return [
            s.reduce(t, bias[t.rank], 0, 0),
            exact.reduce(t, bias[t.rank], 0, 0),
            s.reduce(t, small[t.rank], 0, 1),
            exact.reduce(t, small[t.rank], 0, 1),
        ]

    a, b, c, d = run_local(2, run)[0]
    assert torch.equal(a, b) and torch.equal(c, d)
    assert scheme().compresses(torch.Size([24, 32])) and not scheme().compresses(torch.Size([3, 3]))
    assert not scheme(rank=8).compresses(torch.Size([24, 32]))  # 8*56*2 >= 768


def test_a_checkpoint_resumes_bit_exactly_and_a_bad_one_changes_nothing() -> None:
    grads = [matrices(2, 20, 16, seed=10 + s) for s in range(4)]

    def straight(t: Transport) -> torch.Tensor:
        s = scheme()
        return torch.stack([s.reduce(t, grads[k][t.rank], k, 0) for k in range(4)])

    def resumed(t: Transport) -> torch.Tensor:
        s = scheme()
        first = [s.reduce(t, grads[k][t.rank], k, 0) for k in range(2)]
        state = s.state_dict()
        s2 = scheme()
        s2.load_state_dict(state)
        return torch.stack(first + [s2.reduce(t, grads[k][t.rank], k, 0) for k in range(2, 4)])

    assert torch.equal(run_local(2, straight)[0], run_local(2, resumed)[0])
    s = scheme()
    before = s.snapshot()
    bad = {"version": 1, "scheme": "powersgd", "rank": 1, "q": {0: torch.ones(3)}, "residual": {}}
    with pytest.raises(CheckpointError, match="2-D float32"):
        s.load_state_dict(bad)
    with pytest.raises(CheckpointError, match="rank"):
        s.load_state_dict({**bad, "rank": 2})
    assert s.snapshot() == before


def test_a_step_some_rank_cannot_take_leaves_the_state_unchanged() -> None:
    grads = matrices(2, 20, 16, seed=4)

    def run(t: Transport) -> tuple[object, bool]:
        s = scheme()
        s.reduce(t, grads[t.rank], 0, 0)
        before = s.snapshot()
        bad = grads[t.rank].clone()
        if t.rank == 1:
            bad[0, 0] = float("nan")
        finite = bool(torch.isfinite(bad).all())
        result = s.reduce_if_all_finite(t, bad, 1, 0, finite)
        return result, s.snapshot() == before

    for result, unchanged in run_local(2, run):
        assert result == [1] and unchanged


def test_bits_do_not_depend_on_the_thread_count() -> None:
    """numba's thread count is per calling thread: each simulated rank sets its own."""
    grads = matrices(2, 300, 260, seed=5)
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs two numba threads to compare")

    def run(t: Transport, threads: int) -> torch.Tensor:
        numba.set_num_threads(threads)
        return scheme(rank=3).reduce(t, grads[t.rank], 0, 0)

    one = run_local(2, lambda t: run(t, 1))
    two = run_local(2, lambda t: run(t, 2))
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])


def net() -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(32, 24), torch.nn.Tanh(), torch.nn.Linear(24, 4))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return model


def batch(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s fixed batch of a linear regression (the same at every step)."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(64, 32, generator=gen)
    y = x[:, :4] * 2 + 0.1 * torch.randn(64, 4, generator=gen)
    part = slice(32 * rank % 64, 32 * rank % 64 + 32)
    return x[part], y[part]


def train(transport: Transport, steps: int, codec: str = "identity") -> tuple[list[float], bytes]:
    """Train through CompressedOptimizer and PowerSGD; the losses and the parameters' bytes.
    Module level, so spawned processes can import it."""
    model = net()
    psgd = PowerSGD(gradzip.create(codec), rank=2, error_feedback=True)
    sync = GradientSync(transport, scheme=psgd)
    opt = CompressedOptimizer(torch.optim.SGD(model.parameters(), lr=0.2), sync)
    x, y = batch(transport.rank)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, b"".join(p.detach().numpy().tobytes() for p in model.parameters())


def test_trains_through_compressed_optimizer_and_ranks_agree() -> None:
    results = run_local(2, lambda t: train(t, 30))
    assert results[0][1] == results[1][1]
    losses = results[0][0]
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.distributed
def test_simulated_ranks_equal_gloo_processes_bit_for_bit(
    simulated_and_processes: RunSimulatedAndProcesses,
) -> None:
    runs = simulated_and_processes(2, train, 4)
    real, simulated = runs.processes, runs.simulated
    assert [r[1] for r in real] == [s[1] for s in simulated]


def test_any_grouping_of_the_tensors_gives_the_same_means_and_state_losslessly() -> None:
    """Warm starts and residuals belong to the tensors, so with a codec that treats every
    value on its own (float32, fp16) reducing tensors together or one by one is the same;
    together they take two messages in all instead of two each."""
    gen = torch.Generator().manual_seed(9)
    shapes = [(20, 16), (7,), (12, 30), (3, 2)]  # approximated, whole, approximated, whole
    grads = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(2)]

    def run(t: Transport, codec: str, together: bool) -> tuple[list[torch.Tensor], object, int]:
        s, indices, means = scheme(codec, rank=2), [4, 5, 6, 7], []
        for step in range(3):
            mine = [g * (step + 1) for g in grads[t.rank]]
            if together:
                means, down = s.reduce_many_if_all_finite(t, mine, indices, step, True)
                assert not down
            else:
                means = [s.reduce(t, g, step, i) for g, i in zip(mine, indices, strict=True)]
        return means, s.state_dict(), t.meter.total(step=2).messages

    for codec in ("identity", "fp16"):
        together = run_local(2, lambda t, c=codec: run(t, c, True))  # type: ignore[misc]
        apart = run_local(2, lambda t, c=codec: run(t, c, False))  # type: ignore[misc]
        for a, b in zip(together, apart, strict=True):
            assert all(torch.equal(x, y) for x, y in zip(a[0], b[0], strict=True))
            for part in ("q", "residual"):
                assert a[1][part].keys() == b[1][part].keys() == {4, 6}  # type: ignore[index]
                for key in (4, 6):
                    assert torch.equal(a[1][part][key], b[1][part][key])  # type: ignore[index]
            assert (a[2], b[2]) == (2, 6)  # messages in a step: 2 together, 2 + 1 + 2 + 1 apart
    # the means are the low-rank approximation, not the exact mean
    exact = (grads[0][0] + grads[1][0]) * 1.5
    assert not torch.allclose(together[0][0][0], exact, atol=1e-3)


def test_a_nan_in_any_tensor_of_a_group_lowers_the_flag_on_every_rank_and_changes_nothing() -> None:
    gen = torch.Generator().manual_seed(2)
    grads = [[torch.randn(20, 16, generator=gen), torch.randn(5, generator=gen)] for _ in range(2)]

    def run(t: Transport, poisoned: int, factor_scheme: str) -> tuple[list[int], bool]:
        codec = "identity" if factor_scheme == "allgather" else "qsgd"
        s = scheme(codec, factor_scheme=factor_scheme)
        s.reduce_many_if_all_finite(t, grads[t.rank], [0, 1], 0, True)
        before = s.snapshot()
        mine = [g.clone() for g in grads[t.rank]]
        if t.rank == 1:
            mine[poisoned].view(-1)[0] = float("inf")
        # finite=True: the all-gather's encoder refuses the value and lowers this rank's flag;
        # before the integer sum the message is scanned
        means, down = s.reduce_many_if_all_finite(t, mine, [0, 1], 1, True)
        return down, not means and s.snapshot() == before

    for factor_scheme in ("allgather", "allreduce"):
        for poisoned in (0, 1):  # in an approximated matrix, in a tensor sent whole
            for down, unchanged in run_local(
                2,
                lambda t, k=poisoned, f=factor_scheme: run(t, k, f),  # type: ignore[misc]
                timeout=30.0,
            ):
                assert down == [1] and unchanged


#: per step of a spawned rank's DDP run: the parameters (model positions) of each bucket
_BUCKETS: list[list[tuple[int, ...]]] = []


def _recording_hook(state: Any, bucket):  # type: ignore[no-untyped-def]
    """gradzip's hook, noting which parameters each bucket of the step holds. ``bucket`` and
    the result are unannotated: DDP refuses annotations other than the classes themselves, and
    this module's annotations are strings."""
    from gradzip.integrations.ddp import gradzip_hook

    if bucket.index() == 0:
        _BUCKETS.append([])
    _BUCKETS[-1].append(tuple(state._index[id(p)] for p in bucket.parameters()))
    return gradzip_hook(state, bucket)


def _ddp_train(
    transport: Transport, segments: list[tuple[int, float]], saved: bytes | None = None
) -> tuple[bytes, bytes]:
    """DDP over gloo with gradzip's hook running PowerSGD (the same model, data and optimizer
    as :func:`train`); ``(steps, bucket_cap_mb)`` per segment, each in a new wrapper (new
    buckets). ``saved``: the checkpoint to resume from; returns the parameters and a
    checkpoint. Module level, so spawned processes can import it."""
    import io

    from torch.nn.parallel import DistributedDataParallel

    from gradzip.integrations.ddp import GradzipHookState

    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    state = GradzipHookState(
        PowerSGD(gradzip.create("identity"), rank=2, error_feedback=True), model, transport
    )
    if saved is not None:
        loaded = torch.load(io.BytesIO(saved), weights_only=True)
        model.load_state_dict(loaded["model"])
        state.load_state_dict(loaded["hook"])
    x, y = batch(transport.rank)
    for steps, bucket_mb in segments:
        ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_mb)
        ddp.register_comm_hook(state, _recording_hook)
        for _ in range(steps):
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "hook": state.state_dict()}, buf)
    state.close()
    return b"".join(p.detach().numpy().tobytes() for p in model.parameters()), buf.getvalue()


def _ddp_runs(transport: Transport) -> dict[str, Any]:
    small, other = 0.0001, 0.0005  # bucket caps of about 100 and 500 bytes
    straight = _ddp_train(transport, [(2, small), (2, other)])[0]
    layouts = list(_BUCKETS)
    _, saved = _ddp_train(transport, [(2, small)])
    resumed = _ddp_train(transport, [(2, other)], saved)[0]
    return {"straight": straight, "resumed": resumed, "layouts": layouts}


@pytest.mark.distributed
def test_the_ddp_hook_approximates_each_parameter_and_resumes_in_other_buckets() -> None:
    """Through DDP's buckets (rebuilt after the first step, other buckets after a resume) the
    hook gives PowerSGD each parameter in its own shape under its model-order index: with float32
    factors it trains bit for bit as GradientSync on the parameters."""
    real = run_processes(2, _ddp_runs, timeout=60.0, run_timeout=180.0)
    reference = run_local(2, lambda t: train(t, 4))
    layouts = real[0]["layouts"]
    # each wrapper's first step holds every parameter in one bucket; the first wrapper's
    # rebuilt buckets are several, the second wrapper's (another cap) are others
    assert len(layouts) == 4 and len(layouts[0]) == len(layouts[2]) == 1
    assert len(layouts[1]) > 1 and layouts[3] != layouts[1]
    for rank in range(2):
        assert real[rank]["layouts"] == layouts
        assert real[rank]["straight"] == reference[rank][1]
        assert real[rank]["resumed"] == real[rank]["straight"]
