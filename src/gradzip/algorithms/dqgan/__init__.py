"""DQGAN: distributed training of min-max games (GANs) with compressed, error-compensated
operator values (seed 003; spec section 4).

* :class:`Game` (:mod:`.game`): ``w = (theta, phi)`` and the operator
  ``F = (grad_theta L, -grad_phi L)``; :class:`BilinearGame`, :class:`WGANGame` (a user's
  generator/critic pair, WGAN loss, weight clipping).
* Single machine: :class:`OptimisticMirrorDescent` (Algorithm 1), :class:`GradientDescentAscent`.
* Distributed: :class:`DQGAN` (Algorithm 2, one object per rank over a Transport), with
  :func:`cpoadam`, :func:`cpoadam_gq` and :func:`make_method` for the experiments' baselines;
  :class:`OptimisticAdam`.
* :func:`delta_of` / :func:`lemma1_bound` (delta-approximate compressors, Lemma 1) and
  :func:`frechet_distance`. The paper's experiment set-ups (the Gaussian ring, the MNIST DCGAN,
  its feature classifier and score) are the lab's, in ``gradzip_lab.reproduce.dqgan``.
"""

from gradzip.algorithms.dqgan.baselines import METHODS, cpoadam, cpoadam_gq, make_method
from gradzip.algorithms.dqgan.bilinear import BilinearGame
from gradzip.algorithms.dqgan.delta import delta_of, lemma1_bound
from gradzip.algorithms.dqgan.dqgan import DQGAN, StepStats
from gradzip.algorithms.dqgan.frechet import frechet_distance, gaussian_frechet
from gradzip.algorithms.dqgan.game import Game, sample_generator
from gradzip.algorithms.dqgan.omd import GradientDescentAscent, OptimisticMirrorDescent
from gradzip.algorithms.dqgan.optimistic_adam import OptimisticAdam
from gradzip.algorithms.dqgan.wgan import WGANGame

__all__ = [
    "DQGAN",
    "METHODS",
    "BilinearGame",
    "Game",
    "GradientDescentAscent",
    "OptimisticAdam",
    "OptimisticMirrorDescent",
    "StepStats",
    "WGANGame",
    "cpoadam",
    "cpoadam_gq",
    "delta_of",
    "frechet_distance",
    "gaussian_frechet",
    "lemma1_bound",
    "make_method",
    "sample_generator",
]
