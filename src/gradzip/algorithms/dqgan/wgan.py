"""A user's generator/critic pair as a :class:`~gradzip.algorithms.dqgan.game.Game`: the WGAN
loss with weight clipping (spec 4.1), ready for OMD, DQGAN, CPOAdam and CPOAdam-GQ."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import nn

from gradzip.algorithms.dqgan.game import Game, sample_generator

#: ``sample(generator, n) -> n real samples``: a user's data source
Sampler = Callable[[torch.Generator, int], torch.Tensor]


class WGANGame(Game):
    """``min_theta max_phi L = E_x D_phi(x) - E_z D_phi(G_theta(z))`` on mini-batches.

    ``w = (theta, phi)``: the generator's parameters, then the critic's (those with
    ``requires_grad``, in ``parameters()`` order). The operator on worker ``rank`` at ``step``
    draws ``batch_size`` real samples and ``batch_size`` noise vectors ``z ~ N(0, I)`` of shape
    ``noise_shape`` from ``(seed, rank, step)`` and returns ``(grad_theta L, -grad_phi L)``
    from one backward pass [SEED prose, eq. (3); formulas RECON].

    Lipschitz constraint: WGAN weight clipping ``phi in [-clip, clip]`` after every update
    [RECON, spec 4.1 default ``clip = 0.01``]; ``clip=None`` turns it off (use a critic that is
    Lipschitz by construction then, or a gradient penalty).

    ``gradient_penalty=lam`` adds WGAN-GP's soft constraint (Gulrajani et al. 2017) to the
    critic's objective: the critic maximizes ``L - lam E (||grad_x D(x^)|| - 1)^2`` at points
    ``x^ = u x + (1 - u) G(z)`` with ``u ~ U(0, 1)`` per sample, drawn from the same keyed
    stream. The generated points enter the penalty detached, as in WGAN-GP, so the generator's
    part of the operator is still ``grad_theta L`` and only the critic's changes [CHOICE, off
    by default: weight clipping at 0.01 leaves a small MLP critic too weak to separate the
    modes of a 2-D mixture, docs/reproduction.md].

    ``data`` is a tensor of real samples (first dimension indexes them; each mini-batch draws
    indices uniformly with replacement: i.i.d. samples from the empirical distribution, as the
    seed's "sample a mini-batch according to P_data") or a sampler
    ``sample(generator, n) -> tensor`` for a data source of the user's. Real samples and noise
    are moved to the device of the generator's first parameter.

    The live modules hold the current iterate, so ``generator`` can be used for sampling at any
    time; :meth:`sample` does it without gradients, from a seed.
    """

    def __init__(
        self,
        generator: nn.Module,
        critic: nn.Module,
        data: torch.Tensor | Sampler,
        *,
        batch_size: int,
        noise_shape: Sequence[int],
        clip: float | None = 0.01,
        gradient_penalty: float | None = None,
        seed: int = 0,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if clip is not None and not (math.isfinite(clip) and clip > 0):
            raise ValueError(f"clip must be a finite number > 0 or None, got {clip}")
        if gradient_penalty is not None and not (
            math.isfinite(gradient_penalty) and gradient_penalty > 0
        ):
            raise ValueError(
                f"gradient_penalty must be a finite number > 0 or None, got {gradient_penalty}"
            )
        if isinstance(data, torch.Tensor) and data.shape[0] < 1:
            raise ValueError("the data tensor holds no samples")
        if not isinstance(data, torch.Tensor) and not callable(data):
            raise TypeError("data must be a tensor of samples or a callable sample(gen, n)")
        self.generator, self.critic = generator, critic
        self.data = data
        self.batch_size = batch_size
        self.noise_shape = tuple(int(s) for s in noise_shape)
        self.clip = clip
        self.gradient_penalty = gradient_penalty
        self.seed = seed
        self._gen_params = [p for p in generator.parameters() if p.requires_grad]
        self._critic_params = [p for p in critic.parameters() if p.requires_grad]
        if not self._gen_params or not self._critic_params:
            raise ValueError("the generator and the critic both need trainable parameters")
        #: the value of ``L`` at the last operator evaluation (for logging)
        self.last_loss = float("nan")

    def parameters(self) -> list[torch.Tensor]:
        return [*self._gen_params, *self._critic_params]

    def noise(self, generator: torch.Generator, n: int) -> torch.Tensor:
        """``n`` noise vectors ``z ~ N(0, I)`` on the generator's device."""
        z = torch.randn((n, *self.noise_shape), generator=generator)
        return z.to(self._gen_params[0].device)

    def real_batch(self, generator: torch.Generator, n: int) -> torch.Tensor:
        """``n`` real samples drawn with ``generator``."""
        if isinstance(self.data, torch.Tensor):
            index = torch.randint(0, self.data.shape[0], (n,), generator=generator)
            batch = self.data[index]
        else:
            batch = self.data(generator, n)
        return batch.to(self._gen_params[0].device)

    def operator(self, step: int, rank: int) -> list[torch.Tensor]:
        real = self.real_batch(
            sample_generator("wgan-data", self.seed, rank, step), self.batch_size
        )
        z = self.noise(sample_generator("wgan-noise", self.seed, rank, step), self.batch_size)
        with torch.enable_grad():
            fake = self.generator(z)
            loss = self.critic(real).mean() - self.critic(fake).mean()
            objective = loss
            if self.gradient_penalty is not None:
                mix = sample_generator("wgan-penalty", self.seed, rank, step)
                objective = loss - self.gradient_penalty * self._penalty(real, fake.detach(), mix)
            grads = torch.autograd.grad(objective, self.parameters(), allow_unused=True)
        self.last_loss = float(loss.detach())
        out = [
            torch.zeros_like(p) if g is None else g
            for p, g in zip(self.parameters(), grads, strict=True)
        ]
        n_gen = len(self._gen_params)
        return [g if i < n_gen else -g for i, g in enumerate(out)]

    def _penalty(
        self, real: torch.Tensor, fake: torch.Tensor, generator: torch.Generator
    ) -> torch.Tensor:
        """WGAN-GP's ``E (||grad_x D(x^)|| - 1)^2`` at random points between ``real`` and
        ``fake``, differentiable in the critic's parameters."""
        shape = (real.shape[0],) + (1,) * (real.dim() - 1)
        u = torch.rand(shape, generator=generator).to(real.device)
        points = (u * real + (1 - u) * fake).requires_grad_(True)
        (grad,) = torch.autograd.grad(self.critic(points).sum(), points, create_graph=True)
        norms: torch.Tensor = grad.reshape(grad.shape[0], -1).norm(dim=1)
        return (norms - 1).square().mean()

    def project(self) -> None:
        if self.clip is None:
            return
        with torch.no_grad():
            for p in self._critic_params:
                p.clamp_(-self.clip, self.clip)

    def sample(self, n: int, seed: int = 0) -> torch.Tensor:
        """``n`` generated samples from noise drawn with ``seed`` (no gradients)."""
        z = self.noise(sample_generator("wgan-sample", seed, 0, 0), n)
        with torch.no_grad():
            out: torch.Tensor = self.generator(z)
        return out
