"""The 2-D Gaussian-mixture GAN of DQGAN's synthetic experiment: modes on a ring, small MLPs,
and the mode-coverage / sample-quality scores (spec 4.6 [SEED: "synthetic datasets"]; the
set-up is this library's [CHOICE], following the usual ring of 8 Gaussians)."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from gradzip.algorithms.dqgan.init import init_uniform_
from gradzip.choices import check_choice, choices_of


class GaussianRing:
    """``modes`` isotropic Gaussians of standard deviation ``std`` centred on a circle of
    ``radius``, equally likely: ``sample(generator, n)`` is a
    :data:`~gradzip.algorithms.dqgan.wgan.Sampler`."""

    def __init__(self, modes: int = 8, radius: float = 2.0, std: float = 0.05) -> None:
        if modes < 1 or radius <= 0 or std <= 0:
            raise ValueError("need modes >= 1, radius > 0 and std > 0")
        angles = torch.arange(modes, dtype=torch.float64) * (2 * math.pi / modes)
        self.centers = (radius * torch.stack((angles.cos(), angles.sin()), 1)).float()
        self.std = std

    def __call__(self, generator: torch.Generator, n: int) -> torch.Tensor:
        return self.sample(generator, n)

    def sample(self, generator: torch.Generator, n: int) -> torch.Tensor:
        index = torch.randint(0, len(self.centers), (n,), generator=generator)
        return self.centers[index] + self.std * torch.randn(n, 2, generator=generator)


@dataclass(frozen=True)
class ModeScore:
    """Sample quality on a :class:`GaussianRing`.

    ``high_quality``: the fraction of samples within ``3 std`` of their nearest centre (real
    data: 98.9%). ``modes_covered``: modes holding at least ``min_share`` of their fair share
    ``n/modes`` of high-quality samples. The usual scores of the ring benchmark (Metz et al.,
    "Unrolled GANs"; Srivastava et al., "VEEGAN").
    """

    modes_covered: int
    high_quality: float
    counts: tuple[int, ...]


def mode_score(samples: torch.Tensor, ring: GaussianRing, min_share: float = 0.25) -> ModeScore:
    """Score ``samples`` (``n x 2``) against ``ring``."""
    if samples.dim() != 2 or samples.shape[1] != 2 or samples.shape[0] == 0:
        raise ValueError(
            f"expected a non-empty n x 2 tensor of samples, got {tuple(samples.shape)}"
        )
    dist = torch.cdist(samples.float(), ring.centers)
    nearest, index = dist.min(1)
    good = nearest <= 3 * ring.std
    counts = torch.bincount(index[good], minlength=len(ring.centers))
    fair = samples.shape[0] / len(ring.centers)
    covered = int((counts >= min_share * fair).sum())
    return ModeScore(covered, float(good.float().mean()), tuple(int(c) for c in counts))


def energy_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """The energy distance ``2 E|X - Y| - E|X - X'| - E|Y - Y'|`` between the samples ``a`` and
    ``b`` (``n x k`` and ``m x k``; Székely & Rizzo 2013), in float64.

    It is 0 exactly when the two distributions are equal and grows continuously as they move
    apart, so it ranks generators that cover no mode yet (a ring of the right radius scores
    better than a blob off the ring), where the mode counts of :func:`mode_score` are all 0.
    The plug-in estimate used here includes the zero diagonals, so it is biased upwards by
    ``O(1/n)``; compare values from the same sample sizes.
    """
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[1] or not len(a) or not len(b):
        raise ValueError(
            f"expected n x k and m x k samples, got {tuple(a.shape)}, {tuple(b.shape)}"
        )
    a, b = a.double(), b.double()
    cross = torch.cdist(a, b).mean()
    return float(2 * cross - torch.cdist(a, a).mean() - torch.cdist(b, b).mean())


#: the hidden units :func:`mlp` and :func:`ring_gan` accept, by name
Activation = Literal["relu", "tanh"]
ACTIVATIONS: dict[Activation, type[nn.Module]] = {"relu": nn.ReLU, "tanh": nn.Tanh}


def mlp(
    sizes: list[int], generator: torch.Generator, activation: Activation = "relu"
) -> nn.Sequential:
    """``Linear`` layers of ``sizes`` with ``activation`` (a name in :data:`ACTIVATIONS`)
    between them, initialised from ``generator``."""
    if len(sizes) < 2:
        raise ValueError("an MLP needs at least input and output sizes")
    check_choice("activation", activation, choices_of(Activation))
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(ACTIVATIONS[activation]())
    model = nn.Sequential(*layers)
    init_uniform_(model, generator)
    return model


def ring_gan(
    seed: int = 0, noise_dim: int = 16, hidden: int = 128, activation: Activation = "relu"
) -> tuple[nn.Sequential, nn.Sequential]:
    """The generator ``R^noise_dim -> R^2`` and critic ``R^2 -> R`` (two hidden layers of
    ``hidden`` units each, ``activation`` between them), initialised from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    return (
        mlp([noise_dim, hidden, hidden, 2], gen, activation),
        mlp([2, hidden, hidden, 1], gen, activation),
    )
