"""Quantized Epoch-SGD on one machine (Algorithm 2) as a ``torch.optim`` optimizer.

QESGD runs Epoch-SGD (a fixed learning rate per epoch, the epoch's iterates averaged) but keeps
the parameters as ``u = w_t + z``: the anchor ``w_t`` fixed for the epoch and an offset ``z``
that is re-quantized after every step onto ``Q_{delta_t,b}``'s grid (b-bit two's complement
codes of step ``delta_t``; :mod:`gradzip.algorithms.qesgd.codec`). Quantizing the *offset*
rather than the gradient ("bit centering") keeps the quantization error proportional to
``delta_t``, which the schedule shrinks like ``1/sqrt(t)``, so the quantization variance
vanishes as training proceeds, unlike QSGD's, which stays proportional to ``||g||^2``.

Use it like any optimizer on any ``nn.Module``::

    opt = QESGDOptimizer(model.parameters(), lr=0.5, bits=8, c=2, steps_per_epoch=len(loader))
    opt.calibrate(full_gradient(model, loss_fn, loader))   # ||grad F(w_0)||, once (spec 2.3)
    for epoch in range(epochs):
        for x, y in loader:
            opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
        # after steps_per_epoch steps the epoch ends by itself (or call opt.end_epoch())

The optimizer owns the parameters' values: after every step they hold ``u = w_t + z`` and
after an epoch ``w_{t+1}`` (the iterate average, ``output="average"``, or the last iterate,
``output="last"`` [CHOICE for deep networks]); a step refuses parameters changed from outside
in between (see :meth:`QESGDOptimizer.rebase`) rather than silently overwrite them. All parameters form one vector, quantized
whole (the paper's "whole vector", spec 2.4) or in buckets with one delta each
(``bucket_size``). Learning-rate schedulers work on ``param_groups`` as usual; the seed keeps
the rate fixed within an epoch, so step them once per epoch. Weight decay ``lambda`` adds
``lambda u`` to the gradient (spec 2.2).

Bits: each step emits one payload of ``b * d`` bits plus a header (``last_encoded``; in the
distributed Algorithm 3 it is what the server sends each worker); ``encoded_bits`` totals them.

Choosing ``c`` (the seed picks it from {1, 2, 3, 4, 5, 10}): the grid covers
``|z_i| <= |grad F(w_0)| / (c sqrt(t+1))`` at resolution ``delta_t``. A larger ``c`` means less
rounding noise but a smaller range; coordinates that would leave it are clipped (counted in
``last_clipped`` and ``clipped_total``), which holds the iterate near the epoch's anchor. Where
parameters move far within an epoch (large learning rates, recurrent networks) take a small
``c``; keep the clipped share near zero.
Non-finite gradients, or an offset update that overflows float32, raise
:class:`~gradzip.errors.NonFiniteInputError` before anything changes.

Guarantee (Theorem 3, strongly convex ``F``, Lemma 2's delta): ``E[F(w_{t+1}) - F*] <=
(1/(mu eta K) + kappa d / (mu eta 2^(2b))) E[F(w_t) - F*] + eta G^2 / 2``.

References: Zhao, Gao & Li, "Quantized Epoch-SGD for Communication-Efficient Distributed
Learning", Algorithm 2, Theorem 3; spec sections 2.1-2.3.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from gradzip.accounting import Encoded
from gradzip.algorithms.qesgd.codec import OffsetCodec
from gradzip.algorithms.qesgd.schedule import DeltaSchedule, flatten, write_flat
from gradzip.algorithms.qesgd.state import EpochState, QesgdOutput, check_output
from gradzip.codecs.symbols import Packing
from gradzip.errors import CheckpointError, GradzipError, NonFiniteInputError
from gradzip.feedback import is_count
from gradzip.keys import StreamKey
from gradzip.optimizer_state import load_optimizer_state

__all__ = ["QESGDOptimizer"]

_VERSION = 1


class QESGDOptimizer(torch.optim.Optimizer):
    """Algorithm 2 of the QESGD paper; see the module docstring.

    Parameters: ``lr`` (``eta_t``, per group), ``weight_decay`` (``lambda``, per group),
    ``bits`` (``b``), ``c`` (the schedule's constant), ``bucket_size`` (0: the whole vector),
    ``output`` ("average" or "last"), ``steps_per_epoch`` (``K_t``; None: call
    :meth:`end_epoch` yourself), ``schedule`` (a ready :class:`DeltaSchedule`, else
    :meth:`calibrate` before the first step), ``run_seed`` (the stochastic rounding's
    randomness, keyed by ``(run_seed, 0, step, 0)``, so a run is reproducible).
    """

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter] | Iterable[dict[str, Any]],
        lr: float,
        *,
        bits: int = 8,
        c: float = 1.0,
        bucket_size: int = 0,
        weight_decay: float = 0.0,
        output: QesgdOutput = "average",
        steps_per_epoch: int | None = None,
        schedule: DeltaSchedule | None = None,
        run_seed: int = 0,
        packing: Packing = "fixed",
    ) -> None:
        if not (lr > 0 and lr < float("inf")):
            raise ValueError(f"qesgd: lr must be a positive number, got {lr}")
        if not weight_decay >= 0:
            raise ValueError(f"qesgd: weight_decay must be >= 0, got {weight_decay}")
        if steps_per_epoch is not None and steps_per_epoch < 1:
            raise ValueError(f"qesgd: steps_per_epoch must be >= 1, got {steps_per_epoch}")
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay})
        self.output = check_output(output)
        self.codec = OffsetCodec(bits, bucket_size, packing)
        self.c = float(c)
        self.steps_per_epoch = steps_per_epoch
        self.run_seed = run_seed
        params_ = self._params()
        if not params_:
            raise ValueError("qesgd: no parameters with requires_grad to optimize")
        for p in params_:
            if p.dtype != torch.float32:
                raise TypeError(f"qesgd: parameters must be float32, got {p.dtype}")
        self.epoch_state = EpochState(flatten(params_))
        self.schedule: DeltaSchedule | None = None
        if schedule is not None:
            self.set_schedule(schedule)
        self.last_encoded: Encoded | None = None
        self.encoded_bits = 0
        #: coordinates clipped by the grid in the last step, and in all steps (see ``c``)
        self.last_clipped = 0
        self.clipped_total = 0

    # -- the schedule ------------------------------------------------------------------------
    def _params(self) -> list[torch.Tensor]:
        return [p for g in self.param_groups for p in g["params"] if p.requires_grad]

    def set_schedule(self, schedule: DeltaSchedule) -> None:
        """Use ``schedule`` (its bits and bucket size must be this optimizer's)."""
        if schedule.bits != self.codec.bits or schedule.bucket_size != self.codec.bucket_size:
            raise ValueError(
                f"qesgd: the schedule has bits={schedule.bits}, bucket_size="
                f"{schedule.bucket_size}; the optimizer bits={self.codec.bits}, "
                f"bucket_size={self.codec.bucket_size}"
            )
        if not schedule.fits(self.epoch_state.numel):
            raise ValueError(
                f"qesgd: the schedule has {len(schedule.norms)} norms, which does not fit "
                f"{self.epoch_state.numel} parameters in buckets of {schedule.bucket_size}"
            )
        self.schedule = schedule

    def calibrate(self, full_grad: torch.Tensor | Sequence[torch.Tensor]) -> DeltaSchedule:
        """Set the practical schedule from the full gradient at ``w_0`` (a flat vector or one
        tensor per parameter, e.g. from :func:`~gradzip.algorithms.qesgd.schedule.full_gradient`)."""
        flat = full_grad.reshape(-1) if isinstance(full_grad, torch.Tensor) else flatten(full_grad)
        if flat.numel() != self.epoch_state.numel:
            raise ValueError(
                f"qesgd: the full gradient has {flat.numel()} entries; the parameters "
                f"{self.epoch_state.numel}"
            )
        schedule = DeltaSchedule.from_gradient(
            flat, self.codec.bits, self.c, self.codec.bucket_size
        )
        self.set_schedule(schedule)
        return schedule

    def delta(self) -> torch.Tensor:
        """This epoch's ``delta_t`` (per bucket)."""
        if self.schedule is None:
            raise GradzipError(
                "qesgd: no delta schedule yet; call calibrate(full_gradient(...)) (the paper "
                "computes the full gradient once, at w_0) or pass schedule=..."
            )
        return self.schedule.delta(self.epoch_state.epoch)

    # -- stepping ----------------------------------------------------------------------------
    def _per_coordinate(self, key: str) -> float | torch.Tensor:
        values = [float(g[key]) for g in self.param_groups]
        if len(set(values)) == 1:
            return values[0]
        return torch.cat(
            [
                torch.full((p.numel(),), float(g[key]), dtype=torch.float32)
                for g in self.param_groups
                for p in g["params"]
                if p.requires_grad
            ]
        )

    def _write(self, flat: torch.Tensor) -> None:
        write_flat(self._params(), flat)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One inner step of Algorithm 2 from the parameters' ``.grad`` (missing: zeros)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        delta = self.delta()
        params = self._params()
        if not torch.equal(flatten(params), self.epoch_state.current()):
            # e.g. model.load_state_dict() after the optimizer was built: stepping would
            # silently put back the old w_t + z
            raise GradzipError(
                "qesgd: the parameters were changed outside the optimizer since its last step; "
                "call rebase() to start a new epoch from their current values, or restore the "
                "optimizer's own state_dict"
            )
        grad = flatten([p.grad if p.grad is not None else torch.zeros_like(p) for p in params])
        if not bool(torch.isfinite(grad).all()):
            raise NonFiniteInputError(
                f"qesgd: step {self.epoch_state.step}: NaN or Inf gradients; nothing was updated"
            )
        state = self.epoch_state
        z_hat = state.proposal(
            grad, self._per_coordinate("lr"), self._per_coordinate("weight_decay")
        )
        if not bool(torch.isfinite(z_hat).all()):  # finite gradients, too large a step
            raise NonFiniteInputError(
                f"qesgd: step {state.step}: the offset update overflows float32 (learning rate "
                "times gradient too large); nothing was updated"
            )
        key = StreamKey(self.run_seed, 0, state.step, 0)
        encoded = self.codec.encode(z_hat, delta, key)
        z_new = self.codec.decode(encoded.payload, delta, key, state.numel)
        clipped = self.codec.clipped(z_hat, delta)
        state.commit(z_new)
        self.last_encoded = encoded
        self.encoded_bits += encoded.wire_bits
        self.last_clipped = clipped
        self.clipped_total += clipped
        if self.steps_per_epoch is not None and state.k >= self.steps_per_epoch:
            self.end_epoch()
        else:
            self._write(state.current())
        return loss

    def rebase(self) -> None:
        """Take the parameters' current values as the anchor of a new epoch (``z = 0``), after
        they were set from outside (a loaded checkpoint, a pruning mask). The epoch counter,
        and so ``delta_t``, moves on as at an epoch's end."""
        self.epoch_state.start_epoch(flatten(self._params()))

    def end_epoch(self) -> None:
        """Close epoch ``t``: the parameters become ``w_{t+1}`` and ``z`` restarts at 0."""
        state = self.epoch_state
        state.start_epoch(state.next_anchor(self.output))
        self._write(state.anchor)

    # -- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        out = super().state_dict()
        out["qesgd"] = {
            "version": _VERSION,
            "epoch_state": self.epoch_state.state_dict(),
            "schedule": None
            if self.schedule is None
            else {"norms": list(self.schedule.norms), "c": self.schedule.c},
            "bits": self.codec.bits,
            "bucket_size": self.codec.bucket_size,
            "c": self.c,
            "output": self.output,
            "run_seed": self.run_seed,
            "encoded_bits": self.encoded_bits,
            "clipped_total": self.clipped_total,
        }
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = dict(state_dict)
        mine = state.pop("qesgd", None)
        if not isinstance(mine, dict) or mine.get("version") != _VERSION:
            raise ValueError("qesgd: not a QESGDOptimizer state_dict (or another version)")
        for name, value in (
            ("bits", self.codec.bits),
            ("bucket_size", self.codec.bucket_size),
            ("output", self.output),
            ("run_seed", self.run_seed),
        ):
            if mine[name] != value:
                raise ValueError(f"qesgd: the checkpoint has {name}={mine[name]!r}, not {value!r}")
        # every part is built and checked before anything changes
        restored = EpochState(self.epoch_state.anchor)
        restored.load_state_dict(mine["epoch_state"])
        saved = mine["schedule"]
        schedule = None
        if saved is not None:
            try:
                schedule = DeltaSchedule(
                    tuple(saved["norms"]),
                    self.codec.bits,
                    float(saved["c"]),
                    self.codec.bucket_size,
                )
            except ValueError as err:
                raise CheckpointError(
                    f"qesgd: the checkpoint's schedule is invalid: {err}"
                ) from err
            if not schedule.fits(self.epoch_state.numel):
                raise CheckpointError(
                    "qesgd: the checkpoint's schedule does not fit these parameters"
                )
        counters = {name: mine[name] for name in ("encoded_bits", "clipped_total")}
        if not all(is_count(v) for v in counters.values()):
            raise CheckpointError(f"qesgd: the checkpoint's counters {counters} must be ints >= 0")
        c = float(mine["c"])
        load_optimizer_state(self, state, super().load_state_dict)
        self.epoch_state = restored
        self.c = c
        self.schedule = None
        if schedule is not None:
            self.set_schedule(schedule)
        self.encoded_bits = counters["encoded_bits"]
        self.clipped_total = counters["clipped_total"]
        self._write(self.epoch_state.current())
