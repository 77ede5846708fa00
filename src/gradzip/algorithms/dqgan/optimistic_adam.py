"""Optimistic Adam (Daskalakis et al. 2018): the update DQGAN's experiments apply to the
averaged, compressed operator (spec 4.4, ``optimizer="optimistic_adam"`` [RECON])."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from gradzip.algorithms.dqgan.game import check_lr, copies
from gradzip.errors import CheckpointError
from gradzip.feedback import is_count

_STATE_VERSION = 1


class OptimisticAdam:
    """Adam's normalised step, applied optimistically:

    ``m_t = b1 m_{t-1} + (1 - b1) g_t``, ``v_t = b2 v_{t-1} + (1 - b2) g_t^2``, bias corrected
    ``m^_t = m_t/(1 - b1^t)``, ``v^_t = v_t/(1 - b2^t)``, direction
    ``d_t = m^_t/(sqrt(v^_t) + eps)`` and ``w_{t+1} = w_t - 2 lr d_t + lr d_{t-1}``
    (``d_0 = 0``): the OMD extrapolation ``-2 eta g_t + eta g_{t-1}`` of the seed's eq. (18),
    with Adam's per-coordinate scaling. Defaults ``lr = 2e-4``, ``b1 = 0.5``, ``b2 = 0.9``,
    ``eps = 1e-8`` [CHOICE, the usual GAN settings; the seed's grid-searched values are lost].

    ``g`` is the operator ``F = (grad_theta L, -grad_phi L)``, so one update is descent for the
    minimizer and ascent for the maximizer. Every rank that applies it to the same ``g`` from
    the same state gets bitwise the same parameters. ``update`` validates the shapes before it
    changes anything.

    References: Daskalakis, Ilyas, Syrgkanis, Zeng, "Training GANs with optimism" (ICLR 2018),
    Algorithm 1; Kingma & Ba, "Adam" (ICLR 2015).
    """

    def __init__(
        self,
        params: Sequence[torch.Tensor],
        lr: float = 2e-4,
        betas: tuple[float, float] = (0.5, 0.9),
        eps: float = 1e-8,
    ) -> None:
        self.lr = check_lr(lr)
        b1, b2 = betas
        if not (0 <= b1 < 1 and 0 <= b2 < 1):
            raise ValueError(f"betas must lie in [0, 1), got {betas}")
        if not (math.isfinite(eps) and eps > 0):
            raise ValueError(f"eps must be a finite number > 0, got {eps}")
        self.betas = (float(b1), float(b2))
        self.eps = float(eps)
        self.t = 0
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]
        self.d = [torch.zeros_like(p) for p in params]  # the previous direction d_{t-1}

    def update(self, params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor]) -> None:
        """Apply one step with operator values ``grads`` to ``params`` (in place)."""
        if len(params) != len(self.m) or len(grads) != len(self.m):
            raise ValueError(
                f"Optimistic Adam holds {len(self.m)} tensors; got {len(params)} parameters "
                f"and {len(grads)} gradients"
            )
        for i, (p, g, m) in enumerate(zip(params, grads, self.m, strict=True)):
            if p.shape != m.shape or g.shape != m.shape:
                raise ValueError(f"tensor {i}: shape {tuple(g.shape)} != {tuple(m.shape)}")
        b1, b2 = self.betas
        t = self.t + 1
        c1, c2 = 1 - b1**t, 1 - b2**t
        m_new, v_new, d_new = [], [], []
        for g, m, v in zip(grads, self.m, self.v, strict=True):
            g = g.to(m.dtype)
            m_t = m * b1 + (1 - b1) * g
            v_t = v * b2 + (1 - b2) * g * g
            m_new.append(m_t)
            v_new.append(v_t)
            d_new.append((m_t / c1) / ((v_t / c2).sqrt() + self.eps))
        with torch.no_grad():
            for p, d, d_prev in zip(params, d_new, self.d, strict=True):
                p.sub_(2 * self.lr * d - self.lr * d_prev)
        self.m, self.v, self.d, self.t = m_new, v_new, d_new, t

    def state_dict(self) -> dict[str, Any]:
        """The moments, the previous direction and the step count (copies)."""
        return {
            "version": _STATE_VERSION,
            "t": self.t,
            "m": copies(self.m),
            "v": copies(self.v),
            "d": copies(self.d),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`; shapes must match, nothing changes on error."""
        if state.get("version") != _STATE_VERSION:
            raise CheckpointError(f"Optimistic Adam state has version {state.get('version')!r}")
        shapes = [tuple(m.shape) for m in self.m]
        for name in ("m", "v", "d"):
            if [tuple(x.shape) for x in state[name]] != shapes:
                raise CheckpointError(f"Optimistic Adam state {name!r} does not match the shapes")
        if not is_count(state["t"]):
            raise CheckpointError(
                f"Optimistic Adam state has t {state['t']!r}; it must be an int >= 0"
            )
        self.t = state["t"]
        self.m, self.v, self.d = copies(state["m"]), copies(state["v"]), copies(state["d"])
