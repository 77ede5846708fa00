"""LPC-SVRG (spec 3.4): the fp32 path is Prox-SVRG, quantized runs follow it as b grows, it
converges linearly where SGD stalls, every rank holds the same bits, bits measured per scheme
match the formulas of spec 3.3, and a failed round changes nothing."""

from __future__ import annotations

import hashlib
import itertools
import math
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

from gradzip.algorithms.svrg import (
    L1,
    LPCSVRG,
    L2Ball,
    LPCSVRGConfig,
    NoProx,
    Prox,
    SGDConfig,
    body_bits_per_round,
    lpc_svrg,
    paper_bits_per_round,
    quantized_sgd,
    synthetic_regression,
)
from gradzip.algorithms.svrg.channel import FULL_TENSOR_INDEX
from gradzip.algorithms.svrg.problems import FiniteSum, LeastSquares
from gradzip.algorithms.svrg.sampling import local_batch
from gradzip.comm.local import LocalGroup, LocalTransport, run_local
from gradzip.comm.transport import LENGTH_PREFIX_BYTES, Transport
from gradzip.errors import NonFiniteInputError
from gradzip.payload import parse_payload

PROBLEM, _ = synthetic_regression(400, 40, seed=5)
FSTAR = PROBLEM.min_loss()


def trajectory(config: LPCSVRGConfig, prox: Prox | None = None, P: int = 2) -> list[torch.Tensor]:
    """Rank 0's iterates after every round (and checks every rank holds the same bits)."""

    def fn(t: Transport) -> list[torch.Tensor]:
        xs: list[torch.Tensor] = []
        LPCSVRG(t, PROBLEM, config, prox).run(on_step=lambda a: xs.append(a.point().clone()))
        return xs

    runs = run_local(P, fn)
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other, strict=True))
    return runs[0]


def reference_prox_svrg(
    problem: FiniteSum, config: LPCSVRGConfig, P: int, prox: Prox
) -> list[torch.Tensor]:
    """Mini-batch Prox-SVRG (Reddi et al.) in float64 on one process, written from the spec's
    pseudo-code, with the same keyed mini-batches."""
    assert config.lr is not None and config.inner is not None
    x = problem.zeros()
    x_tilde, xs, step = x.clone(), [], 0
    for _ in range(config.epochs):
        gbar = problem.full_grad(x_tilde)
        for _ in range(config.inner):
            u = sum(
                problem.grad_diff_mean(
                    x, x_tilde, local_batch(config.run_seed, a, step, problem.n, config.batch)
                )
                for a in range(P)
            )
            x = prox(x - config.lr * (gbar + u / P), config.lr)
            xs.append(x)
            step += 1
        x_tilde = x
    return xs


def max_relative_gap(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max() / y.abs().max()) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("prox", [NoProx(), L1(0.05), L2Ball(2.0)], ids=repr)
def test_fp32_run_is_prox_svrg(prox: Prox) -> None:
    """b=None (fp32 messages) equals the float64 reference to 1e-5; a wrong correction (no
    x_tilde term) or a missing prox would be far off."""
    config = LPCSVRGConfig(epochs=3, lr=0.02, inner=15, batch=4, b=None, run_seed=3)
    ours = trajectory(config, prox)
    ref = reference_prox_svrg(PROBLEM, config, 2, prox)
    assert max_relative_gap(ours, ref) < 1e-5


@pytest.mark.parametrize("P", [2, 3])
def test_b24_trajectory_matches_fp32(P: int) -> None:
    """Spec 3.7: with b = 24 every scheme's run matches fp32 Prox-SVRG to 1e-5 (measured:
    below 1e-7). On 3 workers the scheme (b) code sums exceed 2**24 (exact in float64 only)."""
    base = LPCSVRGConfig(epochs=3, lr=0.02, inner=15, batch=4, b=None, run_seed=3)
    fp32 = trajectory(base, P=P)
    for scheme in "abc":
        quantized = trajectory(LPCSVRGConfig(**{**base.__dict__, "b": 24, "scheme": scheme}), P=P)
        assert max_relative_gap(quantized, fp32) < 1e-5
    # and the quantization is really on: 4-bit messages leave the fp32 trajectory
    coarse = trajectory(LPCSVRGConfig(**{**base.__dict__, "b": 4}), P=P)
    assert max_relative_gap(coarse, fp32) > 1e-3


@pytest.mark.parametrize("scheme", ["a", "b", "c"])
def test_quantized_trajectory_approaches_fp32_like_2_to_the_minus_b(scheme: str) -> None:
    """The deviation from the fp32 trajectory is a quantization error ~ delta ~ 2^-(b-1): each
    4 more bits shrink it about 16-fold, from b = 8 to b = 20."""
    base = LPCSVRGConfig(epochs=3, lr=0.02, inner=15, batch=4, b=None, scheme="a", run_seed=3)
    fp32 = trajectory(base)
    gaps = {
        b: max_relative_gap(
            trajectory(LPCSVRGConfig(**{**base.__dict__, "b": b, "scheme": scheme})), fp32
        )
        for b in (8, 12, 16, 20)
    }
    for lo, hi in ((8, 12), (12, 16), (16, 20)):
        assert 4 < gaps[lo] / gaps[hi] < 64, gaps


@pytest.mark.parametrize("scheme", ["a", "b", "c"])
def test_converges_linearly_where_sgd_stalls(scheme: str) -> None:
    """Strongly convex least squares: 3-bit LPC-SVRG shrinks F - F* (14 at x = 0) about
    tenfold per epoch, to below 1e-5 in 7 epochs; mini-batch SGD at the same step and batch
    stalls at its noise floor (about 0.05)."""
    config = LPCSVRGConfig(epochs=7, lr=0.08, batch=8, b=3, scheme=scheme, run_seed=1)
    res = run_local(2, lambda t: lpc_svrg(t, PROBLEM, config))[0]
    gaps = [loss - FSTAR for loss in res.trace.losses if loss is not None]
    assert len(gaps) == 8 and gaps[0] > 10
    assert gaps[-1] < 1e-5
    # linear: every epoch shrinks the gap by a similar factor
    assert all(b < 0.3 * a for a, b in itertools.pairwise(gaps))
    sgd = SGDConfig(steps=res.steps, lr=0.08, batch=8, method="sgd", run_seed=1)
    plain = run_local(2, lambda t: quantized_sgd(t, PROBLEM, sgd))[0]
    assert plain.trace.losses[-1] is not None and plain.trace.losses[-1] - FSTAR > 1e-2


def test_lasso_solution() -> None:
    """With h = lam ||x||_1, LPC-SVRG (4 bits) reaches the lasso optimum of a long float64
    proximal-gradient (ISTA) run: the same objective to 1e-8 and the same zero pattern."""
    prox = L1(0.3)
    x = PROBLEM.zeros()
    step = 1 / PROBLEM.hessian_extremes()[1]
    for _ in range(3000):
        x = prox(x - step * PROBLEM.full_grad(x), step)
    best = PROBLEM.loss(x) + prox.value(x)
    config = LPCSVRGConfig(epochs=10, lr=0.08, batch=8, b=4, run_seed=2)
    res = run_local(2, lambda t: lpc_svrg(t, PROBLEM, config, prox))[0]
    assert PROBLEM.loss(res.x) + prox.value(res.x) - best < 1e-8
    assert int((x == 0).sum()) >= 3
    assert torch.equal(res.x == 0, x == 0)


def test_nonconvex_output_is_the_drawn_iterate() -> None:
    """output="random": x_a is the iterate at the start of a round drawn with shared
    randomness, the same on every rank."""
    config = LPCSVRGConfig(epochs=2, lr=0.02, inner=10, batch=4, b=4, output="random")

    def fn(t: Transport) -> tuple[torch.Tensor, torch.Tensor, int | None]:
        algo = LPCSVRG(t, PROBLEM, config)
        seen = {0: algo.x.clone()}
        res = algo.run(on_step=lambda a: seen.__setitem__(a.step, a.point().clone()))
        assert algo.output_step is not None
        return res.x, seen[algo.output_step], algo.output_step

    (x0, drawn0, k0), (x1, _, k1) = run_local(2, fn)
    assert k0 == k1 and k0 is not None and 0 <= k0 < 20
    assert torch.equal(x0, drawn0) and torch.equal(x0, x1)


# -- bits: measured per scheme, checked against spec 3.3 ---------------------------------------


class Recording(LocalTransport):
    """A simulated rank that keeps a copy of every message it sends."""

    def __init__(self, group: LocalGroup, rank: int) -> None:
        super().__init__(group, rank)
        self.sent: list[bytes] = []

    def _start_send(self, dst: int, data: Any) -> Any:
        self.sent.append(bytes(getattr(data, "payload", data)))  # a flagged-down one too
        return super()._start_send(dst, data)


def run_recorded(P: int, fn: Callable[[Transport], Any]) -> tuple[list[Any], list[Recording]]:
    group = LocalGroup(P, timeout=30)
    ranks = [Recording(group, r) for r in range(P)]
    out: list[Any] = [None] * P
    errors: list[BaseException] = []

    def body(r: int) -> None:
        try:
            out[r] = fn(ranks[r])
        except BaseException as err:
            errors.append(err)
            group.fail()

    threads = [threading.Thread(target=body, args=(r,)) for r in range(P)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return out, ranks


def inner_messages(ranks: list[Recording]) -> list[bytes]:
    """The averaged messages' payloads: not the one-byte finiteness flags, not the full
    gradient (its own tensor index)."""
    keep = []
    for r in ranks:
        for m in r.sent:
            if len(m) > 1 and parse_payload(m)[0].key.tensor_index != FULL_TENSOR_INDEX:
                keep.append(m)
    return keep


@pytest.mark.parametrize(
    ("scheme", "P", "b"), [("a", 3, 4), ("b", 3, 4), ("c", 3, 4), ("b", 4, 3), ("a", 2, 3)]
)
def test_measured_bits_match_the_scheme_formulas(scheme: str, P: int, b: int) -> None:
    d, steps = PROBLEM.dim, 6
    config = LPCSVRGConfig(epochs=2, inner=steps // 2, lr=0.02, batch=4, b=b, scheme=scheme)
    results, ranks = run_recorded(P, lambda t: lpc_svrg(t, PROBLEM, config))
    messages = inner_messages(ranks)
    body = sum(8 * len(parse_payload(m)[1]) for m in messages)
    assert body == steps * body_bits_per_round(scheme, P, d, b)
    paper = paper_bits_per_round(scheme, P, d, b)
    if scheme == "a":  # b*d is a whole number of bytes here: no padding
        assert body == steps * paper
    else:  # the server is a rank: its own messages stay local
        assert body * P == steps * paper * (P - 1)
    # what the run reports is the meter's count: every message with its 8-byte prefix
    assert sum(r.bits for r in results) == sum(8 * (len(m) + LENGTH_PREFIX_BYTES) for m in messages)
    assert sum(r.trace.bits[-1] for r in results) == sum(r.bits for r in results)
    # the full gradient: one fp32 shard sum per rank per epoch, forwarded around the ring
    assert sum(r.full_bits for r in results) > 2 * P * (P - 1) * 32 * d


def test_scheme_b_sums_fit_b_plus_log2_m_bits() -> None:
    """Spec 3.7: the server's integer sums travel at ceil(log2(2sM+1)) <= b + ceil(log2 M)
    bits and their values stay below 2sM + 1."""
    for P, b in ((2, 4), (3, 3), (4, 4)):
        config = LPCSVRGConfig(epochs=1, inner=3, lr=0.02, batch=4, b=b, scheme="b")
        _, ranks = run_recorded(P, lambda t, c=config: lpc_svrg(t, PROBLEM, c))
        server_ints = [m for m in inner_messages(ranks[:1]) if parse_payload(m)[0].codec_id == 40]
        assert len(server_ints) == 3 * (P - 1)
        for m in server_ints:
            width = parse_payload(m)[0].bucket_size
            assert width <= b + math.ceil(math.log2(P))
            assert width == (2 * (2 ** (b - 1) - 1) * P).bit_length()


# -- failures ------------------------------------------------------------------------------------


class NaNAt(LeastSquares):
    """The test problem, but rank 1's mini-batch gradient is NaN in round ``bad_step``."""

    def __init__(self, bad_step: int) -> None:
        super().__init__(PROBLEM.A, PROBLEM.y)
        self.bad_step = bad_step
        self.calls = 0

    def grad_diff_mean(
        self, x: torch.Tensor, x_ref: torch.Tensor, idx: torch.Tensor
    ) -> torch.Tensor:
        out = super().grad_diff_mean(x, x_ref, idx)
        if threading.current_thread().name.endswith("rank1") and self.calls == self.bad_step:
            out[3] = math.nan
        if threading.current_thread().name.endswith("rank1"):
            self.calls += 1
        return out


def digest(*tensors: torch.Tensor | None) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(b"-" if t is None else t.numpy().tobytes())
    return h.hexdigest()


def test_nan_on_one_rank_raises_everywhere_and_changes_nothing() -> None:
    problem = NaNAt(bad_step=4)
    config = LPCSVRGConfig(epochs=2, inner=3, lr=0.02, batch=4, b=4, scheme="b")

    def fn(t: Transport) -> tuple[str, str, str]:
        threading.current_thread().name = f"rank{t.rank}"
        algo = LPCSVRG(t, problem, config)
        for _ in range(4):
            algo.advance()
        before = (
            digest(algo.x, algo.x_tilde, algo.gbar) + f"{algo.step}/{algo.epoch}/{algo.inner_step}"
        )
        with pytest.raises(NonFiniteInputError, match=r"rank\(s\) \[1\]"):
            algo.advance()
        after = (
            digest(algo.x, algo.x_tilde, algo.gbar) + f"{algo.step}/{algo.epoch}/{algo.inner_step}"
        )
        return before, after, str(algo.step)

    for before, after, step in run_local(2, fn):
        assert before == after and step == "4"


def test_bad_settings_are_named() -> None:
    for kwargs, word in (
        ({"b": 1}, "b must"),
        ({"theta": 0.0}, "theta"),
        ({"scheme": "d"}, "scheme"),
        ({"lr": -1.0}, "lr"),
        ({"epochs": 0}, "epochs"),
        ({"output": "best"}, "output"),
        ({"packing": "zip"}, "packing"),
        ({"batch": 0}, "batch"),
    ):
        with pytest.raises(ValueError, match=word):
            LPCSVRGConfig(**kwargs)  # type: ignore[arg-type]
    alone = LocalGroup(1).endpoint(0)
    with pytest.raises(ValueError, match="full precision"):
        LPCSVRG(alone, PROBLEM, LPCSVRGConfig(b=None, scheme="b"))
    with pytest.raises(ValueError, match="b must be an int in"):
        LPCSVRG(alone, PROBLEM, LPCSVRGConfig(b=40))
    with pytest.raises(ValueError, match="vector of 40"):
        LPCSVRG(alone, PROBLEM, LPCSVRGConfig(), x0=torch.zeros(3))
