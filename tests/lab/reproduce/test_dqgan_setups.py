"""The DQGAN experiments' set-ups (the lab's): the classifier score, the Gaussian ring's
mode and energy scores, and its MLPs."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from gradzip_lab.reproduce.dqgan.class_score import classifier_score
from gradzip_lab.reproduce.dqgan.gaussian_ring import (
    GaussianRing,
    energy_distance,
    mode_score,
    ring_gan,
)


def test_classifier_score_bounds() -> None:
    assert classifier_score(torch.zeros(50, 10)) == pytest.approx(1.0)  # no confident class
    confident = torch.full((40, 4), -1e4)
    confident[torch.arange(40), torch.arange(40) % 4] = 1e4
    assert classifier_score(confident) == pytest.approx(4.0)  # sure and evenly spread
    one_mode = torch.full((40, 4), -1e4)
    one_mode[:, 2] = 1e4
    assert classifier_score(one_mode) == pytest.approx(1.0)  # sure but a single class
    with pytest.raises(ValueError, match="logits"):
        classifier_score(torch.zeros(5))


def test_mode_score_on_the_ring() -> None:
    ring = GaussianRing(8, 2.0, 0.05)
    real = mode_score(ring.sample(torch.Generator().manual_seed(1), 4000), ring)
    assert real.modes_covered == 8
    # the fraction of a 2-D Gaussian within 3 std: 1 - exp(-4.5) = 0.9889
    assert real.high_quality == pytest.approx(1 - math.exp(-4.5), abs=4 * math.sqrt(0.011 / 4000))
    collapsed = ring.centers[3].expand(1000, 2)
    score = mode_score(collapsed, ring)
    assert (score.modes_covered, score.high_quality) == (1, 1.0)
    assert mode_score(torch.zeros(100, 2), ring).high_quality == 0.0  # the centre is no mode


def test_mode_score_counts_eight_modes_a_collapse_and_a_smear() -> None:
    """The counts behind the reproduction's table: 8 tight clusters are 8 modes, one cluster is
    1, a cluster below a quarter of its fair share is not counted, and samples smeared evenly
    round the ring are of low quality and cover nothing."""
    ring = GaussianRing(8, 2.0, 0.05)
    gen = torch.Generator().manual_seed(4)
    tight = ring.centers.repeat_interleave(250, 0) + 0.02 * torch.randn(2000, 2, generator=gen)
    score = mode_score(tight, ring)
    assert (score.modes_covered, score.high_quality) == (8, 1.0)
    assert score.counts == (250,) * 8
    collapsed = ring.centers[5] + 0.05 * torch.randn(2000, 2, generator=gen)
    assert mode_score(collapsed, ring).modes_covered == 1
    # 1800 samples: a quarter of the fair share 1800/8 is 56.25; a mode with 50 is not covered
    thin = torch.cat([tight[:1750], ring.centers[7] + torch.zeros(50, 2)])
    assert mode_score(thin, ring).modes_covered == 7
    angles = (torch.arange(2000) + 0.5) * (2 * math.pi / 2000)  # evenly round the ring
    smear = 2 * torch.stack((angles.cos(), angles.sin()), 1)
    smeared = mode_score(smear, ring)
    # the arc within 3 std of the 8 centres is 8 * 2 * asin(0.15 / 4) / pi of the ring: 19%
    assert smeared.high_quality == pytest.approx(8 * 2 * math.asin(0.15 / 4) / math.pi, abs=0.002)
    assert smeared.modes_covered == 0


def test_mlp_activations() -> None:
    generator, critic = ring_gan(seed=0, noise_dim=4, hidden=8, activation="tanh")
    assert [type(m) for m in critic] == [nn.Linear, nn.Tanh, nn.Linear, nn.Tanh, nn.Linear]
    assert isinstance(generator[1], nn.Tanh)
    with pytest.raises(ValueError, match="activation"):
        ring_gan(activation="gelu")


def test_energy_distance() -> None:
    ring = GaussianRing(8, 2.0, 0.05)
    gen = torch.Generator().manual_seed(3)
    real, again = ring.sample(gen, 1500), ring.sample(gen, 1500)
    floor = energy_distance(again, real)
    assert 0 <= floor < 0.01  # the same distribution: only the O(1/n) bias and noise
    blob = 0.5 * torch.randn(1500, 2, generator=gen)
    ring_shaped = 2 * torch.nn.functional.normalize(torch.randn(1500, 2, generator=gen), dim=1)
    # a ring of the right radius is closer to the data than a blob at its centre
    assert floor < energy_distance(ring_shaped, real) < energy_distance(blob, real)
    assert energy_distance(real, real + 1) > 10 * floor
    with pytest.raises(ValueError, match="samples"):
        energy_distance(real, torch.zeros(4, 3))
