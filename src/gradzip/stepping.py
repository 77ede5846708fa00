"""What every synchronisation front end (optimizer wrapper, DDP hook) shares: the agreement
that all gradients are finite (riding on the first message of the reduction,
:func:`reduce_all_finite`, or on a message of its own, :func:`agree_all_finite`), and a
checkpoint of the step counter and the scheme's state."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from gradzip.choices import check_choice, choices_of
from gradzip.comm.transport import Transport
from gradzip.errors import CheckpointError, NonFiniteInputError
from gradzip.feedback import Slot, is_count
from gradzip.finite import all_finite
from gradzip.schemes.base import FINITE_CHECK, Scheme

#: what a step does when some rank's gradient holds NaN or Inf: raise
#: :class:`~gradzip.errors.NonFiniteInputError` on every rank, or skip the step on every rank
OnNonfinite = Literal["raise", "skip"]
ON_NONFINITE: tuple[OnNonfinite, ...] = choices_of(OnNonfinite)


def check_on_nonfinite(value: OnNonfinite) -> OnNonfinite:
    return check_choice("on_nonfinite", value, ON_NONFINITE)


def agree_all_finite(
    transport: Transport,
    tensors: Sequence[torch.Tensor],
    step: int,
    on_nonfinite: OnNonfinite,
    where: str,
    advice: str = "",
) -> bool:
    """Whether every rank's ``tensors`` are finite, on a message of its own (one flag byte
    all-gathered, counted under the collective ``"finite_check"``): for callers with no
    reduction to carry the flag (:func:`reduce_all_finite` spends no message on it).

    With ``on_nonfinite="raise"`` a NaN or Inf on any rank raises
    :class:`~gradzip.errors.NonFiniteInputError` on every rank, naming the ranks; with
    ``"skip"`` every rank gets ``False`` and can skip consistently.
    """
    finite = all_finite(tensors)
    flag = b"\x01" if finite else b"\x00"
    with transport.step_scope(step):
        _, down = transport.all_gather_flagged(flag, finite, FINITE_CHECK)
    return nonfinite_verdict(down, step, on_nonfinite, where, advice)


def reduce_all_finite(
    transport: Transport,
    scheme: Scheme,
    tensors: Sequence[torch.Tensor],
    indices: Sequence[int],
    step: int,
    on_nonfinite: OnNonfinite,
    where: str,
    advice: str = "",
) -> list[torch.Tensor] | None:
    """The scheme's means of ``tensors`` (tensor index ``indices[i]``) once every rank agreed
    that all its ``tensors`` are finite
    (:meth:`~gradzip.schemes.base.Scheme.reduce_many_if_all_finite`); the agreement rides on
    the first message: for the allgather scheme and PowerSGD it costs no byte and no round.

    A NaN or Inf on any rank: with ``on_nonfinite="raise"``,
    :class:`~gradzip.errors.NonFiniteInputError` on every rank, naming the ranks; with
    ``"skip"``, ``None`` on every rank. In both cases the scheme's buffers may have changed
    (the first tensor was encoded on the finite ranks): restore the scheme's
    :meth:`~gradzip.schemes.base.Scheme.snapshot` taken before the call, as after any
    failure. Means are the scheme's (working dtype, on the CPU).
    """
    if len(tensors) != len(indices):
        raise ValueError(f"{len(tensors)} tensors but {len(indices)} tensor indices")
    if not tensors:
        agree_all_finite(transport, tensors, step, on_nonfinite, where, advice)
        return []
    means, down = scheme.reduce_many_if_all_finite(
        transport, tensors, indices, step, _finite_flag(scheme, tensors)
    )
    if down:
        nonfinite_verdict(down, step, on_nonfinite, where, advice)
        return None
    return means


def _finite_flag(scheme: Scheme, tensors: Sequence[torch.Tensor]) -> bool:
    """This rank's flag for ``tensors``: whether they are all finite, as far as the scheme's
    encoders do not check it themselves.

    [CHOICE] Where the flag rides on the first message and that message is the first tensor's
    own payload (:attr:`~gradzip.schemes.base.Scheme.flag_rides_on_payload`: the allgather
    scheme), the first tensor is not scanned beforehand: its encoder scans it anyway (the
    absmax of :meth:`~gradzip.compressors.base.Compressor.encode`) and refuses NaN and Inf with
    :class:`~gradzip.errors.NonFiniteInputError` before anything is sent or any state changes,
    and the flag goes down (an empty payload is sent). That refusal also covers a
    float64 value beyond the float32 range and an error-feedback sum ``g + e`` that overflows,
    which the encoder refuses while a scan would pass them: every rank then stops together
    instead of one rank failing alone. A scheme whose first message encodes every tensor
    (:attr:`~gradzip.schemes.base.Scheme.encodes_all_before_sending`, PowerSGD) scans none.
    """
    if scheme.encodes_all_before_sending:
        return True
    head, rest = tensors[0], tensors[1:]
    return all_finite(rest) and (scheme.flag_rides_on_payload or all_finite([head]))


def nonfinite_verdict(
    down: list[int], step: int, on_nonfinite: OnNonfinite, where: str, advice: str = ""
) -> bool:
    """What the ranks whose flag is down (``down``, ascending, the same on every rank) mean for
    the step: True when there are none; else a :class:`~gradzip.errors.NonFiniteInputError`
    naming them (``on_nonfinite="raise"``) or False (``"skip"``)."""
    if down and on_nonfinite == "raise":
        raise NonFiniteInputError(
            f"step {step}{where}: rank(s) {down} have NaN or Inf gradients; no rank applied "
            f"anything (error-feedback state and step counter unchanged){advice}"
        )
    return not down


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


@dataclass(frozen=True)
class StepState:
    """A validated checkpoint of a synchronisation front end, ready to install."""

    step: int
    skipped_steps: int
    buffers: dict[str, dict[Slot, torch.Tensor]]


def parse_step_state(
    state: Mapping[str, Any], version: int, what: str, transport: Transport, scheme: Scheme
) -> StepState:
    """Validate ``state`` (version, run seed, rank, group size, counters, the scheme's buffers)
    without changing anything; raises :class:`~gradzip.errors.CheckpointError` naming the
    problem (a run seed, rank or group size of another run included)."""
    if not isinstance(state, Mapping) or state.get("version") != version:
        found = state.get("version") if isinstance(state, Mapping) else type(state).__name__
        raise CheckpointError(f"{what} has version {found!r}, expected {version}")
    missing = [
        name
        for name in ("run_seed", "rank", "world_size", "step", "skipped_steps", "scheme")
        if name not in state
    ]
    if missing:
        raise CheckpointError(f"{what} lacks {', '.join(missing)}")
    for name, mine in (
        ("run_seed", scheme.run_seed),
        ("rank", transport.rank),
        ("world_size", transport.world_size),
    ):
        if state[name] != mine:
            raise CheckpointError(f"{what} was saved with {name} {state[name]}, not {mine}")
    step, skipped = state["step"], state["skipped_steps"]
    if not (is_count(step) and is_count(skipped)):
        raise CheckpointError(
            f"{what} has step {step!r} and skipped_steps {skipped!r}; both must be ints >= 0"
        )
    try:
        buffers = scheme.parse_state(state["scheme"])
    except CheckpointError as err:
        raise CheckpointError(f"{what} does not fit this scheme: {err}") from err
    return StepState(step, skipped, buffers)


def install_step_state(parsed: StepState, scheme: Scheme) -> tuple[int, int]:
    """Load a :func:`parse_step_state` result into ``scheme`` (cannot fail) and return
    ``(step, skipped_steps)`` for the front end's counters."""
    scheme.restore(parsed.buffers)
    return parsed.step, parsed.skipped_steps
