"""A small DCGAN for 28x28 MNIST (the seed's experiments use DCGAN on CIFAR-10 and CelebA;
spec 4.6 [RECON defaults nz = 100, ngf = ndf = 64], scaled down here for 2 CPU cores)."""

from __future__ import annotations

import torch
from torch import nn

from gradzip.algorithms.dqgan.init import init_normal_


class DCGANGenerator(nn.Module):
    """``z (nz) -> Linear -> 2ngf x 7 x 7 -> ConvT(4, 2, 1) -> ngf x 14 x 14 -> ConvT(4, 2, 1)
    -> 1 x 28 x 28`` with ReLU between and ``tanh`` at the end (images in ``[-1, 1]``).

    [CHOICE] No batch normalisation: its running statistics are per-worker buffers that the
    algorithm does not synchronise, so the workers' generators would no longer be identical
    functions in evaluation mode. Radford et al.'s ``N(0, 0.02)`` initialisation.
    """

    def __init__(self, nz: int = 64, ngf: int = 32, generator: torch.Generator | None = None):
        super().__init__()
        self.nz = nz
        self.net = nn.Sequential(
            nn.Linear(nz, 2 * ngf * 49),
            nn.ReLU(),
            nn.Unflatten(1, (2 * ngf, 7, 7)),
            nn.ConvTranspose2d(2 * ngf, ngf, 4, 2, 1),
            nn.ReLU(),
            nn.ConvTranspose2d(ngf, 1, 4, 2, 1),
            nn.Tanh(),
        )
        init_normal_(self, generator or torch.Generator().manual_seed(0))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(z)
        return out


class DCGANCritic(nn.Module):
    """``1 x 28 x 28 -> Conv(4, 2, 1) -> ndf x 14 x 14 -> Conv(4, 2, 1) -> 2ndf x 7 x 7 ->
    Linear -> 1`` with LeakyReLU(0.2); no sigmoid (a WGAN critic), no batch normalisation."""

    def __init__(self, ndf: int = 32, generator: torch.Generator | None = None):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, ndf, 4, 2, 1),
            nn.LeakyReLU(0.2),
            nn.Conv2d(ndf, 2 * ndf, 4, 2, 1),
            nn.LeakyReLU(0.2),
            nn.Flatten(),
            nn.Linear(2 * ndf * 49, 1),
        )
        init_normal_(self, generator or torch.Generator().manual_seed(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out


def mnist_dcgan(seed: int = 0, nz: int = 64, width: int = 32) -> tuple[DCGANGenerator, DCGANCritic]:
    """The generator and critic, initialised from ``seed`` (the same on every rank)."""
    gen = torch.Generator().manual_seed(seed)
    return DCGANGenerator(nz, width, gen), DCGANCritic(width, gen)
