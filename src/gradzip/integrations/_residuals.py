"""Error-feedback residuals kept per parameter, re-assembled around each bucket's reduction.

[CHOICE] The scheme's :class:`~gradzip.feedback.ErrorFeedback` objects key residuals by
``(tensor_index, chunk)`` of the tensor they saw, but a DDP bucket is not a stable tensor: DDP
rebuilds its buckets after the first iteration (and a resumed run may use another
``bucket_cap_mb``). So the hook keeps every residual element with the parameter it belongs to:
before a bucket is reduced, each slot the scheme will use is assembled from its parameters'
pieces and installed in the scheme (``ErrorFeedback.restore``); afterwards the slots the scheme
replaced are cut back into per-parameter pieces, and the scheme's own dictionaries are emptied
again. In a stable layout this costs no copy: the pieces are views of the slot tensor the scheme
produced, and the next step installs that tensor itself.

An element keeps one value per role. Where a role does not cover an element in the current
layout (the ring's allgather residual covers only the slice a rank owns), its value waits in the
store until a layout covers it again: a rebuild that moves an element to another owner leaves
at most one requantization error of it unapplied.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from gradzip.comm.transport import Transport
from gradzip.compressors.base import empty_output
from gradzip.errors import CheckpointError, GradzipError
from gradzip.feedback import Slot, is_count, working_dtype
from gradzip.integrations._layout import BucketLayout, FeedbackSlice, feedback_slices
from gradzip.schemes.base import Scheme

_STATE_VERSION = 1


@dataclass(frozen=True)
class Piece:
    """One parameter's residual in one role: ``values`` is ``base[start : start + numel]``."""

    values: torch.Tensor
    base: torch.Tensor
    start: int


Entries = dict[str, dict[int, Piece]]
#: what a bucket's reduction returns: its mean, or (pipelined) the payload it encoded
Result = TypeVar("Result")
#: a bucket's reduction: ``(flat buffer, tensor_index) -> result``, or ``None`` if it was skipped
Reduction = Callable[[torch.Tensor, int], Result | None]


class ResidualStore:
    """Per ``(role, parameter)`` residuals of a scheme run on flat buckets (see the module)."""

    def __init__(self, roles: tuple[str, ...], numels: list[int], dtypes: list[torch.dtype]):
        self._numels = numels
        self._dtypes = [working_dtype(d) for d in dtypes]
        self._entries: Entries = {role: {} for role in roles}

    # -- one bucket ---------------------------------------------------------------------------
    def reduce(
        self,
        scheme: Scheme,
        transport: Transport,
        flat: torch.Tensor,
        layout: BucketLayout,
        reduce: Reduction[Result],
        slices: dict[str, list[FeedbackSlice]] | None = None,
    ) -> Result | None:
        """``reduce(flat, tensor_index)`` (a reduction through ``scheme``, or its encoding
        phase; ``None`` when the ranks skipped it) with this store's residuals installed in
        ``scheme`` around it; the store changes only if the reduction returns a result.
        ``slices``: the residual slots the reduction keeps, per role (default: what
        :func:`~gradzip.integrations._layout.feedback_slices` says of the scheme)."""
        index = layout.tensor_index
        if not scheme.feedback:
            return reduce(flat, index)
        if slices is None:
            slices = feedback_slices(scheme, layout.numel, transport.world_size, transport.rank)
        dtype = working_dtype(flat.dtype)
        installed: dict[str, dict[Slot, torch.Tensor]] = {}
        for role, feedback in scheme.feedback.items():
            installed[role] = {
                (index, chunk): self._gather(role, layout, lo, hi, dtype)
                for chunk, lo, hi in slices[role]
            }
            feedback.restore(installed[role])
        try:
            result = reduce(flat, index)
            produced = {role: feedback.snapshot() for role, feedback in scheme.feedback.items()}
        finally:
            for feedback in scheme.feedback.values():
                feedback.restore({})
        if result is None:
            return None
        updates = self._check(scheme, produced, slices, installed, index)
        for role in scheme.feedback:
            self._scatter(role, layout, [u[1:] for u in updates if u[0] == role])
        return result

    def _check(
        self,
        scheme: Scheme,
        produced: dict[str, dict[Slot, torch.Tensor]],
        slices: dict[str, list[FeedbackSlice]],
        installed: dict[str, dict[Slot, torch.Tensor]],
        index: int,
    ) -> list[tuple[str, int, int, torch.Tensor]]:
        """The residuals the scheme replaced, each with its place in the buffer; raises if the
        scheme kept a slot the layout does not describe."""
        updates = []
        for role, slots in produced.items():
            places = {(index, chunk): (lo, hi) for chunk, lo, hi in slices[role]}
            for slot, residual in slots.items():
                place = places.get(slot)
                if place is None or residual.numel() != place[1] - place[0]:
                    raise GradzipError(
                        f"the {scheme.name} scheme kept an error-feedback residual of "
                        f"{residual.numel()} elements in role {role!r}, slot {slot}, which the "
                        "DDP hook cannot place in the bucket (expected slots "
                        f"{sorted(places.items())})"
                    )
                if residual is not installed[role].get(slot):
                    updates.append((role, *place, residual.reshape(-1)))
        return updates

    def _gather(
        self, role: str, layout: BucketLayout, lo: int, hi: int, dtype: torch.dtype
    ) -> torch.Tensor:
        entries = self._entries[role]
        parts: list[tuple[Piece | None, int, int]] = [
            (entries.get(param), oa - a, ob - a) for param, a, _, oa, ob in layout.overlaps(lo, hi)
        ]
        only = parts[0][0] if len(parts) == 1 else None
        if only is not None and only.values.dtype == dtype:
            # the slot lies within one parameter's residual: a view of it (the scheme reads
            # residuals, it never writes them), whether the parameter spans several slots or
            # the slot is exactly the tensor the scheme produced last time
            return only.values[parts[0][1] : parts[0][2]]
        # steady state: the slot is exactly the tensor the scheme produced last time
        first = parts[0][0] if parts else None
        if first is not None:
            base, position = first.base, 0
            for piece, start, end in parts:
                if piece is None or piece.base is not base or piece.start + start != position:
                    break
                position += end - start
            else:
                if position == base.numel() and base.dtype == dtype:
                    return base
        return torch.cat(
            [
                torch.zeros(end - start, dtype=dtype)
                if piece is None
                else piece.values[start:end].to(dtype)
                for piece, start, end in parts
            ]
        )

    def _scatter(
        self, role: str, layout: BucketLayout, residuals: list[tuple[int, int, torch.Tensor]]
    ) -> None:
        """Install the new residuals ``(lo, hi, values)`` of one role's slots, parameter by
        parameter: a parameter that one slot covers exactly keeps a view of that slot; one that
        several slots share (a chunked bucket) or that a slot covers in part is rebuilt once,
        from the new pieces and, where no slot covered it, its old values."""
        # entries are replaced, never written in place, so a snapshot is a dict copy
        entries = self._entries[role]
        # per parameter: (start, end) within it, the slot's tensor, and where the piece starts
        # in that tensor
        pieces: dict[int, list[tuple[int, int, torch.Tensor, int]]] = {}
        sizes: dict[int, int] = {}
        for lo, _, residual in residuals:
            for param, a, b, oa, ob in layout.overlaps(lo, lo + residual.numel()):
                pieces.setdefault(param, []).append((oa - a, ob - a, residual, oa - lo))
                sizes[param] = b - a
        for param, parts in pieces.items():
            size = sizes[param]
            if len(parts) == 1 and parts[0][:2] == (0, size):
                _, _, residual, offset = parts[0]
                entries[param] = Piece(residual[offset : offset + size], residual, offset)
                continue
            parts.sort(key=lambda part: part[0])
            slices = [
                residual[offset : offset + end - start] for start, end, residual, offset in parts
            ]
            if sum(end - start for start, end, _, _ in parts) == size:
                # the slots cover the parameter: one copy, into recycled memory (a fresh
                # 64 MB tensor cost 10-70 ms of page faults here, on the critical path: the
                # bucket's last chunk is handed on only after this)
                values = torch.cat(slices, out=empty_output(size, slices[0].dtype))
            else:
                old = entries.get(param)
                dtype = slices[0].dtype
                values = (
                    torch.zeros(size, dtype=dtype)
                    if old is None
                    else old.values.to(dtype, copy=True)
                )
                for (start, end, _, _), piece in zip(parts, slices, strict=True):
                    values[start:end] = piece
            entries[param] = Piece(values, values, 0)

    # -- restore points and checkpoints -------------------------------------------------------
    def snapshot(self) -> Entries:
        return {role: dict(entries) for role, entries in self._entries.items()}

    def restore(self, snapshot: Entries) -> None:
        self._entries = {role: dict(entries) for role, entries in snapshot.items()}

    def state_dict(self) -> dict[str, Any]:
        """Per role, the parameter indices and their residuals (flat CPU copies)."""
        roles = {}
        for role, entries in self._entries.items():
            order = sorted(entries)
            roles[role] = {
                "param": order,
                "residual": [entries[p].values.clone() for p in order],
            }
        return {"version": _STATE_VERSION, "roles": roles}

    def parse_state(self, state: Any) -> Entries:
        """The entries :meth:`restore` would install from a :meth:`state_dict`, after every
        check; raises :class:`~gradzip.errors.CheckpointError` naming the problem."""
        if not isinstance(state, Mapping) or state.get("version") != _STATE_VERSION:
            found = state.get("version") if isinstance(state, Mapping) else type(state).__name__
            raise CheckpointError(f"hook residual state has version {found!r}")
        roles = state.get("roles")
        if not isinstance(roles, Mapping) or set(roles) != set(self._entries):
            found = sorted(roles) if isinstance(roles, Mapping) else roles
            raise CheckpointError(
                f"hook residual state has roles {found}, this scheme keeps {sorted(self._entries)}"
            )
        return {role: self._parse_role(role, roles[role]) for role in self._entries}

    def _parse_role(self, role: str, state: Any) -> dict[int, Piece]:
        try:
            params, residuals = list(state["param"]), list(state["residual"])
        except (KeyError, TypeError) as err:
            raise CheckpointError(f"hook residuals of role {role!r} lack their lists") from err
        if len(params) != len(residuals):
            raise CheckpointError(f"hook residuals of role {role!r}: lists differ in length")
        parsed: dict[int, Piece] = {}
        for param, residual in zip(params, residuals, strict=True):
            if not is_count(param) or param >= len(self._numels):
                raise CheckpointError(
                    f"hook residual of role {role!r} names parameter {param!r}; this model has "
                    f"{len(self._numels)} parameters that require grad"
                )
            if param in parsed:
                raise CheckpointError(
                    f"hook residual of role {role!r} lists parameter {param} twice"
                )
            shape, dtype = (self._numels[param],), self._dtypes[param]
            if not isinstance(residual, torch.Tensor) or (residual.shape, residual.dtype) != (
                shape,
                dtype,
            ):
                found = (
                    (tuple(residual.shape), residual.dtype)
                    if isinstance(residual, torch.Tensor)
                    else type(residual).__name__
                )
                raise CheckpointError(
                    f"hook residual of role {role!r}, parameter {param} is {found}; expected "
                    f"{shape} {dtype}"
                )
            if not bool(torch.isfinite(residual).all()):
                raise CheckpointError(
                    f"hook residual of role {role!r}, parameter {param} holds NaN or Inf"
                )
            values = residual.detach().to("cpu", copy=True)
            parsed[param] = Piece(values, values, 0)
        return parsed
