"""The aggregation-scheme contract: how the ranks' tensors become one bit-identical average.

A scheme is SPMD code: every rank calls :meth:`Scheme.reduce` with its own tensor and the same
``(step, tensor_index)``, and every rank gets the same float tensor back. What differs between
schemes is the communication pattern (who sends which payload to whom), what is re-quantized
on the way, and which error-feedback buffers are kept. Schemes own that state (as
:class:`~gradzip.feedback.ErrorFeedback` objects, one per role), so a synchronisation object can
snapshot it before a step, restore it when the step fails, and checkpoint it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from gradzip.accounting import Encoded
from gradzip.comm.transport import Payload, Transport, in_step_scope
from gradzip.compressors.base import Compressor
from gradzip.device.mode import device_path
from gradzip.errors import CheckpointError
from gradzip.feedback import ErrorFeedback, Slot
from gradzip.feedback import working_dtype as working_dtype
from gradzip.keys import StreamKey
from gradzip.schemes._slices import slice_bounds

_STATE_VERSION = 1
#: the collective under which a finite-gradient agreement of its own is counted
FINITE_CHECK = "finite_check"

#: a piece of a tensor: ``(start, end, piece shape)`` within the tensor's flat values
Piece = tuple[int, int, torch.Size]


def whole_tensor(shape: torch.Size) -> list[Piece]:
    """One piece: the tensor itself (:meth:`Scheme.parameter_pieces`' default)."""
    return [(0, shape.numel(), shape)]


def row_pieces(shape: torch.Size, chunk_elements: int) -> list[Piece]:
    """The pieces of a tensor of ``shape`` cut into runs of whole rows of at most about
    ``chunk_elements`` values: one piece unless it holds more than ``chunk_elements`` values.

    [CHOICE] A larger tensor is cut along its first dimension into ``ceil(numel /
    chunk_elements)`` nearly equal runs of rows (at most one piece a row), so each piece keeps
    the tensor's trailing shape (a compressor that works per column or per row sees whole
    rows). The cut depends only on the shape and ``chunk_elements``, never on a DDP bucket.
    """
    numel = shape.numel()
    pieces = -(-numel // chunk_elements)
    if pieces <= 1 or len(shape) == 0 or shape[0] <= 1:
        return whole_tensor(shape)
    rows, row = shape[0], numel // shape[0]
    return [
        (a * row, b * row, torch.Size((b - a, *shape[1:])))
        for a, b in slice_bounds(rows, min(pieces, rows))
    ]


@dataclass(frozen=True)
class Outgoing:
    """What one rank puts into a flagged all-gather (:meth:`Scheme.encode_flagged`): its
    payload (empty when its flag is down), its flag, the dtype receivers decode the payload as,
    and, where the encoding produced it anyway (error feedback), this rank's own
    reconstruction: bitwise what decoding the payload gives, so :meth:`Scheme.average` adds it
    instead of decoding the payload again."""

    payload: Payload
    finite: bool
    dtype: torch.dtype
    own: torch.Tensor | None = None

    def own_term(self, rank: int) -> tuple[int, torch.Tensor] | None:
        """``(rank, reconstruction)`` for :meth:`Scheme.average`, where the encoding kept the
        reconstruction of this rank's payload."""
        return None if self.own is None else (rank, self.own)


class Scheme(ABC):
    """Base class of the aggregation schemes.

    Subclasses implement :meth:`reduce` and say which error-feedback roles they keep by listing
    them in ``feedback_roles`` (created when ``error_feedback=True``), e.g. ``("worker",)`` for
    the sender-side residual, or ``("reduce_scatter", "allgather")`` for the ring.
    """

    name: ClassVar[str]
    feedback_roles: tuple[str, ...] = ("worker",)
    #: whether a lossless compressor (``identity``) gives the exact mean: False for a scheme
    #: that approximates by design (PowerSGD's low rank)
    exact_with_lossless_codec: ClassVar[bool] = True
    #: whether the scheme works on each tensor's own shape (PowerSGD's matrices): a caller
    #: holding several tensors in one flat buffer (a DDP bucket) hands them over one by one
    needs_shapes: ClassVar[bool] = False

    #: whether :meth:`reduce_many_if_all_finite` gives every tensor the same mean however the
    #: tensors are grouped into calls (this default reduces them one by one, each under its own
    #: key); a caller whose groups change (the DDP hook's buckets) hands the tensors over one
    #: at a time where it does not
    @property
    def groups_exactly(self) -> bool:
        return True

    #: [CHOICE] whether :meth:`reduce_many_if_all_finite` passes every tensor through an
    #: encoder that refuses NaN and Inf before its first message is sent, so that a caller
    #: need not scan the tensors for the finite agreement (the refusal lowers the flag)
    encodes_all_before_sending: ClassVar[bool] = False

    # -- capabilities a caller (the DDP hook, the finite agreement) asks for -------------------
    # [CHOICE] Declared by each scheme (overridden where it differs from the default), so that
    # a caller asks what a scheme can do instead of which class it is.

    @property
    def flag_rides_on_payload(self) -> bool:
        """Whether :meth:`reduce_if_all_finite` starts by encoding the whole tensor and lowers
        the flag only from that encode's refusal
        (:class:`~gradzip.errors.NonFiniteInputError`, nothing sent yet): a caller then need not
        scan the tensor for the finite agreement. Default False: the flag must be computed."""
        return False

    @property
    def pipelines(self) -> bool:
        """Whether a reduction splits into three stages a caller may run on separate threads,
        one message after another: :meth:`encode_flagged` (no communication),
        :meth:`gather_flagged` (communication only) and :meth:`average` (no communication),
        each tensor cut by :meth:`parameter_pieces`, with one error-feedback slot per piece.
        Default False: the scheme requantizes between messages and is reduced whole
        (:meth:`reduce_many_if_all_finite`)."""
        return False

    def parameter_pieces(self, shape: torch.Size, chunk_elements: int) -> list[Piece]:
        """The pieces a caller that pipelines (:attr:`pipelines`) encodes a tensor of ``shape``
        in, each with its own key's ``chunk`` and error-feedback slot ``(tensor_index,
        piece)``: ``(start, end, piece shape)`` within the tensor's flat values. Default: the
        whole tensor."""
        return whole_tensor(shape)

    def residual_shapes(self, shape: torch.Size, chunk_elements: int) -> list[torch.Size] | None:
        """The shapes of the error-feedback residuals (slot chunks ``0, 1, ...``) this scheme
        keeps for a tensor of ``shape`` reduced through a pipelining caller, so a checkpoint's
        slots can be checked against the model; None (the default) where the slots are the
        scheme's own business (a ring's slices depend on the group size)."""
        if not self.pipelines:
            return None
        return [piece[2] for piece in self.parameter_pieces(shape, chunk_elements)]

    def encode_flagged(
        self,
        rank: int,
        tensor: torch.Tensor,
        step: int,
        tensor_index: int,
        finite: bool = True,
        chunk: int = 0,
    ) -> Outgoing:
        """Stage 1 of a pipelined reduction (:attr:`pipelines`): this rank's payload. Only a
        scheme that pipelines implements it; this default refuses."""
        raise NotImplementedError(f"the {self.name} scheme does not pipeline its reduction")

    @in_step_scope
    def gather_flagged(
        self,
        transport: Transport,
        outgoing: Outgoing,
        step: int,
        expected_size: int | None = None,
    ) -> tuple[list[Payload], list[int]]:
        """Stage 2 of a pipelined reduction (communication only): every rank's payload, and
        the ranks whose flag is down (ascending; when there are any, the payloads are not to
        be decoded). ``expected_size``: the bound every rank computed alike
        (:meth:`device_payload_bound`), or None (see
        :meth:`~gradzip.comm.transport.Transport.all_gather_flagged`)."""
        return transport.all_gather_flagged(
            outgoing.payload, outgoing.finite, expected_size=expected_size
        )

    def device_payload_bound(
        self, world_size: int, tensor: torch.Tensor, step: int, tensor_index: int, chunk: int = 0
    ) -> int | None:
        """The most bytes any of ``world_size`` ranks' payloads of a tensor like ``tensor``
        (its shape, dtype and device; not its values) takes under ``(step, tensor_index,
        chunk)``, where it is a device payload of a size fixed by the shape; else None (host
        payloads keep the ring: their path has no collective of equal slots to gain).

        Every rank computes the same number, a flag-down rank included, so all of them take the
        same path of :meth:`~gradzip.comm.transport.Transport.all_gather_flagged`. The last
        rank's key bounds every rank's (a larger rank never has a shorter varint); with error
        feedback the payload encodes ``g + e`` in the working dtype (:meth:`encode_own`)."""
        if not (self.compressor.device_resident and device_path(tensor)):
            return None
        dtype = working_dtype(tensor.dtype) if self.error_feedback else tensor.dtype
        return self.payload_bound(world_size, tensor.shape, dtype, step, tensor_index, chunk)

    def payload_bound(
        self,
        world_size: int,
        shape: torch.Size,
        dtype: torch.dtype,
        step: int,
        tensor_index: int,
        chunk: int = 0,
    ) -> int | None:
        """:meth:`device_payload_bound` for a payload already known to be a device payload of
        ``dtype`` (the dtype it was encoded as)."""
        key = self.key(world_size - 1, step, tensor_index, chunk)
        return self.compressor.fixed_payload_size(shape, dtype, key)

    def average(
        self,
        payloads: Sequence[Payload],
        step: int,
        tensor_index: int,
        shape: torch.Size,
        dtype: torch.dtype,
        own: tuple[int, torch.Tensor] | None = None,
        out: torch.Tensor | None = None,
        chunk: int = 0,
    ) -> torch.Tensor:
        """Stage 3 of a pipelined reduction (:attr:`pipelines`; no communication): the mean of
        every rank's payload. Only a scheme that pipelines implements it; this default
        refuses."""
        raise NotImplementedError(f"the {self.name} scheme does not pipeline its reduction")

    def __init__(
        self, compressor: Compressor, *, run_seed: int = 0, error_feedback: bool = False
    ) -> None:
        if not isinstance(compressor, Compressor):
            raise TypeError(f"a scheme needs a Compressor, got {type(compressor).__name__}")
        self.check_compatible(compressor)
        self.compressor = compressor
        self.run_seed = run_seed
        #: the latest payload this rank encoded itself per ``(role, tensor_index, chunk)``, for
        #: bit accounting (``wire_bits``, ``paper_bits``, ``entropy_bits``); bounded by the
        #: number of tensors, so long runs do not accumulate
        self.produced: dict[tuple[str, int, int], Encoded] = {}
        self.feedback: dict[str, ErrorFeedback] = (
            {role: ErrorFeedback(compressor) for role in self.feedback_roles}
            if error_feedback
            else {}
        )

    @classmethod
    def check_compatible(cls, compressor: Compressor) -> None:
        """Raise ``ValueError`` if ``compressor`` cannot be used with this scheme."""
        if compressor.needs_side_information:
            raise ValueError(
                f"{compressor.name} needs side information; use the nested scheme for it"
            )

    @classmethod
    def compatible(cls, compressor: Compressor) -> bool:
        """Whether :meth:`check_compatible` accepts ``compressor``."""
        try:
            cls.check_compatible(compressor)
        except ValueError:
            return False
        return True

    @property
    def error_feedback(self) -> bool:
        return bool(self.feedback)

    def key(self, rank: int, step: int, tensor_index: int, chunk: int = 0) -> StreamKey:
        """The key of the payload that ``rank`` sends for ``(step, tensor_index, chunk)``."""
        return StreamKey(self.run_seed, rank, step, tensor_index, chunk)

    @abstractmethod
    def reduce(
        self, transport: Transport, tensor: torch.Tensor, step: int, tensor_index: int = 0
    ) -> torch.Tensor:
        """The average over ranks (float32, float64 for float64 input; on the CPU, or where
        device payloads live; the shape of ``tensor``), bit-identical on every rank."""

    @in_step_scope
    def reduce_if_all_finite(
        self,
        transport: Transport,
        tensor: torch.Tensor,
        step: int,
        tensor_index: int,
        finite: bool,
    ) -> torch.Tensor | list[int]:
        """:meth:`reduce`, with every rank's ``finite`` flag agreed on the way: the mean when
        every rank's flag is up, else, on every rank, the ranks whose flag is down (ascending;
        nothing decoded, and this rank's ``tensor`` is not encoded when its flag is down).

        The buffers may have changed when it returns ranks: the caller restores its
        :meth:`snapshot`. This default all-gathers a one-byte flag first (counted under
        ``"finite_check"``); a scheme whose first message is an all-gather overrides it to let
        the flag ride in that message's header, at no extra byte or round [CHOICE]."""
        flag = b"\x01" if finite else b"\x00"
        _, down = transport.all_gather_flagged(flag, finite, FINITE_CHECK)
        if down:
            return down
        return self.reduce(transport, tensor, step, tensor_index)

    def reduce_many_if_all_finite(
        self,
        transport: Transport,
        tensors: Sequence[torch.Tensor],
        indices: Sequence[int],
        step: int,
        finite: bool,
    ) -> tuple[list[torch.Tensor], list[int]]:
        """The means of ``tensors`` (tensor index ``indices[i]``) and ``[]``, or, when some
        rank's ``finite`` flag is down, ``[]`` and those ranks (ascending, on every rank).

        This default agrees on the flags with the first tensor (:meth:`reduce_if_all_finite`)
        and reduces the others one by one; a scheme that sends several tensors in one message
        overrides it. The buffers may have changed when ranks are returned: the caller
        restores its :meth:`snapshot`."""
        if not tensors:
            raise ValueError("reduce_many_if_all_finite needs at least one tensor")
        first = self.reduce_if_all_finite(transport, tensors[0], step, indices[0], finite)
        if isinstance(first, list):
            return [], first
        rest = [
            self.reduce(transport, t, step, i)
            for t, i in zip(tensors[1:], indices[1:], strict=True)
        ]
        return [first, *rest], []

    # -- helpers for subclasses ---------------------------------------------------------------
    def encode_own(
        self, role: str, tensor: torch.Tensor, key: StreamKey
    ) -> tuple[Payload, torch.dtype]:
        """This rank's payload for ``tensor`` (through the ``role`` residual when error feedback
        is on) and the dtype a receiver decodes it as: error feedback encodes ``g + e`` in the
        working dtype, so half-precision gradients travel as float32 then."""
        payload, dtype, _ = self._encode_own(role, tensor, key, reconstruct=False)
        return payload, dtype

    def encode_own_reconstructed(
        self, role: str, tensor: torch.Tensor, key: StreamKey
    ) -> tuple[Payload, torch.dtype, torch.Tensor]:
        """:meth:`encode_own`, also returning what a receiver decodes from the payload (bitwise
        :meth:`decode` with ``key``, ``tensor.shape`` and the dtype): error feedback computes it
        on the way (in the compressor's own pass where it offers one), otherwise it is decoded."""
        payload, dtype, v_hat = self._encode_own(role, tensor, key, reconstruct=True)
        if v_hat is None:
            v_hat = self.decode(payload, key, tensor.shape, dtype)
        return payload, dtype, v_hat

    def _encode_own(
        self, role: str, tensor: torch.Tensor, key: StreamKey, *, reconstruct: bool
    ) -> tuple[Payload, torch.dtype, torch.Tensor | None]:
        feedback = self.feedback.get(role)
        v_hat = None
        if feedback is None:
            encoded, dtype = self.compressor.encode(tensor, key), tensor.dtype
            # a device payload's finite flag, read once here: NonFiniteInputError as a host
            # encoder raises it (error feedback has read it before changing its residual)
            encoded.verify()
        elif reconstruct:
            encoded, v_hat = feedback.round_trip(tensor, key)
            dtype = working_dtype(tensor.dtype)
        else:
            encoded, dtype = feedback.encode(tensor, key), working_dtype(tensor.dtype)
        self.produced[role, key.tensor_index, key.chunk] = encoded
        payload = encoded.payload
        return payload if isinstance(payload, torch.Tensor) else bytes(payload), dtype, v_hat

    def decode(
        self, payload: Payload, key: StreamKey, shape: torch.Size, dtype: torch.dtype
    ) -> torch.Tensor:
        """Decode a received payload, checking it carries ``key`` and ``shape``."""
        return self.compressor.decode(payload, expected_key=key, shape=shape, dtype=dtype)

    # -- state ----------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, dict[Slot, torch.Tensor]]:
        """A cheap restore point of every buffer (see :meth:`ErrorFeedback.snapshot`)."""
        return {role: fb.snapshot() for role, fb in self.feedback.items()}

    def restore(self, snapshot: Mapping[str, dict[Slot, torch.Tensor]]) -> None:
        """Return to a :meth:`snapshot` (a step that failed half way applies nothing)."""
        for role, fb in self.feedback.items():
            fb.restore(snapshot[role])

    def state_dict(self) -> dict[str, Any]:
        """The scheme's buffers as plain, ``torch.save``-able data."""
        return {
            "version": _STATE_VERSION,
            "scheme": self.name,
            "feedback": {role: fb.state_dict() for role, fb in self.feedback.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict`; the scheme and its error-feedback roles must match.

        Every role is validated before any is loaded: on a
        :class:`~gradzip.errors.CheckpointError` no buffer has changed.
        """
        self.restore(self.parse_state(state))

    def parse_state(self, state: Mapping[str, Any]) -> dict[str, dict[Slot, torch.Tensor]]:
        """The buffers :meth:`load_state_dict` would install (a :meth:`restore` point), after
        every check; changes nothing."""
        if not isinstance(state, Mapping) or state.get("version") != _STATE_VERSION:
            found = state.get("version") if isinstance(state, Mapping) else type(state).__name__
            raise CheckpointError(f"scheme state has version {found!r}")
        if state.get("scheme") != self.name:
            raise CheckpointError(f"scheme state is for {state.get('scheme')!r}, not {self.name!r}")
        roles = state.get("feedback")
        if not isinstance(roles, Mapping) or set(roles) != set(self.feedback):
            found = sorted(roles) if isinstance(roles, Mapping) else roles
            raise CheckpointError(
                f"scheme state has error-feedback buffers {found}, this scheme keeps "
                f"{sorted(self.feedback)}"
            )
        return {role: fb.parse_state(roles[role]) for role, fb in self.feedback.items()}
