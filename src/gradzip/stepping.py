"""What every synchronisation front end (optimizer wrapper, DDP hook) shares: the agreement
that all gradients are finite, and a checkpoint of the step counter and the scheme's state."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from gradzip.comm.transport import Transport
from gradzip.errors import GradzipError, NonFiniteInputError
from gradzip.schemes.base import Scheme

ON_NONFINITE = ("raise", "skip")


def check_on_nonfinite(value: str) -> str:
    if value not in ON_NONFINITE:
        raise ValueError(f"on_nonfinite must be one of {ON_NONFINITE}, got {value!r}")
    return value


def agree_all_finite(
    transport: Transport,
    tensors: Sequence[torch.Tensor],
    step: int,
    on_nonfinite: str,
    where: str,
    advice: str = "",
) -> bool:
    """Whether every rank's ``tensors`` are finite (one flag byte all-gathered, counted under
    the collective ``"finite_check"``).

    With ``on_nonfinite="raise"`` a NaN or Inf on any rank raises
    :class:`~gradzip.errors.NonFiniteInputError` on every rank, naming the ranks; with
    ``"skip"`` every rank gets ``False`` and can skip consistently.
    """
    finite = all(bool(torch.isfinite(t).all()) for t in tensors)
    transport.meter.step = step
    flags = transport.all_gather_bytes(b"\x01" if finite else b"\x00", "finite_check")
    bad = [rank for rank, flag in enumerate(flags) if flag != b"\x01"]
    if bad and on_nonfinite == "raise":
        raise NonFiniteInputError(
            f"step {step}{where}: rank(s) {bad} have NaN or Inf gradients; no rank applied "
            f"anything (error-feedback state and step counter unchanged){advice}"
        )
    return not bad


def step_state(
    version: int, step: int, skipped: int, transport: Transport, scheme: Scheme
) -> dict[str, Any]:
    """The checkpoint: counters, run seed, rank, group size and the scheme's buffers."""
    return {
        "version": version,
        "step": step,
        "skipped_steps": skipped,
        "run_seed": scheme.run_seed,
        "rank": transport.rank,
        "world_size": transport.world_size,
        "scheme": scheme.state_dict(),
    }


def load_step_state(
    state: Mapping[str, Any], version: int, what: str, transport: Transport, scheme: Scheme
) -> tuple[int, int]:
    """Validate ``state`` (version, run seed, rank, group size, counters), load the scheme's
    buffers from it and return ``(step, skipped_steps)``; nothing changes on error."""
    if state.get("version") != version:
        raise ValueError(f"{what} has version {state.get('version')!r}, expected {version}")
    for name, mine in (
        ("run_seed", scheme.run_seed),
        ("rank", transport.rank),
        ("world_size", transport.world_size),
    ):
        if state[name] != mine:
            raise GradzipError(f"{what} was saved with {name} {state[name]}, not {mine}")
    step, skipped = int(state["step"]), int(state["skipped_steps"])
    if step < 0 or skipped < 0:
        raise ValueError(f"{what} has step {step} and skipped_steps {skipped}")
    try:
        scheme.load_state_dict(state["scheme"])
    except ValueError as err:
        raise GradzipError(f"{what} does not fit this scheme: {err}") from err
    return step, skipped
