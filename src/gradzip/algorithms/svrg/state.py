"""Checkpoints of LPC-SVRG, ALPC-SVRG and the SGD baselines: validation helpers.

A checkpoint (``DistributedAlgorithm.state_dict()``) is plain, ``torch.save``-able data
(``torch.load(..., weights_only=True)`` reads it back): Python scalars, strings, lists, dicts
and CPU tensors (copies). It holds

* ``version`` and ``algorithm`` (the class name);
* ``fingerprint``: what must be the same for the state to make sense on the loading object:
  the config's fields, the resolved step sizes and epoch length (they depend on the data), the
  problem's kind, size and dtype, the prox, the rank and the group size;
* ``step`` (the rounds done, the keys' ``step``), the method's own ``tensors`` (iterates,
  epoch anchors, the epoch's full gradient) and ``scalars`` (epoch and inner counters, sums);
* ``scheme``: the scheme's buffers (ECQ-SGD's error-feedback residuals);
* ``recorder``: the trace so far and the running bit totals.

The random streams are stateless (keyed by run seed, rank and step, spec 0.4), so the step
counter is all they need: a run resumed from a checkpoint gives bit for bit the iterates,
outputs, traces and bit counts of the uninterrupted run (tested). Loading validates everything
first and raises ``ValueError`` naming the first difference; on error nothing changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

STATE_VERSION = 1


def describe_difference(saved: Mapping[str, Any], mine: Mapping[str, Any]) -> str | None:
    """The first entry in which two fingerprints differ, as ``name: saved X, here Y``."""
    for name in sorted(set(saved) | set(mine)):
        if saved.get(name, "<absent>") != mine.get(name, "<absent>"):
            return f"{name}: saved {saved.get(name, '<absent>')!r}, here {mine.get(name, '<absent>')!r}"
    return None


def copy_tensors(tensors: Mapping[str, torch.Tensor | None]) -> dict[str, torch.Tensor | None]:
    """Detached CPU copies (None stays None), so later rounds cannot change a saved state."""
    return {k: None if t is None else t.detach().to("cpu").clone() for k, t in tensors.items()}


def check_tensors(
    saved: Mapping[str, Any],
    expected: Mapping[str, tuple[tuple[int, ...], torch.dtype, bool]],
    what: str,
) -> dict[str, torch.Tensor | None]:
    """``saved`` checked against ``name -> (shape, dtype, may_be_none)``; copies of its
    tensors, or ``ValueError`` naming the first bad entry (missing, extra, wrong shape or dtype,
    NaN or Inf)."""
    if not isinstance(saved, Mapping):
        raise ValueError(f"{what}: 'tensors' must be a mapping, got {type(saved).__name__}")
    extra = sorted(set(saved) - set(expected))
    if extra:
        raise ValueError(f"{what}: unexpected tensors {extra}")
    out: dict[str, torch.Tensor | None] = {}
    for name, (shape, dtype, optional) in expected.items():
        if name not in saved:
            raise ValueError(f"{what}: tensor {name!r} is missing")
        t = saved[name]
        if t is None:
            if not optional:
                raise ValueError(f"{what}: tensor {name!r} is None")
            out[name] = None
            continue
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape or t.dtype != dtype:
            got = (tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{what}: tensor {name!r} must be {shape} {dtype}, got {got}")
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{what}: tensor {name!r} holds NaN or Inf")
        out[name] = t.detach().to("cpu").clone()
    return out


def check_counter(value: object, what: str, low: int = 0, high: int | None = None) -> int:
    """An int in ``[low, high)`` (``high`` None: unbounded), else ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be an int, got {value!r}")
    if value < low or (high is not None and value >= high):
        bound = f"[{low}, {high})" if high is not None else f">= {low}"
        raise ValueError(f"{what} must lie in {bound}, got {value}")
    return value


def epoch_counters(
    scalars: Mapping[str, Any], step: int, epochs: int, inner: int
) -> dict[str, int]:
    """Validated ``epoch`` and ``inner_step`` of an epoch-based method, consistent with
    ``step = epoch * inner + inner_step``."""
    if not {"epoch", "inner_step"} <= set(scalars):
        raise ValueError(f"scalars must hold epoch and inner_step, got {sorted(scalars)}")
    epoch = check_counter(scalars["epoch"], "epoch", 0, epochs + 1)
    inner_step = check_counter(scalars["inner_step"], "inner_step", 0, inner)
    if epoch * inner + inner_step != step:
        raise ValueError(
            f"epoch {epoch} and inner_step {inner_step} of {inner} do not add up to step {step}"
        )
    return {"epoch": epoch, "inner_step": inner_step}
