"""Tensors that already lie end to end in one storage, seen as one flat tensor without a copy.

A DDP bucket's gradients are views of its flat buffer, in the bucket's order, and a batched
reduction (:mod:`gradzip.schemes._grid_batch`) works on their concatenation: where the views are
adjacent, that concatenation is the buffer itself, and ``torch.cat`` would only copy it (a full
pass over the bucket into fresh memory, about half of a large batch's codec time on one core).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def adjacent_flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The flat view covering ``tensors`` laid end to end, when they are contiguous, of one
    dtype and device, share one storage and each starts where the one before ends (empty ones
    anywhere); None otherwise, and for an empty sequence. The view aliases the tensors: a
    write through one shows in the other."""
    live = [t for t in tensors if t.numel()]
    if not live:
        return None
    first = live[0]
    storage = first.untyped_storage().data_ptr()
    end = first.storage_offset()
    for t in live:
        if (
            not t.is_contiguous()
            or t.dtype != first.dtype
            or t.device != first.device
            or t.untyped_storage().data_ptr() != storage
            or t.storage_offset() != end
        ):
            return None
        end += t.numel()
    total = end - first.storage_offset()
    return first.as_strided((total,), (1,), first.storage_offset())
