"""Single-machine solvers of a min-max game: optimistic mirror descent (the seed's Algorithm 1,
spec 4.3) and simultaneous gradient descent-ascent (GDA), the baseline that fails on bilinear
games."""

from __future__ import annotations

from typing import Any

import torch

from gradzip.algorithms.dqgan.game import (
    Game,
    assign,
    check_lr,
    checked_parameters,
    copies,
    evaluate,
)
from gradzip.errors import CheckpointError
from gradzip.feedback import is_count


class OptimisticMirrorDescent:
    """Optimistic mirror descent (OMD), Euclidean and unconstrained up to a projection:

    ``w_{t+1/2} = P(w_t - eta*g_{t-1})``, ``g_t = F(w_{t+1/2}; xi_t)``,
    ``w_{t+1} = P(w_t - eta*g_t)``: one operator evaluation per iteration, reusing the last one
    for the extrapolation [SEED prose, RECON formulas: Chiang et al. 2012, Daskalakis et al.
    2018; the seed's eqs. (14)-(17)]. ``g_{-1} = 0`` [CHOICE: the spec allows ``F(w_0)`` or 0;
    0 makes the distributed algorithm with the identity compressor and one worker equal to this
    one bit for bit]. Without projection and noise the extrapolated points follow the seed's
    one-line rule (18): ``w_{t+3/2} = w_{t+1/2} - 2 eta F(w_{t+1/2}) + eta F(w_{t-1/2})``.

    Guarantees: on a bilinear game ``x^T A y`` with ``A`` full rank it converges linearly to
    the equilibrium for ``eta`` below about ``1/(2||A||)`` (Daskalakis et al., Thm 1), where
    GDA diverges; for monotone Lipschitz operators the averaged iterates converge at
    ``O(1/T)`` (Mertikopoulos et al. 2019).

    ``step(rank)`` evaluates the operator on the sample of worker ``rank`` (0 on one machine).
    A non-finite operator value raises :class:`~gradzip.errors.NonFiniteInputError` and leaves
    the parameters and the state as they were. The live parameters hold ``w_t`` between steps.

    References: the DQGAN seed, Algorithm 1; Chiang et al., "Online optimization with gradual
    variations" (COLT 2012); Daskalakis et al., "Training GANs with optimism" (ICLR 2018).
    """

    def __init__(self, game: Game, lr: float) -> None:
        self.game = game
        self.lr = check_lr(lr)
        self._params = checked_parameters(game)
        game.project()  # w_0 must be feasible
        self.w = copies(self._params)
        self.prev = [torch.zeros_like(p) for p in self.w]  # eta * g_{t-1}
        self.step_count = 0

    def step(self, rank: int = 0) -> list[torch.Tensor]:
        """One iteration; returns the operator value ``g_t`` it used."""
        half = [w - s for w, s in zip(self.w, self.prev, strict=True)]
        assign(self._params, half)
        self.game.project()
        try:
            g = evaluate(self.game, self._params, self.step_count, rank)
        except BaseException:
            assign(self._params, self.w)
            raise
        # eta*g is formed once and subtracted, exactly as the distributed algorithm does
        scaled = [self.lr * gi for gi in g]
        assign(self._params, [w - s for w, s in zip(self.w, scaled, strict=True)])
        self.game.project()
        self.w = copies(self._params)
        self.prev = scaled
        self.step_count += 1
        return g

    def state_dict(self) -> dict[str, Any]:
        """The iterate, the stored step ``eta*g_{t-1}`` and the counter (copies)."""
        return {"w": copies(self.w), "prev": copies(self.prev), "step": self.step_count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict` (shapes must match the game's parameters)."""
        for name in ("w", "prev"):
            if [tuple(t.shape) for t in state[name]] != [tuple(p.shape) for p in self.w]:
                raise CheckpointError(
                    f"OMD state {name!r} does not match the game's parameter shapes"
                )
        if not is_count(state["step"]):
            raise CheckpointError(f"OMD state has step {state['step']!r}; it must be an int >= 0")
        self.w, self.prev = copies(state["w"]), copies(state["prev"])
        self.step_count = state["step"]
        assign(self._params, self.w)


class GradientDescentAscent:
    """Simultaneous gradient descent-ascent: ``w_{t+1} = P(w_t - eta*F(w_t; xi_t))``.

    The "basic gradient method" of the seed's eq. (11). On a bilinear game ``x^T A y`` every
    iteration multiplies ``||w||`` by about ``sqrt(1 + eta^2 s^2)`` along each singular
    direction (``s`` a singular value of ``A``): it diverges for every step size, which is why
    the seed builds on OMD instead.

    References: the DQGAN seed, Section 2.2; Mertikopoulos et al. (ICLR 2019).
    """

    def __init__(self, game: Game, lr: float) -> None:
        self.game = game
        self.lr = check_lr(lr)
        self._params = checked_parameters(game)
        game.project()
        self.step_count = 0

    def step(self, rank: int = 0) -> list[torch.Tensor]:
        """One iteration; returns the operator value it used."""
        g = evaluate(self.game, self._params, self.step_count, rank)
        with torch.no_grad():
            for p, gi in zip(self._params, g, strict=True):
                p.sub_(self.lr * gi)
        self.game.project()
        self.step_count += 1
        return g
