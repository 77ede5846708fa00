"""Checkpoints of one rank of distributed QESGD (Algorithm 3,
:class:`~gradzip.algorithms.qesgd.server.DistributedQESGD`): what a resumed rank needs to go on
bit for bit, and the checks that refuse a checkpoint of another run.

A checkpoint holds the rank layout (rank, world size), the settings a run must agree on (``b``,
bucketing, batch, weight decay, output, server, run seed: a resumed run with another value would
silently be another run), the epoch state (anchor, offset, offset sum, counters;
:mod:`gradzip.algorithms.qesgd.state`) and the schedule (its float32 norms and ``c``). Every
check runs before anything is restored, so a refused checkpoint changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from gradzip.algorithms.qesgd.schedule import DeltaSchedule
from gradzip.algorithms.qesgd.state import EpochState
from gradzip.errors import GradzipError

_VERSION = 1


def save(
    layout: Mapping[str, int],
    settings: Mapping[str, Any],
    state: EpochState,
    schedule: DeltaSchedule | None,
) -> dict[str, Any]:
    """The checkpoint of a rank: ``layout`` is its ``rank`` and ``world_size``, ``settings``
    what a resumed run must share (including ``bits`` and ``bucket_size``)."""
    return {
        "version": _VERSION,
        **layout,
        "settings": dict(settings),
        "epoch_state": state.state_dict(),
        "schedule": None if schedule is None else {"norms": list(schedule.norms), "c": schedule.c},
    }


def restore(
    saved: Mapping[str, Any],
    layout: Mapping[str, int],
    settings: Mapping[str, Any],
    anchor: torch.Tensor,
) -> tuple[EpochState, DeltaSchedule | None]:
    """The epoch state and schedule of the checkpoint ``saved``, after checking it against this
    rank's ``layout`` and ``settings``; ``anchor`` is this rank's current ``w_t`` (its size is
    what the saved tensors must have)."""
    if saved.get("version") != _VERSION:
        raise ValueError("qesgd: not a DistributedQESGD state_dict (or another version)")
    for name, mine in layout.items():
        if saved[name] != mine:
            raise GradzipError(
                f"qesgd: the checkpoint was saved with {name} {saved[name]}, not {mine}"
            )
    for name, value in settings.items():
        if saved["settings"][name] != value:
            raise ValueError(
                f"qesgd: the checkpoint has {name}={saved['settings'][name]!r}, not {value!r}"
            )
    restored = EpochState(anchor)
    restored.load_state_dict(saved["epoch_state"])
    schedule = None
    if saved["schedule"] is not None:
        schedule = DeltaSchedule(
            tuple(saved["schedule"]["norms"]),
            settings["bits"],
            float(saved["schedule"]["c"]),
            settings["bucket_size"],
        )
        if not schedule.fits(anchor.numel()):
            raise ValueError("qesgd: the checkpoint's schedule does not fit these parameters")
    return restored, schedule
