"""ALPC-SVRG: Katyusha momentum with a low-precision z-gradient and double sampling
(spec 3.5, 3.6 [RECON from Katyusha, Option I, + SEED double sampling]).

Algorithm 2 (strongly convex, ``sigma > 0``)::

    y = z = x_tilde = x0;  tau2 = 1/2;  tau1 = min(sqrt(m sigma / (3L)), 1/2);  a = 1/(3 tau1 L)
    for s in 0..S-1:
        mu = grad f(x_tilde)                                        # fp32, full
        for j in 0..m-1:
            x = tau1 z + tau2 x_tilde + (1 - tau1 - tau2) y
            worker alpha: u_alpha = grad f_{I_alpha}(x) - grad f_{I_alpha}(x_tilde)   # own I_alpha
            z = prox_{a h}(z - a (mu + scheme(Q(u_1..u_M))))         # the communicated gradient
            J = the shared batch of round (s, j)                     # same on every worker
            y = prox_{h/(3L)}(x - (mu + grad f_J(x) - grad f_J(x_tilde)) / (3L))   # local, fp32
        x_tilde = sum_j (1 + a sigma)^j y_j / sum_j (1 + a sigma)^j

Algorithm 3 (not strongly convex) is the same with ``tau1_s = 2/(s+4)``, ``a_s = 1/(3 tau1_s L)``
per epoch and ``x_tilde = (1/m) sum_j y_j`` (the telescoping form of Katyusha^ns) [SEED prose].

Double sampling [SEED]: the y-update takes an independent full-precision gradient on a batch
``J`` that every worker draws from the same shared seed, so it costs no communication and keeps
``y`` bitwise equal on all workers; only the z-gradient travels, quantized as in LPC-SVRG (same
bits per round, spec 3.3). Lemma 10 [SEED-R] needs the two gradients' batches to be independent.

Guarantee: Theorem 3 [SEED prose]: for a suitable ``theta`` and mini-batch, Katyusha's Case-1
rate (accelerated linear convergence, ``O((m + sqrt(m L / sigma)) log(1/eps))`` gradient
rounds); Theorem 4 (Algorithm 3): ``O((F(x0) - F*)/S^2 + L ||x0 - x*||^2 / (m S^2))``. The
experiments' ``tau1`` and ``a`` were lost; ``tau2 = 1/2`` and ``m = 2n/(M B)`` are Katyusha's
defaults [RECON].

References: Yu, Wu and Huang (AISTATS 2019), Algorithms 2 and 3, Lemmas 8-13, Theorems 3-4;
Allen-Zhu, "Katyusha: The First Direct Acceleration of Stochastic Gradient Methods", STOC 2017;
spec sections 3.5 and 3.6.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from gradzip.algorithms.svrg.base import DistributedAlgorithm, RunResult, TensorSpec
from gradzip.algorithms.svrg.channel import make_inner_scheme
from gradzip.algorithms.svrg.config import ALPCSVRGConfig
from gradzip.algorithms.svrg.problems import FiniteSum
from gradzip.algorithms.svrg.prox import Prox
from gradzip.algorithms.svrg.sampling import local_batch, shared_batch
from gradzip.algorithms.svrg.state import epoch_counters
from gradzip.comm.transport import Transport


class ALPCSVRG(DistributedAlgorithm):
    """ALPC-SVRG on one rank (SPMD: every rank builds one with the same arguments).

    State: ``x_tilde``, ``y``, ``z``, the epoch's full gradient ``mu`` (None between epochs),
    the running weighted sum of the epoch's ``y`` and its weight, ``epoch``, ``inner_step`` and
    ``step``; :meth:`state_dict` saves all of it. Resolved parameters: ``inner`` (m), ``L``,
    ``sigma``, ``strongly_convex``.
    """

    def __init__(
        self,
        transport: Transport,
        problem: FiniteSum,
        config: ALPCSVRGConfig,
        prox: Prox | None = None,
        x0: torch.Tensor | None = None,
    ) -> None:
        c = config
        scheme = make_inner_scheme(c.scheme, c.b, c.theta, c.packing, c.run_seed)
        super().__init__(transport, problem, scheme, prox, c.record_every, c.record_rank)
        self.config = c
        self.inner = c.inner or max(1, 2 * problem.n // (transport.world_size * c.batch))
        self.L = c.L if c.L is not None else problem.smoothness()
        self.double_batch = c.double_batch or c.batch
        self.strongly_convex, self.sigma = self._convexity(c)
        x = problem.check_point(x0 if x0 is not None else problem.zeros(), "x0")
        self.x_tilde, self.y, self.z = x, x.clone(), x.clone()
        self.mu: torch.Tensor | None = None
        self.y_sum = torch.zeros_like(x)
        self.weight_sum = 0.0
        self.epoch = 0
        self.inner_step = 0

    def _convexity(self, c: ALPCSVRGConfig) -> tuple[bool, float]:
        if c.strongly_convex is False:
            return False, 0.0
        sigma = c.sigma
        if sigma is None:  # may be costly (an eigenvalue problem for least squares)
            sigma = self.problem.strong_convexity() + self.prox.strong_convexity
        if c.strongly_convex and sigma <= 0:
            raise ValueError(
                "Algorithm 2 (strongly_convex=True) needs sigma > 0; pass sigma or use "
                "Algorithm 3 (strongly_convex=False)"
            )
        return sigma > 0, float(sigma)

    def parameters(self, epoch: int) -> tuple[float, float]:
        """``(tau1, a)`` of ``epoch``: fixed for Algorithm 2, ``2/(s+4)`` for Algorithm 3."""
        if self.strongly_convex:
            tau1 = self.config.tau1 or min(math.sqrt(self.inner * self.sigma / (3 * self.L)), 0.5)
        else:
            tau1 = 2.0 / (epoch + 4)
        return tau1, 1.0 / (3.0 * tau1 * self.L)

    def weight(self, j: int, a: float) -> float:
        """``(1 + a sigma)^j`` divided by ``(1 + a sigma)^(m-1)`` (no overflow; the average is
        the same); 1 for Algorithm 3."""
        if not self.strongly_convex:
            return 1.0
        return math.exp((j - (self.inner - 1)) * math.log1p(a * self.sigma))

    def point(self) -> torch.Tensor:
        return self.y

    def finished(self) -> bool:
        return self.epoch >= self.config.epochs

    def output(self) -> torch.Tensor:
        return self.x_tilde

    def _round(self) -> bool:
        c, p, t = self.config, self.problem, self.transport
        mu = self.mu
        if mu is None:
            mu = self.channel.full_gradient(p, self.x_tilde, self.step)
        tau1, a = self.parameters(self.epoch)
        x = tau1 * self.z + c.tau2 * self.x_tilde + (1.0 - tau1 - c.tau2) * self.y
        own = local_batch(self.run_seed, t.rank, self.step, p.n, c.batch)
        u = p.grad_diff_mean(x, self.x_tilde, own)
        g_low = mu + self.channel.average(u, self.step, "ALPC-SVRG z-gradient")
        z = self.prox(self.z - a * g_low, a)
        shared = shared_batch(self.run_seed, self.step, p.n, self.double_batch)
        g_full = mu + p.grad_diff_mean(x, self.x_tilde, shared)
        step_y = 1.0 / (3.0 * self.L)
        y = self.prox(x - step_y * g_full, step_y)
        w = self.weight(self.inner_step, a)
        self.check_finite("iterates y, z", y, z)
        # commit: nothing above changed the state, so a failed round leaves it as it was
        self.mu, self.z, self.y = mu, z, y
        self.y_sum = self.y_sum + w * y
        self.weight_sum += w
        self.step += 1
        self.inner_step += 1
        if self.inner_step < self.inner:
            return False
        self.x_tilde = self.y_sum / self.weight_sum
        self.y_sum = torch.zeros_like(self.y_sum)
        self.weight_sum = 0.0
        self.mu = None
        self.epoch += 1
        self.inner_step = 0
        return True

    # -- checkpoints ---------------------------------------------------------------------------
    def _resolved(self) -> dict[str, Any]:
        return {
            "inner": self.inner,
            "L": self.L,
            "sigma": self.sigma,
            "strongly_convex": self.strongly_convex,
            "double_batch": self.double_batch,
        }

    def _state_tensors(self) -> dict[str, torch.Tensor | None]:
        return {
            "x_tilde": self.x_tilde,
            "y": self.y,
            "z": self.z,
            "mu": self.mu,
            "y_sum": self.y_sum,
        }

    def _tensor_specs(self) -> dict[str, TensorSpec]:
        shape, dtype = (self.problem.dim,), self.problem.dtype
        specs: dict[str, TensorSpec] = {
            k: (shape, dtype, False) for k in ("x_tilde", "y", "z", "y_sum")
        }
        specs["mu"] = (shape, dtype, True)
        return specs

    def _state_scalars(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "inner_step": self.inner_step, "weight_sum": self.weight_sum}

    def _check_scalars(self, scalars: Mapping[str, Any], step: int) -> dict[str, Any]:
        if set(scalars) != {"epoch", "inner_step", "weight_sum"}:
            raise ValueError(
                f"scalars must be epoch, inner_step and weight_sum, got {sorted(scalars)}"
            )
        out: dict[str, Any] = epoch_counters(scalars, step, self.config.epochs, self.inner)
        weight_sum = scalars["weight_sum"]
        if not isinstance(weight_sum, float) or not (math.isfinite(weight_sum) and weight_sum >= 0):
            raise ValueError(f"weight_sum must be a finite float >= 0, got {weight_sum!r}")
        out["weight_sum"] = weight_sum
        return out

    def _load(self, tensors: Mapping[str, torch.Tensor | None], scalars: Mapping[str, Any]) -> None:
        x_tilde, y, z, y_sum = (tensors[k] for k in ("x_tilde", "y", "z", "y_sum"))
        assert x_tilde is not None and y is not None and z is not None and y_sum is not None
        self.x_tilde, self.y, self.z, self.y_sum = x_tilde, y, z, y_sum
        self.mu = tensors["mu"]
        self.epoch, self.inner_step = scalars["epoch"], scalars["inner_step"]
        self.weight_sum = scalars["weight_sum"]


def alpc_svrg(
    transport: Transport,
    problem: FiniteSum,
    config: ALPCSVRGConfig,
    prox: Prox | None = None,
    x0: torch.Tensor | None = None,
) -> RunResult:
    """Run ALPC-SVRG on this rank (call it on every rank)."""
    return ALPCSVRG(transport, problem, config, prox, x0).run()
