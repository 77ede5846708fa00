"""Where each parameter sits in a DDP bucket's flat buffer, and the parameter-aligned units the
hook encodes it in.

[CHOICE] What a payload encodes never depends on the bucket a parameter travels in: the unit of
encoding is a parameter (or a fixed piece of it, cut by the scheme:
:meth:`~gradzip.schemes.base.Scheme.parameter_pieces`), keyed by the parameter's model-order index and the piece's number, with its own
scale, dither and error-feedback slot. DDP's buckets only decide which units share a message.
So a run resumed into other buckets (DDP's first iteration of a fresh wrapper always uses its
initial buckets; a resumed run may use another ``bucket_cap_mb``) encodes exactly what the
uninterrupted run encodes, and the hook trains bit for bit like
:class:`~gradzip.sync.GradientSync` on the same parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from gradzip.schemes.base import Piece


@dataclass(frozen=True)
class Unit:
    """One encoded tensor: ``param``'s piece number ``piece`` (the payload's ``tensor_index``
    and ``chunk``), at ``[lo, hi)`` of the bucket's buffer, in ``shape``."""

    param: int
    piece: int
    lo: int
    hi: int
    shape: torch.Size

    @property
    def numel(self) -> int:
        return self.hi - self.lo


@dataclass(frozen=True)
class BucketLayout:
    """The parameters of one bucket (model-order indices, in the buffer's order), where each
    one's gradient starts in the flat buffer, and the units it is encoded in, grouped into the
    messages of a pipelined reduction (:attr:`~gradzip.schemes.base.Scheme.pipelines`): consecutive units (so each message covers one contiguous
    range of the buffer), each message holding at most ``chunk_elements`` values unless one
    unit alone is larger (a parameter of fewer rows than pieces). A message is one all-gather
    whatever it holds, so grouping small parameters saves round trips; it changes no payload.
    Built once per layout (the hook keeps them), not per step."""

    params: tuple[int, ...]
    offsets: tuple[int, ...]  # len(params) + 1 entries; offsets[-1] is the buffer's length
    messages: tuple[tuple[Unit, ...], ...]

    @classmethod
    def of(
        cls,
        params: tuple[int, ...],
        shapes: Sequence[torch.Size],
        chunk_elements: int,
        pieces: Callable[[torch.Size], list[Piece]],
    ) -> BucketLayout:
        """The layout of a bucket of ``params``; ``pieces(shape)`` cuts a parameter into its
        units (the scheme's :meth:`~gradzip.schemes.base.Scheme.parameter_pieces`)."""
        offsets, size = [0], 0
        groups: list[list[Unit]] = []
        for index in params:
            start = offsets[-1]
            for piece, (a, b, shape) in enumerate(pieces(shapes[index])):
                if not groups or size + (b - a) > chunk_elements:
                    groups.append([])
                    size = 0
                groups[-1].append(Unit(index, piece, start + a, start + b, shape))
                size += b - a
            offsets.append(start + shapes[index].numel())
        return cls(params, tuple(offsets), tuple(tuple(group) for group in groups))

    @property
    def numel(self) -> int:
        return self.offsets[-1]

    def parameter_views(
        self, flat: torch.Tensor, shapes: Sequence[torch.Size]
    ) -> Iterator[torch.Tensor]:
        """Each parameter's gradient as a view of ``flat`` in the parameter's shape."""
        for k, index in enumerate(self.params):
            # narrow, not slicing: the same view, and it also runs on fake CUDA tensors
            lo = self.offsets[k]
            yield flat.narrow(0, lo, self.offsets[k + 1] - lo).view(shapes[index])
