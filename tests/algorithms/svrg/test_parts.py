"""The pieces under LPC/ALPC-SVRG: proximal operators, problems (least squares, logistic, any
nn.Module), keyed sampling, the synthetic data, the inner message's
statistics (spec 3.7) and the SGD baselines."""

from __future__ import annotations

import math
import threading

import pytest
import torch

from gradzip.algorithms.svrg import (
    L1,
    L2,
    L2Ball,
    Logistic,
    LPCSVRGConfig,
    ModuleProblem,
    NoProx,
    Prox,
    SGDConfig,
    lpc_svrg,
    make_prox,
    make_synthetic,
    quantized_sgd,
    synthetic_regression,
)
from gradzip.algorithms.svrg.channel import Channel, make_inner_scheme
from gradzip.algorithms.svrg.problems import LeastSquares
from gradzip.algorithms.svrg.sampling import local_batch, shared_batch, shared_choice
from gradzip.comm.local import run_local
from gradzip.comm.transport import LENGTH_PREFIX_BYTES, Transport
from gradzip.compressors.identity import Identity
from gradzip.compressors.qsgd import QSGD
from gradzip.keys import StreamKey

# -- proximal operators --------------------------------------------------------------------------


@pytest.mark.parametrize("prox", [NoProx(), L1(0.7), L2(1.3), L2Ball(2.0)], ids=repr)
def test_prox_is_the_argmin(prox: Prox) -> None:
    """``prox_{eta h}(v)`` minimises ``h(y) + ||y - v||^2 / (2 eta)``: no random nearby point of
    the domain does better (the objective is strongly convex, so this pins the minimiser)."""
    gen = torch.Generator().manual_seed(0)
    for eta in (0.1, 1.0, 3.0):
        v = torch.randn(20, generator=gen, dtype=torch.float64) * 2
        y = prox(v, eta)

        def obj(p: torch.Tensor, v: torch.Tensor = v, eta: float = eta) -> float:
            return prox.value(p) + float((p - v).pow(2).sum()) / (2 * eta)

        best = obj(y)
        assert math.isfinite(best)
        for _ in range(200):
            other = y + 1e-3 * torch.randn(20, generator=gen, dtype=torch.float64)
            assert obj(other) >= best - 1e-12


def test_prox_closed_forms_and_names() -> None:
    v = torch.tensor([3.0, -0.5, 0.2, -4.0], dtype=torch.float64)
    assert torch.equal(L1(1.0)(v, 0.5), torch.tensor([2.5, 0.0, 0.0, -3.5], dtype=torch.float64))
    assert torch.allclose(L2(2.0)(v, 0.5), v / 2)
    assert float(torch.linalg.vector_norm(L2Ball(1.0)(v, 9.0))) == pytest.approx(1.0)
    assert L2Ball(1.0).value(v) == math.inf and L2(2.0).strong_convexity == 2.0
    assert isinstance(make_prox("l1", 0.1), L1) and isinstance(make_prox("none"), NoProx)
    for args, word in (
        (("l3", 1.0), "unknown prox"),
        (("l1",), "needs a value"),
        (("l2", -1.0), "lam"),
    ):
        with pytest.raises(ValueError, match=word):
            make_prox(*args)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="eta"):
        NoProx()(v, 0.0)


# -- problems --------------------------------------------------------------------------------


def autograd_grad(loss_of: object, x: torch.Tensor) -> torch.Tensor:
    x = x.clone().requires_grad_(True)
    loss = loss_of(x)  # type: ignore[operator]
    loss.backward()
    assert x.grad is not None
    return x.grad


def test_linear_models_match_autograd() -> None:
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(30, 7, generator=gen, dtype=torch.float64)
    x = torch.randn(7, generator=gen, dtype=torch.float64)
    x_ref = torch.randn(7, generator=gen, dtype=torch.float64)
    idx = torch.tensor([3, 3, 0, 29, 11])
    targets = torch.randn(30, generator=gen, dtype=torch.float64)
    labels = torch.where(targets > 0, 1.0, -1.0).to(torch.float64)
    for problem, per_sample in (
        (LeastSquares(a, targets), lambda z, i: (a[i] @ z - targets[i]).pow(2) / 2),
        (Logistic(a, labels), lambda z, i: torch.nn.functional.softplus(-labels[i] * (a[i] @ z))),
    ):
        batch = autograd_grad(lambda z: per_sample(z, idx).sum(), x)  # noqa: B023
        assert torch.allclose(problem.grad_sum(x, idx), batch)
        full = autograd_grad(lambda z: per_sample(z, torch.arange(30)).mean(), x)  # noqa: B023
        assert torch.allclose(problem.full_grad(x), full)
        assert torch.allclose(
            problem.grad_range(x, 5, 12), problem.grad_sum(x, torch.arange(5, 12))
        )
        diff = (problem.grad_sum(x, idx) - problem.grad_sum(x_ref, idx)) / 5
        assert torch.allclose(problem.grad_diff_mean(x, x_ref, idx), diff)
        assert problem.loss(x) == pytest.approx(float(per_sample(x, torch.arange(30)).mean()))
    # L_i bounds every f_i's curvature: ||a_i||^2 (least squares), ||a_i||^2 / 4 (logistic)
    norms = a.pow(2).sum(1)
    assert LeastSquares(a, targets).smoothness() == pytest.approx(float(norms.max()))
    assert Logistic(a, labels).smoothness() == pytest.approx(float(norms.max()) / 4)


def test_logistic_with_l2_reaches_the_regularized_optimum() -> None:
    """Logistic regression + (0.05/2)||x||^2: 4-bit LPC-SVRG reaches the optimum of 500
    full proximal-gradient steps to 1e-8 in 6 epochs (from a gap of 0.3)."""
    gen = torch.Generator().manual_seed(11)
    a = torch.randn(300, 10, generator=gen, dtype=torch.float64)
    w = torch.randn(10, generator=gen, dtype=torch.float64)
    noise = 0.5 * torch.randn(300, generator=gen, dtype=torch.float64)
    labels = torch.where(a @ w + noise > 0, 1.0, -1.0).to(torch.float64)
    problem, prox = Logistic(a, labels), L2(0.05)
    x = problem.zeros()
    for _ in range(500):
        x = prox(x - 2.0 * problem.full_grad(x), 2.0)
    best = problem.loss(x) + prox.value(x)
    config = LPCSVRGConfig(epochs=6, lr=1.0, batch=8, b=4, run_seed=1)
    res = run_local(2, lambda t: lpc_svrg(t, problem, config, prox))[0]
    gaps = [v - best for v in res.trace.losses if v is not None]
    assert gaps[0] > 0.1 and gaps[-1] < 1e-8


def test_problem_validation() -> None:
    a, y = torch.randn(5, 3), torch.randn(5)
    bad = a.clone()
    bad[1, 1] = math.nan
    for args, word in (
        ((bad, y), "NaN"),
        ((a, torch.randn(4)), "vector of 5"),
        ((a.double(), y), "float32 or float64"),
        ((torch.randn(5), y), "n x d"),
    ):
        with pytest.raises(ValueError, match=word):
            LeastSquares(*args)
    with pytest.raises(ValueError, match="-1 or \\+1"):
        Logistic(a, torch.ones(5).mul_(2))
    with pytest.raises(ValueError, match="vector of 3"):
        LeastSquares(a, y).check_point(torch.zeros(4))


def test_large_d_least_squares_uses_conjugate_gradients() -> None:
    """Above DENSE_LIMIT the optimum and the Hessian's extremes come from CG / Lanczos: the
    same loss as the dense normal equations to 1e-12 (relative); the Ritz values approach the
    extreme eigenvalues from inside the spectrum (lambda_max within 0.1%, lambda_min within
    1%); and L_i = ||a_i||^2 computed block by block."""
    problem, _ = synthetic_regression(3000, 300, seed=1)

    class Large(LeastSquares):
        DENSE_LIMIT = 10

    large = Large(problem.A, problem.y)
    lo, hi = problem.hessian_extremes()
    lo_cg, hi_cg = large.hessian_extremes()
    assert large.min_loss() == pytest.approx(problem.min_loss(), rel=1e-12)
    assert (1 - 1e-3) * hi <= hi_cg <= hi * (1 + 1e-12)
    assert lo * (1 - 1e-12) <= lo_cg <= 1.01 * lo
    norms = problem.A.pow(2).sum(1)
    assert torch.allclose(large.row_norms_squared(), norms, rtol=1e-12)
    wide = Large(problem.A[:200], problem.y[:200])  # n < d: not strongly convex, F* = 0
    assert wide.strong_convexity() == 0.0 and wide.min_loss() == 0.0


def mlp_problem() -> ModuleProblem:
    gen = torch.Generator().manual_seed(2)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    inputs = torch.randn(120, 4, generator=gen)
    labels = (inputs[:, 0] > 0).long() + (inputs[:, 1] > 0.5).long()
    return ModuleProblem(
        net,
        inputs,
        labels,
        lambda o, t: torch.nn.functional.cross_entropy(o, t, reduction="none"),
        chunk=50,
    )


def test_module_problem_matches_autograd_and_trains() -> None:
    problem = mlp_problem()
    x0 = problem.initial_point()
    assert problem.dim == 4 * 8 + 8 + 8 * 3 + 3 and x0.numel() == problem.dim
    net = problem.module
    net.zero_grad()
    losses = torch.nn.functional.cross_entropy(
        net(problem.inputs), problem.targets, reduction="sum"
    )
    losses.backward()
    expected = torch.cat([p.grad.reshape(-1) for p in net.parameters() if p.grad is not None])
    assert torch.allclose(problem.grad_range(x0, 0, problem.n), expected, atol=1e-5)
    assert problem.loss_sum(x0, 0, problem.n) == pytest.approx(float(losses.detach()), rel=1e-5)
    # the nonconvex case: LPC-SVRG with 4-bit messages lowers the loss (1.62 -> 0.29) and the
    # gradient at the uniformly drawn output iterate (0.99 -> 0.24)
    config = LPCSVRGConfig(epochs=6, lr=1.0, batch=10, b=4, output="random", run_seed=1)
    res = run_local(2, lambda t: lpc_svrg(t, problem, config, x0=x0))
    assert torch.equal(res[0].x, res[1].x)
    final = res[0].trace.losses[-1]
    assert final is not None and final < 0.3 * problem.loss(x0)
    assert float(problem.full_grad(res[0].x).norm()) < 0.5 * float(problem.full_grad(x0).norm())


def test_module_problem_refuses_random_layers() -> None:
    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5))
    with pytest.raises(ValueError, match=r"module\.eval"):
        ModuleProblem(net, torch.zeros(3, 2), torch.zeros(3), lambda o, t: o.sum(1))
    net.eval()
    problem = ModuleProblem(net, torch.zeros(3, 2), torch.zeros(3), lambda o, t: o.sum())
    with pytest.raises(ValueError, match="one loss per sample"):
        problem.loss(problem.initial_point())


# -- sampling --------------------------------------------------------------------------------


def test_batches_are_keyed_uniform_and_shared_where_they_must_be() -> None:
    a = local_batch(7, 0, 3, 50, 20)
    assert torch.equal(a, local_batch(7, 0, 3, 50, 20))  # stateless: the same key, the same batch
    for other in (
        local_batch(7, 1, 3, 50, 20),
        local_batch(7, 0, 4, 50, 20),
        local_batch(8, 0, 3, 50, 20),
    ):
        assert not torch.equal(a, other)
    shared = shared_batch(7, 3, 50, 20)
    assert torch.equal(shared, shared_batch(7, 3, 50, 20)) and not torch.equal(shared, a)
    assert not torch.equal(shared, shared_batch(7, 4, 50, 20))
    assert 0 <= shared_choice(7, 10) < 10
    # uniform: chi-square over 10 cells of 20,000 draws (mean 9, sd sqrt(18); bound at +6 sd)
    draws = torch.cat([local_batch(1, r, s, 10, 1000) for r in range(4) for s in range(5)])
    counts = torch.bincount(draws, minlength=10).double()
    chi2 = float(((counts - 2000) ** 2 / 2000).sum())
    assert chi2 < 9 + 6 * math.sqrt(18)
    with pytest.raises(ValueError):
        local_batch(1, 0, 0, 0, 5)


# -- data ------------------------------------------------------------------------------------


def test_synthetic_data() -> None:
    problem, x_star = synthetic_regression(3000, 20, seed=4)
    again, _ = synthetic_regression(3000, 20, seed=4)
    assert torch.equal(problem.A, again.A) and torch.equal(problem.y, again.y)
    noise = problem.y - problem.A @ x_star
    # y = A x* + N(0, 1): the noise variance is 1 (sd of the sample variance: sqrt(2/n))
    assert abs(float(noise.var()) - 1.0) < 4 * math.sqrt(2 / 3000)
    assert abs(float(problem.A.var()) - 1.0) < 4 * math.sqrt(2 / 60000)
    small, _ = make_synthetic("syn-512", n=50, dtype=torch.float32)
    assert (small.n, small.dim, small.dtype) == (50, 512, torch.float32)
    with pytest.raises(ValueError, match="syn-512"):
        make_synthetic("syn-7")


# -- the inner message's statistics (spec 3.2 / 3.7) -------------------------------------------

P, D, TRIALS = 3, 200, 250


def worker_vector(rank: int) -> torch.Tensor:
    return torch.randn(D, generator=torch.Generator().manual_seed(10 + rank), dtype=torch.float64)


def messages(scheme: str, theta: float, b: int = 3) -> torch.Tensor:
    """TRIALS averaged messages of the fixed worker vectors (rounds 0..TRIALS-1), rank 0."""

    def fn(t: Transport) -> torch.Tensor:
        channel = Channel(t, make_inner_scheme(scheme, b, theta, run_seed=5))
        u = worker_vector(t.rank)
        return torch.stack([channel.average(u, step) for step in range(TRIALS)])

    return run_local(P, fn)[0]


def exact_moments(theta: float, s: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per coordinate, for scheme (a): the mean of the averaged message and its variance
    (Lemma 3's ``(v - a)(a + delta - v)`` per worker, over ``M^2``; clipped coordinates are
    deterministic)."""
    mean, var = torch.zeros(D, dtype=torch.float64), torch.zeros(D, dtype=torch.float64)
    for r in range(P):
        u = worker_vector(r)
        delta = float(torch.tensor(theta * float(u.abs().max()) / s, dtype=torch.float32))
        v = (u.abs() / delta).clamp(max=s)  # clipped coordinates land on s deterministically
        p = v - v.floor()
        mean += torch.sign(u) * v * delta / P
        var += p * (1 - p) * delta**2 / P**2
    return mean, var


@pytest.mark.parametrize("theta", [1.0, 0.4])
def test_scheme_a_message_moments(theta: float) -> None:
    """theta = 1: the averaged message is unbiased (Lemma 3 variance per worker, divided by
    M^2); theta < 1: biased by exactly the clipping, and E||u_tilde - u_bar||^2 stays within the
    Lemma 4 / Lemma 6 bound (1/M) sum_alpha zeta_alpha ||u_alpha||_inf^2 with kc counted."""
    s = 3
    out = messages("a", theta)
    mean, var = exact_moments(theta, s)
    z = (out.mean(0) - mean) / (var / TRIALS).sqrt().clamp_min(1e-300)
    live = var > 0
    assert float(z[live].abs().max()) < 5.0
    truth = sum(worker_vector(r) for r in range(P)) / P
    mse = (out - truth).pow(2).sum(1)
    exact = float((mean - truth).pow(2).sum() + var.sum())
    # the squared error's standard error from its own spread (the rounds are independent)
    assert abs(float(mse.mean()) - exact) < 5 * float(mse.std()) / math.sqrt(TRIALS)
    if theta == 1.0:
        assert torch.allclose(mean, truth, atol=1e-6)
    bound = 0.0
    for r in range(P):
        u = worker_vector(r)
        amax = float(u.abs().max())
        kc = int((u.abs() > theta * amax).sum())
        assert (kc == 0) if theta == 1.0 else (kc > 1)
        bound += ((D - kc) * theta**2 / (4 * s**2) + kc * (1 - theta) ** 2) * amax**2 / P
    assert exact <= bound


def test_scheme_c_is_unbiased_given_the_worker_codes() -> None:
    """On-grid worker vectors make the worker codes deterministic; the server's re-quantized
    mean is then unbiased over its own rounding, and lands on the common grid."""
    s, step = 3, 0.25

    def on_grid(rank: int) -> torch.Tensor:
        levels = torch.randint(-s, s + 1, (D,), generator=torch.Generator().manual_seed(rank))
        levels[0] = s  # every worker's ||u||_inf is s * step: the common delta is step
        return levels.double() * step

    def fn(t: Transport) -> torch.Tensor:
        channel = Channel(t, make_inner_scheme("c", 3, 1.0, run_seed=2))
        return torch.stack([channel.average(on_grid(t.rank), k) for k in range(TRIALS)])

    out = run_local(P, fn)[0]
    truth = sum(on_grid(r) for r in range(P)) / P
    levels = out / step
    assert torch.equal(levels, levels.round())
    frac = truth / step - (truth / step).floor()
    sd = (frac * (1 - frac)).sqrt() * step / math.sqrt(TRIALS)
    live = sd > 0
    assert float(((out.mean(0) - truth)[live] / sd[live]).abs().max()) < 5.0
    assert torch.equal(out.mean(0)[~live], truth[~live])


# -- baselines -------------------------------------------------------------------------------


def test_sgd_baselines() -> None:
    problem, _ = synthetic_regression(300, 30, seed=8)
    config = SGDConfig(
        steps=20, lr=0.05, lr_decay=0.1, batch=4, method="sgd", run_seed=3, record_every=5
    )
    res = run_local(2, lambda t: quantized_sgd(t, problem, config, prox=L2(0.1)))
    # the reference: mini-batch prox-SGD with lr / (1 + 0.1 t) in float64, the same batches
    x = problem.zeros()
    for t in range(20):
        g = sum(problem.grad_sum(x, local_batch(3, r, t, 300, 4)) / 4 for r in range(2)) / 2
        lr = 0.05 / (1 + 0.1 * t)
        x = L2(0.1)(x - lr * g, lr)
    assert float((res[0].x - x).abs().max() / x.abs().max()) < 1e-5
    assert res[0].trace.steps == [0, 5, 10, 15, 20]
    # measured bits per round: 2 ranks x 1 payload each (plus its 8-byte length prefix), the
    # payload of the method's codec: fp32 32 bits a coordinate, QSGD with 7 levels 4 bits and a
    # float32 scale, ECQ-SGD the same as QSGD
    for method, codec in (
        ("sgd", Identity()),
        ("qsgd", QSGD(s=7, bucket_size=None)),
        ("ecq-sgd", QSGD(s=7, bucket_size=None)),
    ):
        c = SGDConfig(steps=4, lr=0.05, batch=4, method=method, levels=7)
        out = run_local(2, lambda t, c=c: quantized_sgd(t, problem, c))
        assert torch.equal(out[0].x, out[1].x)
        payload = codec.encode(torch.randn(30), StreamKey()).payload
        assert sum(r.bits for r in out) == 4 * 2 * 8 * (len(payload) + LENGTH_PREFIX_BYTES)
        assert codec.expected_body_bits(torch.zeros(30)) == (
            32 * 30 if method == "sgd" else 32 + 4 * 30
        )


#: where the two threads of the test below meet, inside the forward pass (a module attribute
#: would be deep-copied with the module, and a lock cannot be)
_MEET = threading.Barrier(2)


class _MeetInForward(torch.nn.Module):
    """``y = w * x`` whose forward waits until two threads are inside it at once."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _MEET.wait(timeout=30)
        return self.w * x


def test_module_problem_evaluated_from_two_threads_at_once_uses_each_threads_parameters() -> None:
    """Simulated ranks share one problem: ``functional_call`` swaps parameters into the module,
    so without a module per thread one thread's gradient could come out at the other's point
    (it did in about half of the tries); each thread must evaluate a module of its own."""
    problem = ModuleProblem(
        _MeetInForward(), torch.ones(1, 1), torch.zeros(1), lambda o, t: (o[:, 0] - t) ** 2 / 2
    )
    points = {0: torch.tensor([2.0]), 1: torch.tensor([5.0])}
    for _ in range(10):
        grads: dict[int, torch.Tensor] = {}
        evaluated: dict[int, torch.nn.Module] = {}

        def rank(r: int, grads: dict, evaluated: dict) -> None:  # type: ignore[type-arg]
            evaluated[r] = problem._thread_module()
            grads[r] = problem.grad_range(points[r], 0, 1)  # d/dw (w*1 - 0)^2/2 = w

        threads = [threading.Thread(target=rank, args=(r, grads, evaluated)) for r in points]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert torch.equal(grads[0], points[0]) and torch.equal(grads[1], points[1])
        assert evaluated[0] is not evaluated[1] and problem.module not in evaluated.values()
