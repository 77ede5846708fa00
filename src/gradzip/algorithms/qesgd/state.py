"""One epoch of QESGD as explicit state: the anchor ``w_t``, the quantized offset ``z``, the
running sum of the offsets, and the counters. Algorithm 2 (one machine) and the server of
Algorithm 3 both step this object, so the two cannot drift apart.

Per inner step ``k`` (spec 2.2): ``S += z`` (the iterate ``u_{t,k} = w_t + z_{t,k}`` enters the
average before it moves), ``z_hat = z - eta (g + lambda u)`` with ``g`` the mini-batch mean
gradient at ``u`` and ``lambda`` the weight decay, ``z <- Q_{delta_t,b}(z_hat)``. At the end of
the epoch ``w_{t+1} = w_t + S / K_t`` (``output="average"``: the seed's
``(1/K_t) sum_{k<K_t} u_{t,k}``, with ``z_{t,0} = 0``) or ``w_t + z_{t,K_t}`` (``output="last"``,
[CHOICE] for deep networks, spec 2.2), and the next epoch starts from ``z = 0``.

Everything a receiver must match is float32; the offset sum is float64 so that averaging
hundreds of steps adds no rounding drift. The object is updated only by :meth:`commit` and
:meth:`start_epoch`, after every check and every message of a step has succeeded, so a failed
step leaves it unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import torch

from gradzip.choices import check_choice, choices_of

#: the point an epoch ends at: the running average of its iterates, or its last iterate
QesgdOutput = Literal["average", "last"]
OUTPUTS: tuple[QesgdOutput, ...] = choices_of(QesgdOutput)


def check_output(output: QesgdOutput) -> QesgdOutput:
    return check_choice("output", output, OUTPUTS, "qesgd")


class EpochState:
    """``w_t``, ``z``, ``sum_k z_{t,k}``, ``k``, the epoch index ``t`` and the global step."""

    def __init__(self, w0: torch.Tensor) -> None:
        w0 = w0.detach().reshape(-1).to(torch.float32).cpu()
        if not bool(torch.isfinite(w0).all()):
            raise ValueError("qesgd: the initial parameters hold NaN or Inf")
        self.anchor = w0.clone()
        self.z = torch.zeros_like(self.anchor)
        self.zsum = torch.zeros(self.anchor.numel(), dtype=torch.float64)
        self.k = 0  # inner steps taken in this epoch
        self.epoch = 0  # t
        self.step = 0  # inner steps taken since the start (the payload keys' step)

    @property
    def numel(self) -> int:
        return self.anchor.numel()

    def current(self) -> torch.Tensor:
        """``u = w_t + z``: where the next gradient is taken (a fresh tensor)."""
        return self.anchor + self.z

    def proposal(
        self, grad: torch.Tensor, lr: float | torch.Tensor, weight_decay: float | torch.Tensor
    ) -> torch.Tensor:
        """``z_hat = z - lr * (grad + weight_decay * u)`` (float32; ``lr`` and
        ``weight_decay`` may be per-coordinate vectors, for parameter groups)."""
        step = grad.reshape(-1).to(torch.float32)
        if not isinstance(weight_decay, torch.Tensor) and weight_decay == 0:
            return self.z - lr * step
        return self.z - lr * (step + weight_decay * self.current())

    def commit(self, z_new: torch.Tensor) -> None:
        """Accept the step's quantized offset (``u_{t,k}`` joins the average first)."""
        self.zsum += self.z
        self.z = z_new.reshape(-1).to(torch.float32)
        self.k += 1
        self.step += 1

    def next_anchor(self, output: QesgdOutput) -> torch.Tensor:
        """``w_{t+1}`` as the epoch stands (float32; ``w_t`` if no step was taken)."""
        return self._anchor_after(self.z, self.zsum, self.k, output)

    def preview_anchor(self, z_new: torch.Tensor, output: QesgdOutput) -> torch.Tensor:
        """``w_{t+1}`` if the epoch ended after committing ``z_new``, without changing
        anything (so a step can finish its messages before it commits)."""
        z_new = z_new.reshape(-1).to(torch.float32)
        return self._anchor_after(z_new, self.zsum + self.z, self.k + 1, output)

    def _anchor_after(
        self, z_last: torch.Tensor, zsum: torch.Tensor, k: int, output: QesgdOutput
    ) -> torch.Tensor:
        """``w_t + z_last`` ("last") or ``w_t`` plus the mean of the epoch's ``k`` offsets
        summed in ``zsum`` ("average"; ``w_t`` when ``k = 0``)."""
        if check_output(output) == "last":
            return self.anchor + z_last
        if k == 0:
            return self.anchor.clone()
        return (self.anchor.to(torch.float64) + zsum / k).to(torch.float32)

    def start_epoch(self, w_next: torch.Tensor) -> None:
        """Begin epoch ``t + 1`` at ``w_next`` with ``z = 0``."""
        self.anchor = w_next.reshape(-1).to(torch.float32).clone()
        self.z.zero_()
        self.zsum.zero_()
        self.k = 0
        self.epoch += 1

    def state_dict(self) -> dict[str, Any]:
        return {
            "anchor": self.anchor.clone(),
            "z": self.z.clone(),
            "zsum": self.zsum.clone(),
            "k": self.k,
            "epoch": self.epoch,
            "step": self.step,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict` (checked against this state's size first)."""
        tensors = {name: state[name] for name in ("anchor", "z", "zsum")}
        for name, value in tensors.items():
            if not isinstance(value, torch.Tensor) or value.numel() != self.numel:
                raise ValueError(f"qesgd state: {name} does not have {self.numel} elements")
        counters = {name: int(state[name]) for name in ("k", "epoch", "step")}
        if min(counters.values()) < 0:
            raise ValueError(f"qesgd state: negative counters {counters}")
        self.anchor = tensors["anchor"].reshape(-1).to(torch.float32).clone()
        self.z = tensors["z"].reshape(-1).to(torch.float32).clone()
        self.zsum = tensors["zsum"].reshape(-1).to(torch.float64).clone()
        self.k, self.epoch, self.step = counters["k"], counters["epoch"], counters["step"]
