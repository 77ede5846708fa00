"""LPC-SVRG and ALPC-SVRG (seed 002, spec section 3) with their baselines.

Finite-sum problems ``F(x) = (1/n) sum_i f_i(x) + h(x)`` solved by ``M`` data-parallel ranks whose
inner-loop messages are clipped low-precision vectors sent as real payloads through a
:class:`~gradzip.comm.transport.Transport`:

* :class:`LPCSVRG` / :func:`lpc_svrg`: Algorithm 1 (proximal SVRG, spec 3.4);
* :class:`ALPCSVRG` / :func:`alpc_svrg`: Algorithms 2 and 3 (Katyusha momentum with double
  sampling, spec 3.5-3.6);
* :class:`QuantizedSGD` / :func:`quantized_sgd`: fp32 SGD, QSGD and ECQ-SGD (spec 3.8);
* problems :class:`LeastSquares`, :class:`Logistic`, :class:`ModuleProblem` (any
  ``nn.Module``); proximal operators :func:`make_prox` (``none``, ``l1``, ``l2``, ``l2-ball``);
* data: :func:`make_synthetic` (Syn-512/1024/20k); the paper's YearPredictionMSD driver is the
  lab's (``gradzip_lab.reproduce.lpc.yearmsd``).

Example (4 simulated ranks; in P real processes call ``lpc_svrg`` with a
``DistributedTransport`` instead)::

    from gradzip.comm.local import run_local
    from gradzip.algorithms.svrg import LPCSVRGConfig, lpc_svrg, make_synthetic, make_prox

    problem, _ = make_synthetic("syn-512", n=2000)
    config = LPCSVRGConfig(epochs=5, lr=0.2, batch=8, b=4, theta=1.0, scheme="a")
    results = run_local(4, lambda t: lpc_svrg(t, problem, config, prox=make_prox("l1", 1e-3)))
    x = results[0].x                       # the same bits on every rank
    bits = sum(r.bits for r in results)    # measured inner-loop bits, all ranks
"""

from __future__ import annotations

from gradzip.algorithms.svrg.alpc_svrg import ALPCSVRG, alpc_svrg
from gradzip.algorithms.svrg.base import DistributedAlgorithm, RunResult
from gradzip.algorithms.svrg.baselines import QuantizedSGD, quantized_sgd
from gradzip.algorithms.svrg.channel import make_inner_scheme
from gradzip.algorithms.svrg.config import ALPCSVRGConfig, LPCSVRGConfig, SGDConfig
from gradzip.algorithms.svrg.lpc_svrg import LPCSVRG, lpc_svrg
from gradzip.algorithms.svrg.module_problem import ModuleProblem
from gradzip.algorithms.svrg.problems import FiniteSum, LeastSquares, Logistic
from gradzip.algorithms.svrg.prox import L1, L2, L2Ball, NoProx, Prox, make_prox
from gradzip.algorithms.svrg.round_bits import (
    body_bits_per_round,
    fp32_bits_per_round,
    paper_bits_per_round,
)
from gradzip.algorithms.svrg.synthetic import SYNTHETIC, make_synthetic, synthetic_regression
from gradzip.algorithms.svrg.trace import Trace

__all__ = [
    "ALPCSVRG",
    "L1",
    "L2",
    "LPCSVRG",
    "SYNTHETIC",
    "ALPCSVRGConfig",
    "DistributedAlgorithm",
    "FiniteSum",
    "L2Ball",
    "LPCSVRGConfig",
    "LeastSquares",
    "Logistic",
    "ModuleProblem",
    "NoProx",
    "Prox",
    "QuantizedSGD",
    "RunResult",
    "SGDConfig",
    "Trace",
    "alpc_svrg",
    "body_bits_per_round",
    "fp32_bits_per_round",
    "lpc_svrg",
    "make_inner_scheme",
    "make_prox",
    "make_synthetic",
    "paper_bits_per_round",
    "quantized_sgd",
    "synthetic_regression",
]
