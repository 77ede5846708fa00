"""The baselines of the paper's linear-model experiments (spec 3.8): fp32 SGD, QSGD and
ECQ-SGD, distributed over scheme (a) like LPC-SVRG. (fp32 SVRG is
:class:`~gradzip.algorithms.svrg.lpc_svrg.LPCSVRG` with ``b=None``.)

Each round, worker ``alpha`` draws its own mini-batch ``I_alpha`` (``B`` indices, uniform with
replacement) and sends ``g_alpha = mean_{i in I_alpha} grad f_i(x)``; every worker averages the
decoded messages and steps ``x = prox_{lr_t h}(x - lr_t g)`` with ``lr_t = lr / (1 + lr_decay t)``.

* ``sgd``: fp32 messages (the identity codec), ``32 d`` bits each.
* ``qsgd``: QSGD with ``s = levels`` positive levels and the max-norm scale (the paper: "for
  low-precision algorithms, we use max norm in the scaling factor"), ``ceil(log2(2s+1)) d + 32``
  bits; unbiased, variance ``<= d ||g||_inf^2 / (4 s^2)``. It is LPC's quantizer with
  ``theta = 1`` (spec 3.2), so "LPC-SVRG vs QSGD at equal levels" compares SVRG with SGD.
* ``ecq-sgd``: error-compensated QSGD (Wu et al. 2018): each worker quantizes ``g + h`` and keeps
  ``h = (g + h) - Q(g + h)`` (:class:`~gradzip.feedback.ErrorFeedback`). Wu et al. weight the
  accumulated error with two factors ``alpha``, ``beta``; ``alpha = beta = 1`` here, the plain
  error-feedback form [CHOICE]. The same bits as QSGD.

References: Alistarh et al., "QSGD", NeurIPS 2017; Wu, Huang, Huang and Zhang, "Error
Compensated Quantized SGD and its Applications to Large-scale Distributed Optimization", ICML
2018; spec 3.8.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from gradzip.algorithms.svrg.base import DistributedAlgorithm, RunResult, TensorSpec
from gradzip.algorithms.svrg.config import SGDConfig
from gradzip.algorithms.svrg.problems import FiniteSum
from gradzip.algorithms.svrg.prox import Prox
from gradzip.algorithms.svrg.sampling import local_batch
from gradzip.comm.transport import Transport
from gradzip.compressors.identity import Identity
from gradzip.compressors.qsgd import QSGD
from gradzip.schemes import AllGatherDecode, Scheme


def make_sgd_scheme(config: SGDConfig) -> Scheme:
    """Scheme (a) around the codec of ``config.method``."""
    if config.method == "sgd":
        return AllGatherDecode(Identity(), run_seed=config.run_seed)
    # the LPC-SVRG paper's QSGD baseline: one scale per vector
    codec = QSGD(s=config.levels, bucket_size=None, norm="max", packing=config.packing)
    return AllGatherDecode(
        codec, run_seed=config.run_seed, error_feedback=config.method == "ecq-sgd"
    )


class QuantizedSGD(DistributedAlgorithm):
    """Mini-batch (prox-)SGD with fp32, QSGD or ECQ-SGD messages, on one rank (SPMD).

    State: ``x``, ``step`` and the scheme's error-feedback residual (ECQ-SGD), which a failed
    round restores; :meth:`state_dict` saves all three.
    """

    def __init__(
        self,
        transport: Transport,
        problem: FiniteSum,
        config: SGDConfig,
        prox: Prox | None = None,
        x0: torch.Tensor | None = None,
    ) -> None:
        scheme = make_sgd_scheme(config)
        super().__init__(transport, problem, scheme, prox, config.record_every, config.record_rank)
        self.config = config
        self.x = problem.check_point(x0 if x0 is not None else problem.zeros(), "x0")

    def point(self) -> torch.Tensor:
        return self.x

    def finished(self) -> bool:
        return self.step >= self.config.steps

    def output(self) -> torch.Tensor:
        return self.x

    def lr_at(self, step: int) -> float:
        """``lr / (1 + lr_decay * step)``."""
        return self.config.lr / (1.0 + self.config.lr_decay * step)

    def _round(self) -> bool:
        c, t = self.config, self.transport
        idx = local_batch(self.run_seed, t.rank, self.step, self.problem.n, c.batch)
        g = self.problem.grad_sum(self.x, idx) / c.batch
        mean = self.channel.average(g, self.step, f"{c.method} gradient")
        lr = self.lr_at(self.step)
        x_new = self.prox(self.x - lr * mean, lr)
        # a failure here restores the residuals the average just updated (advance)
        self.check_finite("iterate x", x_new)
        self.x = x_new
        self.step += 1
        return False

    # -- checkpoints: x and the step; the residuals travel in the scheme's state ---------------
    def _state_tensors(self) -> dict[str, torch.Tensor | None]:
        return {"x": self.x}

    def _tensor_specs(self) -> dict[str, TensorSpec]:
        return {"x": ((self.problem.dim,), self.problem.dtype, False)}

    def _check_scalars(self, scalars: Mapping[str, Any], step: int) -> dict[str, Any]:
        super()._check_scalars(scalars, step)  # none expected
        if step > self.config.steps:
            raise ValueError(f"step {step} is beyond the run's {self.config.steps} steps")
        return {}

    def _load(self, tensors: Mapping[str, torch.Tensor | None], scalars: Mapping[str, Any]) -> None:
        x = tensors["x"]
        assert x is not None  # checked: not optional
        self.x = x


def quantized_sgd(
    transport: Transport,
    problem: FiniteSum,
    config: SGDConfig,
    prox: Prox | None = None,
    x0: torch.Tensor | None = None,
) -> RunResult:
    """Run a baseline on this rank (call it on every rank)."""
    return QuantizedSGD(transport, problem, config, prox, x0).run()
