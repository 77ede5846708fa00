"""DQGAN's parts (spec 4.1, 4.2, 4.5): delta of the compressors, Lemma 1 and the per-worker
error-feedback identity in real runs, the WGAN operator and the Fréchet distance (the
classifier score and the Gaussian ring's scores, the lab's: tests/lab/reproduce/test_dqgan_setups.py)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import gradzip
from gradzip.algorithms.dqgan import DQGAN, BilinearGame, WGANGame, delta_of, lemma1_bound
from gradzip.algorithms.dqgan.frechet import frechet_distance, gaussian_frechet
from gradzip.algorithms.dqgan.game import sample_generator
from gradzip.comm.local import run_local
from gradzip.comm.transport import Transport
from gradzip.keys import StreamKey
from gradzip_lab.reproduce.dqgan.gaussian_ring import GaussianRing, ring_gan


# -- delta-approximate compressors (spec 4.2) ------------------------------------------------
def test_delta_of_the_compressors() -> None:
    assert delta_of(gradzip.create("identity"), 10) == 1.0
    assert delta_of(gradzip.create("topk", ratio=0.1), 50) == pytest.approx(5 / 50)
    assert delta_of(gradzip.create("topk", k=3), 50) == pytest.approx(3 / 50)
    s = 127
    omega = min(1000 / (4 * s**2), math.sqrt(1000) / s)
    assert delta_of(gradzip.create("hou", scaled=True), 1000) == pytest.approx(1 / (1 + omega))
    assert delta_of(gradzip.create("hou"), 1000) == pytest.approx(1 - omega)  # omega < 1
    assert delta_of(gradzip.create("hou", b=2), 1000) is None  # omega >= 1: no guarantee
    assert delta_of(gradzip.create("onebit"), 10) is None
    with pytest.raises(ValueError, match="d must be >= 1"):
        delta_of(gradzip.create("identity"), 0)


def test_unscaled_hou_delta_holds_in_expectation() -> None:
    """E||Q(x) - x||^2 <= (1 - delta) ||x||^2 with delta = 1 - omega (omega < 1 at b = 8):
    Monte Carlo over 400 keyed encodes; the mean's standard error is far below the margin."""
    hou, d = gradzip.create("hou"), 1000
    delta = delta_of(hou, d)
    assert delta is not None
    x = torch.randn(d, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    errors = torch.tensor(
        [
            float((hou.decode(hou.encode(x, StreamKey(1, 0, t, 0)).payload).double() - x).square().sum())
            for t in range(400)
        ]
    )  # fmt: skip
    bound = (1 - delta) * float(x.square().sum())
    assert float(errors.mean()) + 4 * float(errors.std()) / 20 <= bound


# -- Lemma 1 and the per-worker error-feedback identity (spec 4.5, 0.6) -----------------------
def _residual_run(transport: Transport, name: str, steps: int) -> dict[str, object]:
    """A DQGAN run on a heterogeneous bilinear game: per step this worker's decoded message,
    its residual after the step and its compensated operator step eta*g."""
    game = BilinearGame(40, workers=transport.world_size, heterogeneity=0.5, dtype=torch.float64)
    params = {"ratio": 0.1} if name == "topk" else {}
    compressor = gradzip.create(name, **params)
    alg = DQGAN(game, transport, compressor, lr=0.1, extrapolation="error_corrected")
    sent, residuals, steps_taken = [], [], []
    for _ in range(steps):
        alg.step()
        produced = alg.sync.scheme.produced
        sent.append(
            [compressor.decode(produced[("worker", i, 0)].payload).double() for i in range(2)]
        )
        residuals.append([e.double() for e in alg.residuals()])
        steps_taken.append([0.1 * g.double() for g in alg.last_operator])
    return {"sent": sent, "residuals": residuals, "steps": steps_taken}


@pytest.mark.parametrize("name", ["topk", "hou", "identity"])
def test_error_feedback_telescopes_per_worker(name: str) -> None:
    """sum_t decode(c_t) = sum_t eta g_t + e_0 - e_T on every worker (e_0 = 0)."""
    for run in run_local(3, lambda tr: _residual_run(tr, name, 30)):
        for i in range(2):
            total_sent = sum(step[i] for step in run["sent"])  # type: ignore[attr-defined]
            total_step = sum(step[i] for step in run["steps"])  # type: ignore[attr-defined]
            last = run["residuals"][-1][i]  # type: ignore[index]
            assert torch.allclose(total_sent, total_step - last, rtol=0, atol=1e-9)
            if name == "identity":  # delta = 1: no residual at all
                assert float(last.abs().max()) == 0.0


def test_lemma1_bounds_the_top_k_residual_path_by_path() -> None:
    """Top-k is deterministic, so Lemma 1 holds for the path: ||e_t||^2 <= 4 (1 - delta) /
    delta^2 eta^2 max_s ||g_s||^2 at every step, per tensor. A residual that accumulated
    without being sent (no compensation) would grow past it."""
    delta = 4 / 40
    for run in run_local(2, lambda tr: _residual_run(tr, "topk", 60)):
        for i in range(2):
            worst_g = 0.0
            for step, residual in zip(run["steps"], run["residuals"], strict=True):  # type: ignore[call-overload]
                worst_g = max(worst_g, float((step[i] / 0.1).square().sum()))
                bound = lemma1_bound(delta, 0.1, worst_g)
                assert float(residual[i].square().sum()) <= bound
    assert lemma1_bound(1.0, 0.1, 5.0) == 0.0
    with pytest.raises(ValueError, match="delta"):
        lemma1_bound(0.0, 0.1, 1.0)


# -- the WGAN game (spec 4.1) -----------------------------------------------------------------
def _tiny_wgan(data: torch.Tensor | GaussianRing, clip: float | None = 0.01) -> WGANGame:
    generator, critic = ring_gan(seed=3, noise_dim=4, hidden=8)
    return WGANGame(generator, critic, data, batch_size=16, noise_shape=(4,), clip=clip, seed=2)


def test_wgan_operator_is_descent_for_the_generator_and_ascent_for_the_critic() -> None:
    ring = GaussianRing()
    game = _tiny_wgan(ring)
    f = game.operator(step=5, rank=1)
    # recompute L on the same keyed batch and compare with autograd
    real = ring(sample_generator("wgan-data", 2, 1, 5), 16)
    z = torch.randn((16, 4), generator=sample_generator("wgan-noise", 2, 1, 5))
    loss = game.critic(real).mean() - game.critic(game.generator(z)).mean()
    grads = torch.autograd.grad(loss, game.parameters())
    n_gen = len(list(game.generator.parameters()))
    for i, (fi, gi) in enumerate(zip(f, grads, strict=True)):
        expected = gi if i < n_gen else -gi
        assert torch.allclose(fi, expected, rtol=1e-6, atol=1e-7), i
    assert game.last_loss == pytest.approx(float(loss.detach()))
    # keyed: the same (step, rank) gives the same value, another rank another one
    assert all(torch.equal(a, b) for a, b in zip(f, game.operator(5, 1), strict=True))
    assert not torch.equal(f[0], game.operator(5, 0)[0])


def test_wgan_clipping_projects_the_critic_only() -> None:
    game = _tiny_wgan(torch.randn(100, 2), clip=0.01)
    with torch.no_grad():
        for p in game.parameters():
            p.fill_(1.0)
    game.project()
    critic = set(map(id, game.critic.parameters()))
    for p in game.parameters():
        expected = torch.tensor(0.01 if id(p) in critic else 1.0)  # float32, as the clamp
        assert torch.equal(p.detach().abs().max(), expected)


def test_wgan_gradient_penalty_changes_the_critic_part_only() -> None:
    """WGAN-GP: the generator's part of ``F`` is still ``grad_theta L`` (the generated points
    enter the penalty detached); the critic's is ``-grad_phi (L - lam GP)`` on the keyed
    interpolates."""
    ring = GaussianRing()
    generator, critic = ring_gan(seed=3, noise_dim=4, hidden=8, activation="tanh")
    plain = WGANGame(generator, critic, ring, batch_size=16, noise_shape=(4,), clip=None, seed=2)
    penalised = WGANGame(
        generator, critic, ring, batch_size=16, noise_shape=(4,), clip=None,
        gradient_penalty=0.5, seed=2,
    )  # fmt: skip
    f_plain, f_gp = plain.operator(7, 1), penalised.operator(7, 1)
    n_gen = len(list(generator.parameters()))
    for a, b in zip(f_plain[:n_gen], f_gp[:n_gen], strict=True):
        assert torch.equal(a, b)
    real = ring(sample_generator("wgan-data", 2, 1, 7), 16)
    z = torch.randn((16, 4), generator=sample_generator("wgan-noise", 2, 1, 7))
    u = torch.rand((16, 1), generator=sample_generator("wgan-penalty", 2, 1, 7))
    fake = generator(z)
    points = (u * real + (1 - u) * fake.detach()).requires_grad_(True)
    (grad,) = torch.autograd.grad(critic(points).sum(), points, create_graph=True)
    penalty = (grad.norm(dim=1) - 1).square().mean()
    objective = critic(real).mean() - critic(fake).mean() - 0.5 * penalty
    expected = torch.autograd.grad(objective, list(critic.parameters()))
    for got, want in zip(f_gp[n_gen:], expected, strict=True):
        assert torch.allclose(got, -want, rtol=1e-5, atol=1e-7)
    assert not torch.allclose(f_plain[n_gen], f_gp[n_gen])
    with pytest.raises(ValueError, match="gradient_penalty"):
        WGANGame(generator, critic, ring, batch_size=2, noise_shape=(4,), gradient_penalty=0.0)


def test_wgan_bad_inputs_are_named() -> None:
    generator, critic = ring_gan(seed=0, noise_dim=4, hidden=8)
    with pytest.raises(ValueError, match="batch_size"):
        WGANGame(generator, critic, torch.randn(5, 2), batch_size=0, noise_shape=(4,))
    with pytest.raises(ValueError, match="clip"):
        WGANGame(generator, critic, torch.randn(5, 2), batch_size=2, noise_shape=(4,), clip=-1)
    with pytest.raises(ValueError, match="no samples"):
        WGANGame(generator, critic, torch.randn(0, 2), batch_size=2, noise_shape=(4,))
    with pytest.raises(ValueError, match="trainable parameters"):
        WGANGame(nn.Identity(), critic, torch.randn(5, 2), batch_size=2, noise_shape=(2,))


def test_wgan_trains_with_dqgan_on_two_ranks_identically() -> None:
    """A user's generator/critic pair through DQGAN (Hou 8-bit, Optimistic Adam): every rank
    holds the same parameters after every step, and the critic stays clipped."""

    def rank(transport: Transport) -> list[bytes]:
        game = _tiny_wgan(GaussianRing())
        alg = DQGAN(game, transport, gradzip.create("hou"), lr=1e-3, optimizer="optimistic_adam")
        out = []
        for _ in range(5):
            alg.step()
            assert all(float(p.detach().abs().max()) <= 0.01 for p in game.critic.parameters())
            out.append(b"".join(p.detach().numpy().tobytes() for p in game.parameters()))
        return out

    a, b = run_local(2, rank)
    assert a == b
    assert len(set(a)) == 5


# -- scores -------------------------------------------------------------------------------------
def test_gaussian_frechet_closed_forms() -> None:
    # commuting (diagonal) covariances: sum (sqrt(a_i) - sqrt(b_i))^2 plus the mean term
    a, b = torch.tensor([1.0, 4.0, 9.0]), torch.tensor([4.0, 4.0, 1.0])
    mu1, mu2 = torch.tensor([0.0, 1.0, 2.0]), torch.tensor([1.0, 1.0, 0.0])
    expected = 1 + 4 + (1 + 0 + 4)
    assert gaussian_frechet(mu1, torch.diag(a), mu2, torch.diag(b)) == pytest.approx(expected)
    # non-commuting 2 x 2: Tr (C1 C2)^(1/2) = sqrt(Tr(C1 C2) + 2 sqrt(det C1 det C2))
    c1 = torch.tensor([[2.0, 0.5], [0.5, 1.0]], dtype=torch.float64)
    c2 = torch.tensor([[1.0, -0.3], [-0.3, 3.0]], dtype=torch.float64)
    cross = math.sqrt(
        float(torch.trace(c1 @ c2)) + 2 * math.sqrt(float(torch.det(c1) * torch.det(c2)))
    )
    expected = float(torch.trace(c1) + torch.trace(c2)) - 2 * cross
    zero = torch.zeros(2)
    assert gaussian_frechet(zero, c1, zero, c2) == pytest.approx(expected, rel=1e-9)
    assert gaussian_frechet(zero, c1, zero, c1) == pytest.approx(0.0, abs=1e-9)


def test_frechet_distance_of_samples() -> None:
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(4000, 3, generator=gen), torch.randn(4000, 3, generator=gen)
    # same distribution: only the estimation noise, O(k / n)
    assert frechet_distance(x, y) < 0.02
    # shifted by 1 in every coordinate: the mean term 3, covariances equal
    assert frechet_distance(x, y + 1) == pytest.approx(3.0, abs=0.1)
    with pytest.raises(ValueError, match="NaN"):
        frechet_distance(x, torch.full((5, 3), float("nan")))
    with pytest.raises(ValueError, match="features"):
        frechet_distance(x, torch.randn(5, 4))
