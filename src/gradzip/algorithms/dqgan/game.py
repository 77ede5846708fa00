"""The min-max game interface that OMD, GDA and DQGAN train (spec 4.1).

A game holds the live parameter tensors ``w = (theta, phi)`` (the minimizing player first, then
the maximizing one) and evaluates the operator ``F(w) = (grad_theta L, -grad_phi L)`` at their
current values, on the mini-batch that worker ``rank`` draws at iteration ``step``. A "gradient
step" ``w - eta*F(w)`` is then simultaneous descent for ``theta`` and ascent for ``phi``.
Constraints (WGAN's weight clipping, spec 4.1 [RECON]) are a projection applied in place after
every update, as in the projected OMD of Chiang et al. (the seed's eqs. 14-15).

Mini-batches are a deterministic function of ``(seed, rank, step)`` (:func:`sample_generator`),
so a run gives the same numbers on simulated ranks and on real processes, and a failed step can
be repeated exactly.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch

from gradzip.errors import NonFiniteInputError
from gradzip.rng import text_generator


class Game(ABC):
    """A two-player zero-sum game ``min_theta max_phi L(theta, phi)`` seen through its operator.

    Subclasses implement :meth:`parameters` and :meth:`operator`, and :meth:`project` when the
    game has constraints. The algorithms write the points they evaluate into the live tensors
    (under ``torch.no_grad``) and leave the current iterate ``w_t`` there after every step.
    """

    @abstractmethod
    def parameters(self) -> list[torch.Tensor]:
        """The live tensors of ``w``, always the same objects in the same order."""

    @abstractmethod
    def operator(self, step: int, rank: int) -> list[torch.Tensor]:
        """``F(w; xi)`` at the live parameters on worker ``rank``'s sample for ``step``: one
        tensor per parameter, of its shape (``grad L`` for the minimizer, ``-grad L`` for the
        maximizer)."""

    def project(self) -> None:  # noqa: B027 (a hook with a no-op default, not abstract)
        """Project the live parameters onto the constraint set, in place (default: none)."""


def sample_generator(tag: str, seed: int, rank: int, step: int) -> torch.Generator:
    """A CPU generator for worker ``rank``'s draws ``tag`` (data, noise) at ``step``.

    [CHOICE] The seed is SHA-256 of ``"dqgan:{tag}:{seed}:{rank}:{step}"``: a domain of its own,
    so it never coincides with a compressor's stochastic-rounding stream (:mod:`gradzip.rng`)
    for the same run seed, and the global RNGs are never touched.
    """
    return text_generator(f"dqgan:{tag}:{seed}:{rank}:{step}")


def check_lr(lr: float) -> float:
    """``lr`` as a float; ``ValueError`` unless it is a finite number > 0."""
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr):
        raise ValueError(f"the step size lr must be a finite number > 0, got {lr!r}")
    if lr <= 0:
        raise ValueError(f"the step size lr must be > 0, got {lr}")
    return float(lr)


def checked_parameters(game: Game) -> list[torch.Tensor]:
    """The game's parameters, validated: a non-empty list of floating-point tensors."""
    if not isinstance(game, Game):
        raise TypeError(f"expected a gradzip Game, got {type(game).__name__}")
    params = list(game.parameters())
    if not params:
        raise ValueError("the game has no parameters to train")
    for i, p in enumerate(params):
        if not isinstance(p, torch.Tensor) or not p.dtype.is_floating_point:
            raise ValueError(f"game parameter {i} is not a floating-point tensor")
    return params


def evaluate(
    game: Game, params: Sequence[torch.Tensor], step: int, rank: int, *, finite: bool = True
) -> list[torch.Tensor]:
    """``game.operator(step, rank)``, checked against ``params`` (count, shapes) and, with
    ``finite``, for NaN/Inf (:class:`~gradzip.errors.NonFiniteInputError`); detached copies."""
    values = list(game.operator(step, rank))
    if len(values) != len(params):
        raise ValueError(
            f"the game's operator returned {len(values)} tensors for {len(params)} parameters"
        )
    out = []
    for i, (g, p) in enumerate(zip(values, params, strict=True)):
        if not isinstance(g, torch.Tensor) or g.shape != p.shape:
            shape = tuple(g.shape) if isinstance(g, torch.Tensor) else type(g).__name__
            raise ValueError(
                f"operator value {i} has shape {shape}; parameter {i} has {tuple(p.shape)}"
            )
        if finite and not bool(torch.isfinite(g).all()):
            raise NonFiniteInputError(
                f"step {step}: the operator value of parameter {i} holds NaN or Inf; "
                "nothing was updated"
            )
        out.append(g.detach().to(dtype=p.dtype, device=p.device).clone())
    return out


def copies(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Detached clones."""
    return [t.detach().clone() for t in tensors]


def assign(params: Sequence[torch.Tensor], values: Sequence[torch.Tensor]) -> None:
    """Write ``values`` into the live ``params`` in place."""
    with torch.no_grad():
        for p, v in zip(params, values, strict=True):
            p.copy_(v)
