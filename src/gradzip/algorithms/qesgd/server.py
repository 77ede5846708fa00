"""Distributed QESGD (Algorithm 3): workers push fp32 gradients to a parameter server, the
server quantizes the parameter offset with ``Q_{delta_t,b}`` and sends every worker ``b``-bit
codes; once per epoch it sends the new anchor ``w_{t+1}`` in fp32.

One SPMD object per rank, :class:`DistributedQESGD`, over any
:class:`~gradzip.comm.transport.Transport` (simulated ranks or ``torch.distributed``), with
bit-identical results; rank ``server`` (default 0) is also a worker. This module holds the
algorithm's state and step; the messages, their keys and the failure notices are in
:mod:`gradzip.algorithms.qesgd.messages`, the checkpoints in
:mod:`gradzip.algorithms.qesgd.checkpoint`.

Per inner step (spec 2.2): worker ``j`` sends ``g_j = sum_{i in I_j} grad f_i(u)`` at ``u = w_t
+ z`` (fp32); the server adds the ``g_j`` in rank order, forms ``z_hat = z - eta_t (sum_j g_j /
B + lambda u)`` (``B`` the total mini-batch), quantizes it to a ``qesgd`` payload and sends it
to every worker; every rank, the server included, decodes that payload with the same function,
so all hold bit-identical ``z`` and ``u`` after every step. At the end of an epoch (the caller
says when: ``end_epoch=True`` on the same step on every rank) the server sends ``w_{t+1}`` (the
iterate average or the last iterate) in fp32. At construction it sends ``w_0`` the same way
(the seed's "wait until receiving ``w_t``"), and :meth:`DistributedQESGD.calibrate` sums the
workers' full-gradient shares at the server, which sends back the float32 norm(s) of the
schedule (spec 2.3: "computed only at ``w_0``, once, and broadcast").

Bits per worker per step: up ``32 d``, down ``b d`` (each plus a header of a few dozen bytes
and an 8-byte length prefix), and ``32 d`` down per epoch: with ``b = 8``, ``40 d`` instead of
an fp32 parameter server's ``64 d``, the paper's ideal speedup ``2 / (1 + 8/32) = 1.6`` on
bandwidth-bound links (Table 2).

Failures: a NaN or Inf gradient on any rank, or an offset update or calibration norm beyond
float32, makes every rank raise :class:`~gradzip.errors.NonFiniteInputError` in the same step.
A rank's state changes only once all of its step's messages are in and decoded, so a failed
step changes nothing and the next one runs normally.

The stochastic rounding is keyed by the codes' key [CHOICE]; with one rank and a power-of-two
batch this is bit for bit :class:`~gradzip.algorithms.qesgd.QESGDOptimizer` (Algorithm 2).

References: Zhao, Gao & Li, "Quantized Epoch-SGD for Communication-Efficient Distributed
Learning", Algorithm 3, Table 2; spec sections 2.2-2.4.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from gradzip.algorithms.qesgd import checkpoint
from gradzip.algorithms.qesgd.codec import OffsetCodec
from gradzip.algorithms.qesgd.messages import ANCHOR, CALIBRATE, CODES, GRAD, ServerLink
from gradzip.algorithms.qesgd.schedule import (
    DeltaSchedule,
    bucket_count,
    bucket_norms,
    flatten,
    write_flat,
)
from gradzip.algorithms.qesgd.state import EpochState, QesgdOutput, check_output
from gradzip.codecs.symbols import Packing
from gradzip.comm.transport import Transport
from gradzip.errors import GradzipError

__all__ = ["DistributedQESGD"]


class DistributedQESGD:
    """One rank's side of Algorithm 3; see the module docstring.

    ``w0`` is this rank's initial parameter vector (flat; only the server's copy is used),
    ``batch_size`` the total mini-batch ``B`` of a step over all workers, ``bits``/``c``/
    ``bucket_size`` the quantizer and its schedule, ``weight_decay`` ``lambda``, ``output``
    "average" (the seed) or "last". Call :meth:`calibrate` (or pass ``schedule``) before the
    first :meth:`step`.
    """

    def __init__(
        self,
        transport: Transport,
        w0: torch.Tensor,
        *,
        batch_size: int,
        bits: int = 8,
        c: float = 1.0,
        bucket_size: int = 0,
        weight_decay: float = 0.0,
        output: QesgdOutput = "average",
        run_seed: int = 0,
        server: int = 0,
        packing: Packing = "fixed",
        schedule: DeltaSchedule | None = None,
    ) -> None:
        self.link = ServerLink(transport, server, run_seed)  # checks the server rank
        if batch_size < 1:
            raise ValueError(f"qesgd: batch_size must be >= 1, got {batch_size}")
        if not weight_decay >= 0:
            raise ValueError(f"qesgd: weight_decay must be >= 0, got {weight_decay}")
        self.transport = transport
        self.server = server
        self.batch_size = batch_size
        self.weight_decay = float(weight_decay)
        self.output = check_output(output)
        self.run_seed = run_seed
        self.c = float(c)
        self.codec = OffsetCodec(bits, bucket_size, packing)
        flat = flatten([w0])
        if flat.numel() == 0:
            raise ValueError("qesgd: there are no parameters to train")
        self.numel = flat.numel()
        with transport.step_scope(None):  # set-up traffic belongs to no step
            self.state = EpochState(self.link.broadcast(flat, 0, ANCHOR, self.numel))
        self.schedule: DeltaSchedule | None = None
        if schedule is not None:
            self.set_schedule(schedule)
        #: wire bits of the last step's codes payload (what the server sent each worker)
        self.last_codes_bits = 0
        #: on the server: coordinates the grid clipped in the last step (a sign c is too large)
        self.last_clipped = 0

    @property
    def is_server(self) -> bool:
        return self.link.is_server

    def _flat_gradient(self, grad_sum: torch.Tensor) -> torch.Tensor:
        flat = flatten([grad_sum])
        if flat.numel() != self.numel:
            raise ValueError(
                f"qesgd: a gradient of {flat.numel()} entries for {self.numel} parameters"
            )
        return flat

    # -- the schedule ------------------------------------------------------------------------
    def set_schedule(self, schedule: DeltaSchedule) -> None:
        """Use ``schedule`` on this rank (every rank must use the same one)."""
        if schedule.bits != self.codec.bits or schedule.bucket_size != self.codec.bucket_size:
            raise ValueError("qesgd: the schedule's bits or bucket_size differ from this rank's")
        if not schedule.fits(self.numel):
            raise ValueError(f"qesgd: the schedule does not fit {self.numel} parameters")
        self.schedule = schedule

    def calibrate(self, grad_sum: torch.Tensor, count: int) -> DeltaSchedule:
        """The practical schedule from the full gradient at ``w_0``: each rank passes the sum of
        its per-sample gradients over its share of the data and the total ``count`` of
        samples over all ranks (the same on every rank); the server adds the shares (rank
        order, float64), divides by ``count``, and sends back the float32 bucket norms."""
        if count < 1:
            raise ValueError(f"qesgd: count must be >= 1, got {count}")
        flat = self._flat_gradient(grad_sum)
        with self.transport.step_scope(None):
            shares = self.link.gather(flat, 0, CALIBRATE, reply=CALIBRATE)
            norms = None
            if shares is not None:
                total = torch.zeros(self.numel, dtype=torch.float64)
                for share in shares:
                    total += share.to(torch.float64)
                norms = bucket_norms(total / count, self.codec.bucket_size)
                if not bool(torch.isfinite(norms).all()):  # beyond float32: tell the workers too
                    raise self.link.fail(
                        "qesgd: the full gradient's norm overflows float32; cannot calibrate delta",
                        CALIBRATE,
                    )
            buckets = bucket_count(self.numel, self.codec.bucket_size)
            norms = self.link.broadcast(norms, 0, CALIBRATE, buckets)
        schedule = DeltaSchedule(
            tuple(float(v) for v in norms), self.codec.bits, self.c, self.codec.bucket_size
        )
        self.set_schedule(schedule)
        return schedule

    def delta(self) -> torch.Tensor:
        if self.schedule is None:
            raise GradzipError("qesgd: no delta schedule yet; call calibrate(...) first")
        return self.schedule.delta(self.state.epoch)

    # -- stepping ----------------------------------------------------------------------------
    def current(self) -> torch.Tensor:
        """``u = w_t + z``, where the next gradients are taken (flat float32)."""
        return self.state.current()

    def step(self, grad_sum: torch.Tensor, lr: float, end_epoch: bool = False) -> torch.Tensor:
        """One inner step from this rank's ``g_j`` (the *sum* of per-sample gradients at
        :meth:`current` over its share of the batch); returns the new ``u`` (after an epoch:
        ``w_{t+1}``). ``lr`` is ``eta_t`` (the same on every rank)."""
        if not (lr > 0 and lr < float("inf")):
            raise ValueError(f"qesgd: lr must be a positive number, got {lr}")
        delta = self.delta()
        state = self.state
        flat = self._flat_gradient(grad_sum)
        with self.transport.step_scope(state.step):
            key = self.link.key(self.server, state.step, CODES)
            grads = self.link.gather(flat, state.step, GRAD, reply=CODES)
            if grads is not None:  # the server
                total = torch.zeros(self.numel, dtype=torch.float32)
                for g in grads:
                    total += g
                z_hat = state.proposal(total / self.batch_size, lr, self.weight_decay)
                if not bool(torch.isfinite(z_hat).all()):
                    # finite gradients whose sum or lr-scaled step overflows float32: the codec
                    # would raise here, on the server only, with every worker waiting for codes
                    raise self.link.fail(
                        f"qesgd: step {state.step}: the offset update overflows float32 (learning "
                        "rate times gradient too large); no rank applied anything",
                        CODES,
                    )
                payload = bytes(self.codec.encode(z_hat, delta, key).payload)
                self.link.send_workers(payload, CODES)
                clipped = self.codec.clipped(z_hat, delta)
            else:
                payload = self.link.receive(CODES)
                clipped = 0
            z_new = self.codec.decode(payload, delta, key, self.numel)
            w_next = None
            if end_epoch:
                preview = state.preview_anchor(z_new, self.output) if self.is_server else None
                w_next = self.link.broadcast(preview, state.step, ANCHOR, self.numel)
        state.commit(z_new)  # every message of the step is in: now the state moves
        self.last_codes_bits = 8 * len(payload)
        self.last_clipped = clipped
        if w_next is not None:
            state.start_epoch(w_next)
            return state.anchor.clone()
        return state.current()

    def step_parameters(
        self, params: Sequence[torch.Tensor], count: int, lr: float, end_epoch: bool = False
    ) -> None:
        """:meth:`step` for a model: ``params``' ``.grad`` are this rank's *mean* gradients over
        its ``count`` samples (as ``loss.mean().backward()`` leaves them); the new ``u`` is
        written into ``params``."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        write_flat(params, self.step(flatten(grads) * count, lr, end_epoch))

    # -- checkpoints (gradzip.algorithms.qesgd.checkpoint) ------------------------------------
    def _layout(self) -> dict[str, int]:
        return {"rank": self.transport.rank, "world_size": self.transport.world_size}

    def _settings(self) -> dict[str, Any]:
        """What a checkpoint must agree on besides the rank layout."""
        return {
            "bits": self.codec.bits,
            "bucket_size": self.codec.bucket_size,
            "batch_size": self.batch_size,
            "weight_decay": self.weight_decay,
            "output": self.output,
            "server": self.server,
            "run_seed": self.run_seed,
        }

    def state_dict(self) -> dict[str, Any]:
        return checkpoint.save(self._layout(), self._settings(), self.state, self.schedule)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict` (refused, with nothing changed, if it was saved by
        another rank or with other settings)."""
        self.state, self.schedule = checkpoint.restore(
            state, self._layout(), self._settings(), self.state.anchor
        )
