"""Loading a ``torch.optim`` optimizer's state all or nothing.

``torch.optim.Optimizer.load_state_dict`` checks the group and parameter counts, but a state
whose entries are missing or malformed fails half way (``KeyError: 'param_groups'``) or is only
noticed at the next step. gradzip's front ends validate every part of a checkpoint before they
change anything, so the optimizer part is checked here first, and restored if torch still
refuses it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import torch

from gradzip.errors import CheckpointError


def check_optimizer_state(optimizer: torch.optim.Optimizer, state: object) -> None:
    """Raise :class:`CheckpointError` unless ``state`` has the structure of
    ``optimizer.state_dict()``: a ``state`` mapping and the same number of parameter groups,
    each listing as many parameters as this optimizer's."""
    if not isinstance(state, Mapping):
        raise CheckpointError(f"optimizer state must be a mapping, got {type(state).__name__}")
    missing = [name for name in ("state", "param_groups") if name not in state]
    if missing:
        raise CheckpointError(f"optimizer state lacks {', '.join(missing)}")
    groups = state["param_groups"]
    if not isinstance(state["state"], Mapping) or not isinstance(groups, (list, tuple)):
        raise CheckpointError("optimizer state has a malformed 'state' or 'param_groups'")
    mine = optimizer.param_groups
    if len(groups) != len(mine):
        raise CheckpointError(
            f"optimizer state has {len(groups)} parameter groups, this optimizer {len(mine)}"
        )
    for index, (group, own) in enumerate(zip(groups, mine, strict=True)):
        params = group.get("params") if isinstance(group, Mapping) else None
        if not isinstance(params, (list, tuple)) or len(params) != len(own["params"]):
            raise CheckpointError(
                f"optimizer state's parameter group {index} does not list "
                f"{len(own['params'])} parameters"
            )


def load_optimizer_state(
    optimizer: torch.optim.Optimizer,
    state: Any,
    load: Callable[[Any], None] | None = None,
) -> None:
    """Check ``state``, then load it with ``load`` (default ``optimizer.load_state_dict``; a
    subclass passes its ``super().load_state_dict``); if torch refuses it, the optimizer's
    previous state is restored and :class:`CheckpointError` raised."""
    check_optimizer_state(optimizer, state)
    loader = load if load is not None else optimizer.load_state_dict
    saved = copy.deepcopy(optimizer.state_dict())
    try:
        loader(state)
    except Exception as err:
        loader(saved)
        raise CheckpointError(f"optimizer state was refused: {err}") from err
