"""LPC-SVRG: proximal SVRG whose inner message is a clipped low-precision vector (spec 3.4).

Algorithm 1 [RECON: the Prox-SVRG skeleton of Reddi et al. 2016 + SEED]::

    x_tilde = x = x0
    for s in 0..S-1:
        gbar = grad f(x_tilde)                         # fp32, shards + all-gather (step 1)
        for t in 0..m-1:
            worker alpha: I_alpha = B indices, uniform with replacement (its own randomness)
                          u_alpha = mean_{i in I_alpha} grad f_i(x) - grad f_i(x_tilde)
            u_tilde = scheme(Q(u_1), ..., Q(u_M))      # (a), (b) or (c) of spec 3.3 (step 2)
            x = prox_{eta h}(x - eta (gbar + u_tilde))
        x_tilde = x
    output: x_tilde (convex), or a uniformly drawn inner iterate x_a (nonconvex)

Only the SVRG correction ``u_alpha`` is quantized [SEED-R: Lemma 6 bounds it by
``L ||x - x_tilde||``], so the quantization error vanishes as ``x`` and ``x_tilde``
converge; ``Q`` is LPC's ``Q_(delta,b)`` with ``delta = theta ||u_alpha||_inf / s`` (spec 3.2).

Bits per round, in all (spec 3.3, [RECON] formulas): (a) ``M(M-1)(b d + 32)``; (b)
``M(64 + b d + (b + ceil(log2 M)) d)``; (c) ``M(64 + 2 b d)``, against ``32 d M(M-1)`` for fp32
broadcast; the per-epoch full gradient (fp32) is excluded from these [SEED] and reported
separately. Measured bytes add each payload's header and CRC and an 8-byte length prefix per
message; the server's own codes never cross the wire in (b)/(c), so those measure ``(M-1)/M`` of
the formula (:mod:`gradzip.algorithms.svrg.round_bits`).

Guarantee (Theorem 2 [SEED prose]): the rate of full-precision Prox-SVRG (Theorem 1, Reddi et
al.) as long as the quantization factor ``zeta = (d - kc) theta^2/(4 s^2) + kc (1 - theta)^2``
(Lemma 4) is small; ``theta < 1`` trades a ``theta^2`` smaller in-range error for ``kc``
clipped coordinates. With ``b = None`` this is exactly (mini-batch, distributed) Prox-SVRG
with fp32 messages.

References: Yu, Wu and Huang, "Exploring Fast and Communication-Efficient Algorithms in
Large-scale Distributed Networks", AISTATS 2019 (Algorithm 1, Lemmas 3-7, Theorem 2); Reddi et
al., "Fast stochastic methods for nonsmooth nonconvex optimization", 2016; spec section 3.4.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from gradzip.algorithms.svrg.base import DistributedAlgorithm, RunResult, TensorSpec
from gradzip.algorithms.svrg.channel import make_inner_scheme
from gradzip.algorithms.svrg.config import LPCSVRGConfig
from gradzip.algorithms.svrg.problems import FiniteSum
from gradzip.algorithms.svrg.prox import Prox
from gradzip.algorithms.svrg.sampling import local_batch, shared_choice
from gradzip.algorithms.svrg.state import epoch_counters
from gradzip.comm.transport import Transport


class LPCSVRG(DistributedAlgorithm):
    """LPC-SVRG on one rank (SPMD: every rank builds one with the same arguments).

    State: ``x``, ``x_tilde``, ``gbar`` (the current epoch's full gradient, None between
    epochs), ``x_out`` (the drawn output iterate once reached, ``output="random"``), ``epoch``,
    ``inner_step`` (rounds done in this epoch) and ``step`` (rounds done in all, the keys'
    step); :meth:`state_dict` saves all of it. ``lr`` and ``inner`` are resolved from the
    config (see :class:`~gradzip.algorithms.svrg.config.LPCSVRGConfig`).
    """

    def __init__(
        self,
        transport: Transport,
        problem: FiniteSum,
        config: LPCSVRGConfig,
        prox: Prox | None = None,
        x0: torch.Tensor | None = None,
    ) -> None:
        c = config
        scheme = make_inner_scheme(c.scheme, c.b, c.theta, c.packing, c.run_seed)
        super().__init__(transport, problem, scheme, prox, c.record_every, c.record_rank)
        self.config = c
        self.lr = c.lr if c.lr is not None else 1.0 / (3.0 * problem.smoothness())
        self.inner = c.inner or max(1, problem.n // (transport.world_size * c.batch))
        self.x = problem.check_point(x0 if x0 is not None else problem.zeros(), "x0")
        self.x_tilde = self.x.clone()
        self.gbar: torch.Tensor | None = None
        self.epoch = 0
        self.inner_step = 0
        total = c.epochs * self.inner
        #: the round whose starting iterate is the nonconvex output x_a (shared randomness)
        self.output_step = shared_choice(c.run_seed, total) if c.output == "random" else None
        self.x_out: torch.Tensor | None = None

    def point(self) -> torch.Tensor:
        return self.x

    def finished(self) -> bool:
        return self.epoch >= self.config.epochs

    def output(self) -> torch.Tensor:
        if self.output_step is not None and self.x_out is not None:
            return self.x_out
        return self.x_tilde

    def correction(self) -> torch.Tensor:
        """This rank's ``u_alpha`` for the current round (its own mini-batch)."""
        t = self.transport
        idx = local_batch(self.run_seed, t.rank, self.step, self.problem.n, self.config.batch)
        return self.problem.grad_diff_mean(self.x, self.x_tilde, idx)

    def _round(self) -> bool:
        gbar = self.gbar
        if gbar is None:  # communication step 1: a full gradient at the new x_tilde
            gbar = self.channel.full_gradient(self.problem, self.x_tilde, self.step)
        u_tilde = self.channel.average(self.correction(), self.step, "SVRG correction")
        x_new = self.prox(self.x - self.lr * (gbar + u_tilde), self.lr)
        self.check_finite("iterate x", x_new)
        # commit: nothing above changed the state, so a failed round leaves it as it was
        self.gbar = gbar
        if self.step == self.output_step:
            self.x_out = self.x
        self.x = x_new
        self.step += 1
        self.inner_step += 1
        if self.inner_step < self.inner:
            return False
        self.x_tilde = self.x
        self.gbar = None
        self.epoch += 1
        self.inner_step = 0
        return True

    # -- checkpoints ---------------------------------------------------------------------------
    def _resolved(self) -> dict[str, Any]:
        return {"lr": self.lr, "inner": self.inner, "output_step": self.output_step}

    def _state_tensors(self) -> dict[str, torch.Tensor | None]:
        return {"x": self.x, "x_tilde": self.x_tilde, "gbar": self.gbar, "x_out": self.x_out}

    def _tensor_specs(self) -> dict[str, TensorSpec]:
        shape, dtype = (self.problem.dim,), self.problem.dtype
        return {
            "x": (shape, dtype, False),
            "x_tilde": (shape, dtype, False),
            "gbar": (shape, dtype, True),
            "x_out": (shape, dtype, True),
        }

    def _state_scalars(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "inner_step": self.inner_step}

    def _check_scalars(self, scalars: Mapping[str, Any], step: int) -> dict[str, Any]:
        if set(scalars) != {"epoch", "inner_step"}:
            raise ValueError(f"scalars must be epoch and inner_step, got {sorted(scalars)}")
        return epoch_counters(scalars, step, self.config.epochs, self.inner)

    def _load(self, tensors: Mapping[str, torch.Tensor | None], scalars: Mapping[str, Any]) -> None:
        x, x_tilde = tensors["x"], tensors["x_tilde"]
        assert x is not None and x_tilde is not None  # checked: not optional
        self.x, self.x_tilde = x, x_tilde
        self.gbar, self.x_out = tensors["gbar"], tensors["x_out"]
        self.epoch, self.inner_step = scalars["epoch"], scalars["inner_step"]


def lpc_svrg(
    transport: Transport,
    problem: FiniteSum,
    config: LPCSVRGConfig,
    prox: Prox | None = None,
    x0: torch.Tensor | None = None,
) -> RunResult:
    """Run LPC-SVRG on this rank (call it on every rank, e.g. through
    :func:`~gradzip.comm.local.run_local` or in each of P processes)."""
    return LPCSVRG(transport, problem, config, prox, x0).run()
