"""An optimizer wrapper: ``loss.backward(); opt.step()`` with compressed, averaged gradients."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from gradzip.errors import CheckpointError
from gradzip.optimizer_state import load_optimizer_state
from gradzip.sync import GradientSync


class CompressedOptimizer:
    """Wraps any ``torch.optim`` optimizer: :meth:`step` first replaces every parameter's
    gradient by the rank-average that :class:`~gradzip.sync.GradientSync` computes (compressed
    payloads, exchanged over its transport), then steps the inner optimizer.

    With ``GradientSync(on_nonfinite="skip")``, a step where some rank has NaN or Inf gradients
    leaves every rank's parameters and optimizer state untouched and returns ``None``.

    Every parameter with ``requires_grad`` takes part, in ``param_groups`` order (a missing
    gradient counts as zeros), so all ranks exchange the same tensors.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, sync: GradientSync) -> None:
        self.optimizer = optimizer
        self.sync = sync

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    def _parameters(self) -> list[torch.nn.Parameter]:
        return [p for g in self.optimizer.param_groups for p in g["params"] if p.requires_grad]

    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        params = self._parameters()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        means = self.sync.synchronize([g.detach() for g in grads])
        if means is None:  # every rank skips this step (non-finite gradients, opt-in)
            return None
        for p, mean in zip(params, means, strict=True):
            p.grad = mean.to(device=p.device, dtype=p.dtype)
        return self.optimizer.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """The inner optimizer's state and the synchronisation state."""
        return {"optimizer": self.optimizer.state_dict(), "sync": self.sync.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`, atomically: the synchronisation part is validated,
        then the inner optimizer's is loaded (and restored if torch refuses it), and only then
        is the synchronisation state installed. A refused state raises
        :class:`~gradzip.errors.CheckpointError` and changes nothing."""
        if not isinstance(state, Mapping) or not {"optimizer", "sync"} <= set(state):
            found = sorted(state) if isinstance(state, Mapping) else type(state).__name__
            raise CheckpointError(
                f"CompressedOptimizer state needs 'optimizer' and 'sync' entries, got {found}"
            )
        parsed = self.sync.parse_state(state["sync"])
        load_optimizer_state(self.optimizer, state["optimizer"])
        self.sync.install_state(parsed)
