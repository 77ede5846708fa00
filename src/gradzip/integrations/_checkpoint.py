"""The hook's checkpoint: the step counters and the scheme's buffers, checked against the model.

The format is versioned (:data:`STATE_VERSION`); a hook checkpoint of the same version loads
into any buckets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from gradzip.comm.transport import Transport
from gradzip.errors import CheckpointError
from gradzip.feedback import Slot, working_dtype
from gradzip.schemes.base import Scheme
from gradzip.stepping import StepState, parse_step_state, step_state

#: 3: the scheme's own buffers, slots keyed by (parameter, piece); 2 kept per-bucket-element
#: residuals beside the scheme and is refused
STATE_VERSION = 3


class HookCheckpoint:
    """Saves and validates the hook's state for a model's parameters (their ``shapes`` and
    ``dtypes``, model order) and the hook's ``chunk_elements``."""

    def __init__(
        self, shapes: Sequence[torch.Size], dtypes: Sequence[torch.dtype], chunk_elements: int
    ) -> None:
        self.shapes = list(shapes)
        self.dtypes = list(dtypes)
        self.chunk_elements = chunk_elements

    def save(
        self, step: int, skipped_steps: int, transport: Transport, scheme: Scheme
    ) -> dict[str, Any]:
        """The checkpoint (``torch.save``-able): the counters, run seed, rank and group size,
        the scheme's buffers, the parameters' shapes and ``chunk_elements``."""
        state = step_state(STATE_VERSION, step, skipped_steps, transport, scheme)
        state["shapes"] = [list(shape) for shape in self.shapes]
        state["chunk_elements"] = self.chunk_elements
        return state

    def parse(self, state: Mapping[str, Any], transport: Transport, scheme: Scheme) -> StepState:
        """Validate ``state`` without changing anything: the run seed, rank, group size, the
        parameters' shapes and (for a scheme that cuts parameters into pieces) ``chunk_elements``
        must match, and every buffer must name a parameter (and fit its piece); raises
        :class:`~gradzip.errors.CheckpointError` naming the problem."""
        parsed = parse_step_state(state, STATE_VERSION, "DDP hook state", transport, scheme)
        shapes = [list(shape) for shape in self.shapes]
        if state.get("shapes") != shapes:
            raise CheckpointError(
                f"DDP hook state was saved for parameters of shapes {state.get('shapes')}, this "
                f"model's parameters that require grad have shapes {shapes}"
            )
        if scheme.pipelines and state.get("chunk_elements") != self.chunk_elements:
            raise CheckpointError(
                f"DDP hook state was saved with chunk_elements={state.get('chunk_elements')!r}, "
                f"this hook state has {self.chunk_elements}: its parameters' pieces (and their "
                "residuals) would differ"
            )
        for role, slots in parsed.buffers.items():
            for slot, tensor in slots.items():
                self._check_slot(scheme, role, slot, tensor)
        return parsed

    def _check_slot(self, scheme: Scheme, role: str, slot: Slot, tensor: torch.Tensor) -> None:
        """Refuse a checkpointed buffer that names no parameter of this model, or (where the
        scheme says which residuals it keeps) whose shape is not that of its parameter's
        piece."""
        param, piece = slot
        if param >= len(self.shapes):
            raise CheckpointError(
                f"DDP hook state holds a {role!r} buffer for parameter {param}; this model has "
                f"{len(self.shapes)} parameters that require grad"
            )
        residuals = scheme.residual_shapes(self.shapes[param], self.chunk_elements)
        if residuals is None:
            return
        expected = residuals[piece] if piece < len(residuals) else None
        dtype = working_dtype(self.dtypes[param])
        if expected is None or (tensor.shape, tensor.dtype) != (expected, dtype):
            found = (tuple(tensor.shape), tensor.dtype)
            want = "no such piece" if expected is None else (tuple(expected), dtype)
            raise CheckpointError(
                f"DDP hook state holds a {role!r} residual of {found} for parameter {param}, "
                f"piece {piece}; this model's piece is {want}"
            )
