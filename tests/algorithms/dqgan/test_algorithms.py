"""DQGAN (spec 4.3-4.4): OMD against GDA, the distributed algorithm against OMD, the
error-corrected sequence, identical parameters on every rank, measured bits, failures."""

from __future__ import annotations

import math

import pytest
import torch

import gradzip
from gradzip.algorithms.dqgan import (
    DQGAN,
    BilinearGame,
    GradientDescentAscent,
    OptimisticAdam,
    OptimisticMirrorDescent,
)
from gradzip.algorithms.dqgan.game import Game
from gradzip.comm.local import run_local
from gradzip.comm.transport import LENGTH_PREFIX_BYTES, Transport
from gradzip.errors import GradzipError, NonFiniteInputError

TOPK = {"ratio": 0.1}


def game(transport: Transport | None = None, **kw: object) -> BilinearGame:
    workers = 1 if transport is None else transport.world_size
    options: dict[str, object] = {"d": 20, "workers": workers, "heterogeneity": 0.3, **kw}
    return BilinearGame(**options)  # type: ignore[arg-type]


def params_bytes(g: Game) -> bytes:
    return b"".join(p.detach().numpy().tobytes() for p in g.parameters())


# -- single machine ----------------------------------------------------------------------------
def test_omd_converges_where_gda_diverges_on_the_bilinear_game() -> None:
    """Singular values of A lie in [0.5, 1] and eta = 0.2: OMD's slowest mode contracts by
    about 1 - (eta s_min)^2 / 2 = 0.995 per step (e^-5 over 1000 steps), GDA's every mode grows
    by at least sqrt(1 + (eta s_min)^2) = 1.005 (e^5); the bounds below leave a wide margin."""
    omd_game, gda_game = BilinearGame(30), BilinearGame(30)
    start = omd_game.distance()
    omd, gda = OptimisticMirrorDescent(omd_game, 0.2), GradientDescentAscent(gda_game, 0.2)
    for _ in range(1000):
        omd.step()
        gda.step()
    assert omd_game.distance() < 0.05 * start
    assert gda_game.distance() > 10 * start


def test_omd_extrapolated_points_follow_the_one_line_rule() -> None:
    """Noise-free, unconstrained: w_{t+3/2} = w_{t+1/2} - 2 eta F(w_{t+1/2}) + eta F(w_{t-1/2})
    (the seed's eq. 18)."""
    g, eta = BilinearGame(8, dtype=torch.float64), 0.1
    omd = OptimisticMirrorDescent(g, eta)
    halves, values = [], []
    for _ in range(6):
        halves.append(torch.cat([w - s for w, s in zip(omd.w, omd.prev, strict=True)]))
        values.append(torch.cat(omd.step()))
    for t in range(1, 5):
        predicted = halves[t] - 2 * eta * values[t] + eta * values[t - 1]
        assert torch.allclose(halves[t + 1], predicted, rtol=0, atol=1e-12)


def test_omd_state_dict_resumes_bit_for_bit() -> None:
    a, b = BilinearGame(10), BilinearGame(10)
    oa, ob = OptimisticMirrorDescent(a, 0.1), OptimisticMirrorDescent(b, 0.1)
    for _ in range(3):
        oa.step()
    ob.load_state_dict(oa.state_dict())
    for _ in range(3):
        oa.step()
        ob.step()
    assert params_bytes(a) == params_bytes(b)


# -- DQGAN against OMD --------------------------------------------------------------------------
def test_dqgan_with_identity_and_one_worker_is_omd_bit_for_bit() -> None:
    def rank(transport: Transport) -> bytes:
        g = BilinearGame(15)
        alg = DQGAN(g, transport, gradzip.create("identity"), lr=0.15)
        for _ in range(25):
            alg.step()
        return params_bytes(g)

    reference = BilinearGame(15)
    omd = OptimisticMirrorDescent(reference, 0.15)
    for _ in range(25):
        omd.step()
    assert run_local(1, rank)[0] == params_bytes(reference)


def _trajectory(
    transport: Transport, compressor: str, extrapolation: str, steps: int
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per step: (w_t, e^m_t, g^m_t) of this rank, float64."""
    g = game(transport, dtype=torch.float64)
    params = {"ratio": 0.1} if compressor == "topk" else {}
    alg = DQGAN(
        g, transport, gradzip.create(compressor, **params), lr=0.1, extrapolation=extrapolation
    )
    out = []
    for _ in range(steps):
        w, e = torch.cat(alg.w), torch.cat(alg.residuals())
        alg.step()
        out.append((w, e, torch.cat(alg.last_operator)))
    return out


@pytest.mark.parametrize("compressor", ["topk", "hou"])
@pytest.mark.parametrize("extrapolation", ["compressed", "error_corrected"])
def test_error_corrected_sequence_takes_exact_parallel_omd_steps(
    compressor: str, extrapolation: str
) -> None:
    """w~_t = w_t - mean_m e^m_t satisfies w~_{t+1} = w~_t - eta mean_m g^m_t (eqs. 47-48)."""
    runs = run_local(3, lambda tr: _trajectory(tr, compressor, extrapolation, 12))
    eta = 0.1
    for t in range(11):
        w_t, w_next = runs[0][t][0], runs[0][t + 1][0]
        e_t = sum(r[t][1] for r in runs) / 3
        e_next = sum(r[t + 1][1] for r in runs) / 3
        g_t = sum(r[t][2] for r in runs) / 3
        assert float((e_next - e_t).abs().max()) > 0 or compressor == "hou"
        assert torch.allclose(w_next - e_next, w_t - e_t - eta * g_t, rtol=0, atol=1e-9)


def test_error_corrected_extrapolation_is_omd_on_the_corrected_iterate() -> None:
    """One worker, top-k with EF: g_t = F(w~_t - eta g_{t-1}), exactly OMD run on w~."""
    traj = run_local(1, lambda tr: _trajectory(tr, "topk", "error_corrected", 15))[0]
    reference = game(None, dtype=torch.float64)
    omd = OptimisticMirrorDescent(reference, 0.1)
    for t, (w, e, g) in enumerate(traj):
        assert torch.allclose(w - e, torch.cat(omd.w), rtol=0, atol=1e-10), t
        assert torch.allclose(g, torch.cat(omd.step()), rtol=0, atol=1e-10), t
    # the iterate itself is not OMD's: top-k leaves a residual
    assert float(traj[-1][1].abs().max()) > 1e-3


def _distance_after(transport: Transport, compressor: str, steps: int, **options: object) -> float:
    g = game(transport)
    params = {"ratio": 0.1} if compressor == "topk" else {}
    alg = DQGAN(g, transport, gradzip.create(compressor, **params), lr=0.25, **options)  # type: ignore[arg-type]
    for _ in range(steps):
        alg.step()
    return g.distance() / game(transport).distance()


def test_bilinear_convergence_depends_on_the_error_compensation() -> None:
    """Noise-free bilinear game, 2 heterogeneous workers, top-k with k = d/10, 150 steps:
    OMD-rate convergence with the error-corrected extrapolation; divergence with the spec's
    default extrapolation (our measured finding, see the class docstring); Hou 8-bit with EF
    converges like OMD. A wrong residual, sign or extrapolation breaks these orders of
    magnitude."""
    steps = 150
    corrected = run_local(
        2, lambda tr: _distance_after(tr, "topk", steps, extrapolation="error_corrected")
    )[0]
    default = run_local(2, lambda tr: _distance_after(tr, "topk", steps))[0]
    hou = run_local(2, lambda tr: _distance_after(tr, "hou", steps))[0]
    exact = run_local(2, lambda tr: _distance_after(tr, "identity", steps))[0]
    no_ef = run_local(2, lambda tr: _distance_after(tr, "topk", steps, error_feedback=False))[0]
    # measured: exact 0.183, Hou 0.183, corrected 0.107, default 345, no EF 0.65
    assert exact < 0.25
    assert abs(hou / exact - 1) < 0.01
    assert corrected < exact
    assert default > 10
    assert no_ef > 2.5 * exact  # top-k without EF: far behind OMD


# -- every rank the same, bits measured ----------------------------------------------------------
@pytest.mark.parametrize(
    ("optimizer", "server_ef"), [("omd", False), ("omd", True), ("optimistic_adam", False)]
)
def test_parameters_are_bitwise_equal_on_every_rank_after_every_step(
    optimizer: str, server_ef: bool
) -> None:
    def rank(transport: Transport) -> list[bytes]:
        g = game(transport)
        alg = DQGAN(
            g,
            transport,
            gradzip.create("hou", b=4),
            lr=0.05,
            optimizer=optimizer,
            server_ef=server_ef,
            run_seed=3,
        )
        out = []
        for _ in range(8):
            alg.step()
            out.append(params_bytes(g))
        return out

    runs = run_local(3, rank)
    assert runs[0] == runs[1] == runs[2]
    assert len(set(runs[0])) == 8  # and they do move


def test_step_stats_are_the_measured_payloads_and_transport_bytes() -> None:
    def rank(transport: Transport) -> tuple[int, float, int, int, list[int]]:
        g = game(transport)
        alg = DQGAN(g, transport, gradzip.create("topk", **TOPK), lr=0.1)
        stats = alg.step()
        assert stats is not None
        produced = alg.sync.scheme.produced
        sizes = [len(produced[("worker", i, 0)].payload) for i in range(2)]
        return stats.wire_bits, stats.paper_bits, stats.sent_bytes, stats.received_bytes, sizes

    p = 3
    runs = run_local(p, rank)
    d, k = 20, 2
    flags = (p - 1) * (1 + LENGTH_PREFIX_BYTES)  # the finiteness flags, all-gathered on a ring
    for wire, paper, _sent, _received, sizes in runs:
        assert wire == 8 * sum(sizes)
        assert paper == 2 * k * (32 + math.ceil(math.log2(d)))
    # a worker that is not the server sends its two payloads and receives two fp32 downlinks
    wire, _, sent, received, sizes = runs[1]
    assert sent == flags + sum(s + LENGTH_PREFIX_BYTES for s in sizes)
    downlink = received - flags - 2 * LENGTH_PREFIX_BYTES
    assert downlink > 2 * 4 * d  # two float32 vectors of d entries, plus headers
    assert downlink < 2 * 4 * d + 200


# -- failures ------------------------------------------------------------------------------------
class _NaNAt(BilinearGame):
    """A bilinear game whose operator is NaN on one rank at one step."""

    def __init__(self, bad_rank: int, bad_step: int, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.bad = (bad_rank, bad_step)

    def operator(self, step: int, rank: int) -> list[torch.Tensor]:
        out = super().operator(step, rank)
        if (rank, step) == self.bad:
            out[0] = out[0].clone()
            out[0][0] = float("nan")
        return out


def test_a_non_finite_operator_raises_on_every_rank_and_changes_nothing() -> None:
    def rank(transport: Transport) -> tuple[str, bool]:
        g = _NaNAt(1, 2, d=10, workers=transport.world_size, heterogeneity=0.3)
        alg = DQGAN(g, transport, gradzip.create("topk", **TOPK), lr=0.1)
        for _ in range(2):
            alg.step()
        before = alg.state_dict()
        live = params_bytes(g)
        with pytest.raises(NonFiniteInputError, match=r"rank\(s\) \[1\]"):
            alg.step()
        after = alg.state_dict()
        same = params_bytes(g) == live and alg.step_count == 2
        same &= all(
            torch.equal(x, y)
            for name in ("w", "prev", "e_prev")
            for x, y in zip(before[name], after[name], strict=True)
        )
        same &= all(
            torch.equal(x, y)
            for x, y in zip(
                alg.residuals(),
                before["sync"]["scheme"]["feedback"]["worker"]["residual"],
                strict=True,
            )
        )
        return "ok", same

    assert run_local(3, rank) == [("ok", True)] * 3


def test_skip_mode_skips_on_every_rank() -> None:
    def rank(transport: Transport) -> tuple[bool, int]:
        g = _NaNAt(0, 1, d=10, workers=transport.world_size)
        alg = DQGAN(g, transport, gradzip.create("identity"), lr=0.1, on_nonfinite="skip")
        alg.step()
        return alg.step() is None, alg.step_count

    assert run_local(2, rank) == [(True, 1), (True, 1)]


def test_ranks_that_start_from_different_parameters_are_refused() -> None:
    def rank(transport: Transport) -> None:
        g = BilinearGame(5, workers=2, seed=transport.rank)
        DQGAN(g, transport, gradzip.create("identity"), lr=0.1)

    with pytest.raises(GradzipError, match="start from other parameters"):
        run_local(2, rank)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"lr": 0.0}, "lr must be > 0"),
        ({"lr": float("nan")}, "finite number"),
        ({"lr": 0.1, "optimizer": "adam"}, "optimizer must be one of"),
        ({"lr": 0.1, "extrapolation": "both"}, "extrapolation must be one of"),
        (
            {"lr": 0.1, "optimizer": "optimistic_adam", "extrapolation": "error_corrected"},
            "applies to",
        ),
        ({"lr": 0.1, "server_ef": True, "error_feedback": False}, "needs error_feedback"),
        ({"lr": 0.1, "server": 5}, "server rank 5"),
        ({"lr": 0.1, "on_nonfinite": "ignore"}, "on_nonfinite"),
    ],
)
def test_bad_options_are_named(options: dict[str, object], message: str) -> None:
    def rank(transport: Transport) -> None:
        DQGAN(BilinearGame(4), transport, gradzip.create("identity"), **options)  # type: ignore[arg-type]

    with pytest.raises(GradzipError, match=message) as info:
        run_local(1, rank)
    assert isinstance(info.value.__cause__, ValueError)


def test_an_operator_of_the_wrong_shape_is_named() -> None:
    class Bad(BilinearGame):
        def operator(self, step: int, rank: int) -> list[torch.Tensor]:
            return [torch.zeros(3), torch.zeros(4)]

    with pytest.raises(ValueError, match="operator value 0 has shape"):
        OptimisticMirrorDescent(Bad(4), 0.1).step()


def test_dqgan_state_dict_resumes_bit_for_bit() -> None:
    def rank(transport: Transport) -> tuple[bytes, bytes]:
        def build() -> tuple[BilinearGame, DQGAN]:
            g = game(transport)
            return g, DQGAN(
                g,
                transport,
                gradzip.create("topk", **TOPK),
                lr=0.1,
                extrapolation="error_corrected",
                server_ef=True,
            )

        g1, a1 = build()
        for _ in range(4):
            a1.step()
        g2, a2 = build()
        a2.load_state_dict(a1.state_dict())
        for _ in range(4):
            a1.step()
            a2.step()
        return params_bytes(g1), params_bytes(g2)

    for one, two in run_local(2, rank):
        assert one == two


# -- Optimistic Adam ------------------------------------------------------------------------------
def test_optimistic_adam_follows_its_formula() -> None:
    w = [torch.tensor([1.0, -2.0], dtype=torch.float64)]
    opt = OptimisticAdam(w, lr=0.01, betas=(0.5, 0.9), eps=1e-8)
    grads = [torch.tensor([0.5, 1.0]), torch.tensor([-1.0, 2.0]), torch.tensor([0.25, 0.0])]
    m = v = d_prev = torch.zeros(2, dtype=torch.float64)
    expected = w[0].clone()
    for t, g in enumerate(grads, 1):
        g = g.double()
        m = 0.5 * m + 0.5 * g
        v = 0.9 * v + 0.1 * g * g
        d = (m / (1 - 0.5**t)) / ((v / (1 - 0.9**t)).sqrt() + 1e-8)
        expected = expected - 2 * 0.01 * d + 0.01 * d_prev
        d_prev = d
        opt.update(w, [g])
        assert torch.allclose(w[0], expected, rtol=0, atol=1e-14)
    with pytest.raises(ValueError, match="shape"):
        opt.update(w, [torch.zeros(3)])
    with pytest.raises(ValueError, match="betas"):
        OptimisticAdam(w, betas=(1.0, 0.9))


def test_optimistic_adam_variant_uses_the_current_iterate_and_no_lr_in_messages() -> None:
    """With the identity compressor the message is F(w_t) itself (no eta, no extrapolation)."""

    def rank(transport: Transport) -> bool:
        g = game(transport)
        alg = DQGAN(g, transport, gradzip.create("identity"), lr=0.01, optimizer="optimistic_adam")
        ok = True
        for t in range(3):
            expected = g.operator(t, transport.rank)
            alg.step()
            ok &= all(torch.equal(a, b) for a, b in zip(alg.last_operator, expected, strict=True))
        return ok

    assert run_local(2, rank) == [True, True]
