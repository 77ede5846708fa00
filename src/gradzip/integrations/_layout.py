"""Where each parameter sits in a DDP bucket's flat buffer, and where a scheme's error-feedback
residuals sit in that buffer."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from gradzip.schemes._ring_ints import slice_bounds
from gradzip.schemes.base import Scheme
from gradzip.schemes.ring_requantize import RingRequantize

#: a residual slot of one role: ``(chunk, lo, hi)``, the flat buffer's elements ``[lo, hi)``
FeedbackSlice = tuple[int, int, int]


@dataclass(frozen=True)
class BucketLayout:
    """The parameters of one bucket (model-order indices, in the buffer's order) and where each
    one's gradient starts in the flat buffer.

    [CHOICE] The bucket's key is ``tensor_index = min(params)``: buckets partition the
    parameters, so no two buckets of one layout share it, and it does not depend on the bucket's
    position (which DDP's rebuild reorders).
    """

    params: tuple[int, ...]
    offsets: tuple[int, ...]  # len(params) + 1 entries; offsets[-1] is the buffer's length

    @classmethod
    def of(cls, params: tuple[int, ...], numels: list[int]) -> BucketLayout:
        offsets = [0]
        for index in params:
            offsets.append(offsets[-1] + numels[index])
        return cls(params, tuple(offsets))

    @property
    def tensor_index(self) -> int:
        return min(self.params)

    @property
    def numel(self) -> int:
        return self.offsets[-1]

    def overlaps(self, lo: int, hi: int) -> Iterator[tuple[int, int, int, int, int]]:
        """``(param, a, b, oa, ob)`` for each parameter at ``[a, b)`` in the buffer that meets
        ``[lo, hi)``, where ``[oa, ob)`` is the overlap (buffer coordinates)."""
        for k, index in enumerate(self.params):
            a, b = self.offsets[k], self.offsets[k + 1]
            oa, ob = max(a, lo), min(b, hi)
            if oa < ob:
                yield index, a, b, oa, ob


def feedback_slices(
    scheme: Scheme, numel: int, world_size: int, rank: int
) -> dict[str, list[FeedbackSlice]]:
    """The residual slots ``scheme.reduce`` keeps, per role, for a flat tensor of ``numel``
    elements on ``rank``, and the elements each covers.

    A scheme may describe itself with a ``feedback_slices(numel, world_size, rank)`` method;
    otherwise every role keeps one residual of the whole tensor (chunk 0), except the ring,
    whose reduce-scatter residuals cover the slices this rank sends (chunk = destination) and
    whose allgather residual covers the slice it owns (chunk ``P + rank``), as
    :class:`~gradzip.schemes.RingRequantize` documents. The hook checks the slots the scheme
    actually kept against this description and refuses a step where they differ.
    """
    described = getattr(scheme, "feedback_slices", None)
    if callable(described):
        result: dict[str, list[FeedbackSlice]] = described(numel, world_size, rank)
        return result
    if isinstance(scheme, RingRequantize):
        bounds = slice_bounds(numel, world_size)
        slices: dict[str, list[FeedbackSlice]] = {
            "reduce_scatter": [(dst, *bounds[dst]) for dst in range(world_size) if dst != rank],
            "allgather": [(world_size + rank, *bounds[rank])],
        }
        return {role: slices[role] for role in scheme.feedback}
    return {role: [(0, 0, numel)] for role in scheme.feedback}
