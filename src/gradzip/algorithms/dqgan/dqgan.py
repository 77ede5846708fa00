"""DQGAN: distributed optimistic mirror descent with compressed, error-compensated messages
(the seed's Algorithm 2, spec 4.4), as SPMD code that every rank runs over a Transport."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

from gradzip.algorithms.dqgan.game import (
    Game,
    assign,
    check_lr,
    checked_parameters,
    copies,
    evaluate,
)
from gradzip.algorithms.dqgan.optimistic_adam import OptimisticAdam
from gradzip.choices import check_choice, choices_of
from gradzip.comm.transport import Transport
from gradzip.compressors.base import Compressor
from gradzip.errors import CheckpointError, GradzipError
from gradzip.schemes.parameter_server import ParameterServer
from gradzip.stepping import OnNonfinite
from gradzip.sync import GradientSync

#: the game optimizer: optimistic mirror descent, or optimistic Adam
GanOptimizer = Literal["omd", "optimistic_adam"]
OPTIMIZERS: tuple[GanOptimizer, ...] = choices_of(GanOptimizer)
#: what OMD extrapolates from: the compressed gradient, or it corrected by the error
Extrapolation = Literal["compressed", "error_corrected"]
EXTRAPOLATIONS: tuple[Extrapolation, ...] = choices_of(Extrapolation)
_STATE_VERSION = 1


@dataclass(frozen=True)
class StepStats:
    """What one rank measured in one step: its own uplink payloads (``wire_bits`` =
    ``8 * len(payload)`` summed over the tensors, and the papers' ``paper_bits``) and the bytes
    its transport really sent and received in the step (payloads, the server's downlink, the
    finiteness flags, 8-byte length prefixes)."""

    step: int
    wire_bits: int
    paper_bits: float
    sent_bytes: int
    received_bytes: int


class DQGAN:
    """One rank of DQGAN (spec 4.4): ``M = world_size`` workers, one of which (``server``) also
    acts as the parameter server [CHOICE, as :class:`~gradzip.schemes.ParameterServer`: its own
    message is compressed too but never crosses the wire].

    Default (``optimizer="omd"``, [RECON]; the structure follows the seed's prose)::

        w_half = P(w_t - g_hat_{t-1})                  identical on every worker
        g^m    = F(w_half; xi^m_t)                     worker m's mini-batch
        p^m    = eta*g^m + e^m;  c^m = Q(p^m);  e^m = p^m - decode(c^m);  send c^m
        server: g_hat = (1/M) sum_m decode(c^m), broadcast as fp32 bytes
        all:    w_{t+1} = P(w_t - g_hat)

    so the one compressed, error-compensated step is used twice: in the update of iteration
    ``t`` and in the extrapolation of ``t+1``. The error-corrected sequence
    ``w~_t = w_t - (1/M) sum_m e^m_t`` performs exact parallel OMD steps,
    ``w~_{t+1} = w~_t - eta (1/M) sum_m g^m_t`` (the seed's eqs. 47-48; tested).

    Options:

    * ``extrapolation="error_corrected"`` [RECON, this library's reading of "the error is
      compensated twice per iteration"]: ``w_half^m = P(w_t - g_hat_{t-1} - 2 e^m_t +
      e^m_{t-1})``. Since ``g_hat_{t-1} = eta g_{t-1} + e_{t-1} - e_t`` (averaged), this is the
      OMD extrapolation ``w~_t - eta g_{t-1}`` of the error-corrected iterate with each worker's
      own residual in place of the average: exactly OMD on ``w~`` for one worker (tested). Our
      measurements (``gradzip reproduce dqgan-bilinear``) show why it matters: with top-k at
      ``k = d/10`` the default diverges on the bilinear game for every step size tried, because
      the extrapolation then uses a sparse step whose missing part lags by many iterations,
      while this variant converges at OMD's rate. With unbiased 8-bit quantization both match
      OMD.
    * ``server_ef=True`` ("double error feedback" [RECON]): the server compresses its broadcast
      too, ``c = Q(g_hat + E)``, ``E = g_hat + E - decode(c)``; needs ``error_feedback``.
    * ``optimizer="optimistic_adam"`` (the experiments' variant [RECON]): workers send
      ``Q(g^m + e^m)`` with ``g^m = F(w_t; xi)`` at the current iterate (no ``eta`` inside, no
      extrapolation) and every rank applies :class:`OptimisticAdam` to ``g_hat``.
    * ``error_feedback=False``: ``e`` stays 0 (CPOAdam-GQ; with the identity compressor,
      CPOAdam, see :mod:`gradzip.algorithms.dqgan.baselines`).

    Bits per worker per iteration: one compressor payload per parameter tensor (``b*d + 32``
    plus the header for Hou's ``b``-bit quantizer, ``k(32 + ceil(log2 d))`` for top-k, ``32 d``
    for the identity) up, and ``32 d`` down (fp32) or one compressor payload down
    (``server_ef``). Error bound (Lemma 1, constant [RECON] from Karimireddy et al.): for a
    delta-approximate ``Q`` and ``||eta g||^2 <= eta^2 G^2``, ``||e_t||^2 <= 4 (1 - delta) /
    delta^2 eta^2 G^2``, and ``e = 0`` for ``delta = 1``
    (:func:`gradzip.algorithms.dqgan.delta.lemma1_bound`).

    Guarantees and failures: all ranks hold bitwise identical parameters after every step (they
    apply the same decoded broadcast; :meth:`__init__` checks that they start equal). Each step
    first agrees across ranks that every message is finite: a NaN or Inf on any rank raises
    :class:`~gradzip.errors.NonFiniteInputError` on all of them (or, with
    ``on_nonfinite="skip"``, every rank skips the step and :meth:`step` returns ``None``); any
    failure leaves the parameters, the residuals, the step counter and the optimizer state as
    they were. Mini-batches come from ``(seed, rank, step)`` in the game, so simulated ranks
    and real processes give identical results (tested). Randomness of the compressor is keyed
    by ``(run_seed, rank, step, tensor index)``.

    References: the DQGAN seed, Algorithm 2, Lemma 1, Theorem 3; Karimireddy et al., "Error
    Feedback Fixes SignSGD" (ICML 2019); Daskalakis et al., "Training GANs with optimism"
    (ICLR 2018); spec section 4.4.
    """

    def __init__(
        self,
        game: Game,
        transport: Transport,
        compressor: Compressor,
        *,
        lr: float,
        optimizer: GanOptimizer = "omd",
        error_feedback: bool = True,
        server_ef: bool = False,
        extrapolation: Extrapolation = "compressed",
        server: int = 0,
        run_seed: int = 0,
        betas: tuple[float, float] = (0.5, 0.9),
        eps: float = 1e-8,
        on_nonfinite: OnNonfinite = "raise",
    ) -> None:
        check_choice("optimizer", optimizer, OPTIMIZERS)
        check_choice("extrapolation", extrapolation, EXTRAPOLATIONS)
        if extrapolation != "compressed" and optimizer != "omd":
            raise ValueError("extrapolation applies to optimizer='omd' only")
        if server_ef and not error_feedback:
            raise ValueError("server_ef (double error feedback) needs error_feedback=True")
        if not 0 <= server < transport.world_size:
            raise ValueError(f"server rank {server} is not in a group of {transport.world_size}")
        self.lr = check_lr(lr)
        self.game, self.transport = game, transport
        self.optimizer, self.extrapolation = optimizer, extrapolation
        self._params = checked_parameters(game)
        scheme = ParameterServer(
            compressor,
            run_seed=run_seed,
            error_feedback=error_feedback,
            server=server,
            downlink="requantize" if server_ef else "fp32",
        )
        self.sync = GradientSync(transport, scheme=scheme, on_nonfinite=on_nonfinite)
        game.project()  # w_0 must be feasible
        self.w = copies(self._params)
        self._check_same_start()
        self.prev = [torch.zeros_like(p) for p in self.w]  # g_hat_{t-1}
        self.e_prev = [torch.zeros_like(p) for p in self.w]  # e^m_{t-1}
        self.adam = (
            OptimisticAdam(self.w, lr, betas, eps) if optimizer == "optimistic_adam" else None
        )
        #: this rank's operator value ``g^m`` of the last successful step (diagnostics, tests)
        self.last_operator: list[torch.Tensor] = []

    @property
    def step_count(self) -> int:
        """Completed iterations (the communication round of the next step)."""
        return self.sync.step

    def residuals(self) -> list[torch.Tensor]:
        """This worker's residuals ``e^m_t`` (zeros before the first step or without EF)."""
        feedback = self.sync.scheme.feedback.get("worker")
        out = []
        for i, p in enumerate(self.w):
            try:
                e = feedback.residual(i) if feedback is not None else None
            except KeyError:
                e = None
            out.append(torch.zeros_like(p) if e is None else e.to(p.dtype).reshape(p.shape))
        return out

    def step(self) -> StepStats | None:
        """One iteration on this rank (every rank must call it); ``None`` if skipped."""
        t, rank = self.sync.step, self.transport.rank
        e_now = self.residuals() if self.extrapolation == "error_corrected" else None
        try:
            if self.optimizer == "omd":
                half = [w - s for w, s in zip(self.w, self.prev, strict=True)]
                if e_now is not None:
                    half = [
                        h - 2 * e + ep for h, e, ep in zip(half, e_now, self.e_prev, strict=True)
                    ]
                assign(self._params, half)
                self.game.project()
            # finiteness is agreed across ranks by the synchronisation, so every rank raises
            g = evaluate(self.game, self._params, t, rank, finite=False)
            messages = [self.lr * gi for gi in g] if self.optimizer == "omd" else g
            means = self.sync.synchronize(messages)
        except BaseException:
            assign(self._params, self.w)
            raise
        assign(self._params, self.w)
        if means is None:
            return None
        means = [m.to(dtype=w.dtype, device=w.device) for m, w in zip(means, self.w, strict=True)]
        if self.adam is None:
            assign(self._params, [w - m for w, m in zip(self.w, means, strict=True)])
            self.prev = means
        else:
            self.adam.update(self._params, means)
        self.game.project()
        self.w = copies(self._params)
        if e_now is not None:
            self.e_prev = e_now
        self.last_operator = g
        return self._stats(t)

    def _stats(self, t: int) -> StepStats:
        produced = self.sync.scheme.produced
        own = [produced[("worker", i, 0)] for i in range(len(self.w))]
        traffic = self.transport.meter.total(step=t)
        return StepStats(
            step=t,
            wire_bits=sum(e.wire_bits for e in own),
            paper_bits=sum(e.paper_bits for e in own),
            sent_bytes=traffic.sent,
            received_bytes=traffic.received,
        )

    def _check_same_start(self) -> None:
        """All ranks must start from the same ``w_0``: compare a SHA-256 of its bytes (one
        32-byte message per rank, counted under ``"dqgan_start"``)."""
        digest = hashlib.sha256()
        for p in self.w:
            digest.update(
                p.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            )
        digests = self.transport.all_gather_bytes(digest.digest(), "dqgan_start")
        differ = [r for r, d in enumerate(digests) if d != digests[0]]
        if differ:
            raise GradzipError(
                f"rank {self.transport.rank}: ranks {differ} start from other parameters than "
                "rank 0; build the game with the same initial weights on every rank"
            )

    def state_dict(self) -> dict[str, Any]:
        """Everything a bit-exact resume needs: the iterate, ``g_hat_{t-1}``, ``e_{t-1}``, the
        synchronisation (step counter, residuals) and the Optimistic Adam state (copies)."""
        return {
            "version": _STATE_VERSION,
            "w": copies(self.w),
            "prev": copies(self.prev),
            "e_prev": copies(self.e_prev),
            "sync": self.sync.state_dict(),
            "adam": None if self.adam is None else self.adam.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict` (same game shapes, rank, group and run seed)."""
        if not isinstance(state, Mapping) or state.get("version") != _STATE_VERSION:
            found = state.get("version") if isinstance(state, Mapping) else type(state).__name__
            raise CheckpointError(f"DQGAN state has version {found!r}")
        missing = [k for k in ("w", "prev", "e_prev", "sync", "adam") if k not in state]
        if missing:
            raise CheckpointError(f"DQGAN state lacks {', '.join(missing)}")
        shapes = [tuple(p.shape) for p in self.w]
        for name in ("w", "prev", "e_prev"):
            if [tuple(t.shape) for t in state[name]] != shapes:
                raise CheckpointError(f"DQGAN state {name!r} does not match the game's parameters")
        if (state["adam"] is None) != (self.adam is None):
            raise CheckpointError("DQGAN state was saved with another optimizer")
        # validate every part before changing any (Optimistic Adam's load is all or nothing)
        parsed = self.sync.parse_state(state["sync"])
        if self.adam is not None:
            self.adam.load_state_dict(state["adam"])
        self.sync.install_state(parsed)
        self.w, self.prev = copies(state["w"]), copies(state["prev"])
        self.e_prev = copies(state["e_prev"])
        assign(self._params, self.w)
