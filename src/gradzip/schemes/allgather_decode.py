"""Scheme (a), the papers' "broadcast": every rank decodes every rank's payload."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gradzip.comm.transport import Payload, Transport, in_step_scope
from gradzip.compressors.base import empty_output_on
from gradzip.errors import NonFiniteInputError
from gradzip.feedback import working_dtype
from gradzip.kernels.device_division import device_scalar
from gradzip.schemes.base import Outgoing, Piece, Scheme, row_pieces

__all__ = ["AllGatherDecode", "Outgoing"]


def payload_device(payloads: Sequence[Payload]) -> torch.device | None:
    """The device of the first device payload among ``payloads`` (None: all host bytes)."""
    return next((p.device for p in payloads if isinstance(p, torch.Tensor)), None)


class AllGatherDecode(Scheme):
    """Each rank encodes its tensor, the payloads are all-gathered, and every rank decodes all
    of them and averages in ascending rank order (rank 0's decoded tensor, the others added in
    rank order, then divided by ``P``), so every rank holds a bit-identical mean.

    Bytes per rank and step: it sends and receives the other ``P - 1`` payloads (plus an 8-byte
    length each), so traffic grows linearly with ``P`` (spec 3.3 (a): ``M(M-1)(b*d + 32)`` bits
    in all). No re-quantization, no overflow; the decoded mean carries each rank's own
    compression error divided by ``P``: for an unbiased compressor of per-rank variance
    ``V_p``, ``Var(mean) = sum_p V_p / P^2``.

    Error feedback (``error_feedback=True``): one sender-side residual per rank and tensor
    (role ``"worker"``), spec 0.6.

    Every rank's payload is decoded with the key the receiver expects (run seed, sender rank,
    step, tensor index), so a payload of another step or run raises
    :class:`~gradzip.errors.KeyMismatchError` instead of being averaged in.

    On the device (a device-resident compressor and tensors not on the CPU, see
    :mod:`gradzip.device`): the payloads are device tensors on the wire, decoded and averaged
    where they live. Host reads per tensor and rank: the encoding's finite flag, with error
    feedback the sender's own decode (a header and a flag), and a header and a flag per
    payload averaged: at most ``2P + 3`` reads of at most 128 bytes each
    (``tests/schemes/test_device_allgather.py`` counts them).

    References: spec 3.3 (a) and Alg. 1 of the DQSG paper (server decode and average).
    """

    name = "allgather"

    # -- capabilities (see :class:`~gradzip.schemes.base.Scheme`) -----------------------------
    @property
    def flag_rides_on_payload(self) -> bool:
        """True: :meth:`reduce_if_all_finite` encodes the tensor first, and the encoder's
        refusal of NaN and Inf lowers the flag before anything is sent."""
        return True

    @property
    def pipelines(self) -> bool:
        """True: :meth:`encode_flagged`, :meth:`gather_flagged` and :meth:`average` are a
        reduction's three stages (no requantization between messages)."""
        return True

    def parameter_pieces(self, shape: torch.Size, chunk_elements: int) -> list[Piece]:
        """Runs of whole rows of at most about ``chunk_elements`` values
        (:func:`~gradzip.schemes.base.row_pieces`): a pipelined message then holds at most
        ``chunk_elements`` values, so the wire starts after one piece's encoding."""
        return row_pieces(shape, chunk_elements)

    def reduce(
        self, transport: Transport, tensor: torch.Tensor, step: int, tensor_index: int = 0
    ) -> torch.Tensor:
        payload, dtype = self.encode_own(
            "worker", tensor, self.key(transport.rank, step, tensor_index)
        )
        return self.exchange(transport, payload, step, tensor_index, tensor.shape, dtype)

    def reduce_if_all_finite(
        self,
        transport: Transport,
        tensor: torch.Tensor,
        step: int,
        tensor_index: int,
        finite: bool,
    ) -> torch.Tensor | list[int]:
        """The flag rides in the header of the payload's all-gather: no byte or round of its
        own. A rank whose flag is down sends an empty payload instead of encoding."""
        outgoing = self.encode_flagged(transport.rank, tensor, step, tensor_index, finite)
        bound = self.device_payload_bound(transport.world_size, tensor, step, tensor_index)
        payloads, down = self.gather_flagged(transport, outgoing, step, bound)
        if down:
            return down
        return self.average(
            payloads,
            step,
            tensor_index,
            tensor.shape,
            outgoing.dtype,
            own=outgoing.own_term(transport.rank),
        )

    # -- the three phases of a reduction, for callers that pipeline them ---------------------
    def encode_flagged(
        self,
        rank: int,
        tensor: torch.Tensor,
        step: int,
        tensor_index: int,
        finite: bool = True,
        chunk: int = 0,
    ) -> Outgoing:
        """Phase 1 (no communication): this rank's payload, through its error-feedback residual.

        With ``finite`` down nothing is encoded. With ``finite`` up the encoder's own scan
        decides: a tensor it refuses (NaN, Inf, or an error-feedback sum ``g + e`` beyond the
        float32 range) raises :class:`~gradzip.errors.NonFiniteInputError` before any state
        changes, and becomes an empty payload with the flag down. ``chunk``: the payload's
        chunk number (its key's, and its error-feedback slot's), for callers that cut a tensor
        into pieces reduced one by one.

        [CHOICE] With error feedback the encoding reconstructs the payload anyway (``e = v -
        v_hat``), so the outgoing message keeps that ``v_hat`` for :meth:`average`: one decode
        of this rank's own payload per reduction less (at ``P = 2`` half the decoding). Not for
        a compressor that :attr:`~gradzip.compressors.base.Compressor.decodes_cheaply`
        (one-bit): writing ``v_hat`` and reading it back cost more than expanding its payload
        again (at 1 bit a value, the residual pass then writes ``e`` alone)."""
        if finite:
            key = self.key(rank, step, tensor_index, chunk)
            try:
                if self.error_feedback and not self.compressor.decodes_cheaply:
                    payload, dtype, own = self.encode_own_reconstructed("worker", tensor, key)
                    return Outgoing(payload, True, dtype, own)
                payload, dtype = self.encode_own("worker", tensor, key)
                return Outgoing(payload, True, dtype)
            except NonFiniteInputError:
                pass
        return Outgoing(b"", False, tensor.dtype)

    @in_step_scope
    def exchange(
        self,
        transport: Transport,
        payload: Payload,
        step: int,
        tensor_index: int,
        shape: torch.Size,
        dtype: torch.dtype,
    ) -> torch.Tensor:
        """All-gather this rank's already encoded ``payload`` and average the decoded payloads.

        Device payloads (on every rank alike) of a size the shape fixes travel in one
        collective of equal slots (:meth:`~gradzip.schemes.base.Scheme.payload_bound`,
        :meth:`~gradzip.comm.transport.Transport.all_gather_flagged`), others in the ring."""
        bound = None
        if isinstance(payload, torch.Tensor):
            bound = self.payload_bound(transport.world_size, shape, dtype, step, tensor_index)
        payloads = transport.all_gather_bytes(payload, expected_size=bound)
        return self.average(payloads, step, tensor_index, shape, dtype)

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
        """Phase 3 (no communication): decode every rank's payload and average them in
        ascending rank order. ``own = (rank, v_hat)``: that rank's payload is not decoded,
        ``v_hat`` (bitwise its decoding, see :class:`Outgoing`) stands for it. ``out``: a
        contiguous tensor of the working dtype and of ``shape``'s size to build the mean in
        (the same bits; e.g. the DDP bucket itself, so that DDP finds the mean in the gradients
        and copies nothing), else a recycled one
        (:func:`~gradzip.compressors.base.empty_output`); its values are overwritten, also when
        a later payload fails to decode. ``chunk``: the payloads' chunk number (see
        :meth:`encode_flagged`).

        The sum starts from rank 0's decoded tensor (no zero-filled buffer: a decoded ``-0.0``
        stays ``-0.0`` where ``0.0 + -0.0`` gave ``+0.0``), the other ranks' are added to it in
        rank order (:meth:`~gradzip.compressors.base.Compressor.decode_add_`, in place), then
        divided by ``P`` in place. [CHOICE] A division, not a multiplication by ``1/P``, which
        is the same bits only for powers of two. The same code runs in the simulator and on a
        real transport, so both give the same bits.
        """
        work = working_dtype(dtype)
        # this rank's reconstruction stands in for its payload where it fits the sum
        known = {} if own is None or own[1].dtype != work or own[1].shape != shape else dict([own])
        if out is None or out.dtype != work or not out.is_contiguous():
            # device payloads average where they live; host bytes in recycled host memory
            out = empty_output_on(shape.numel(), work, payload_device(payloads))
        # rank 0's values written into the sum itself: no fresh tensor and no copy
        total = out.view(shape)
        if 0 in known:
            total.copy_(known[0])  # copies bits, -0.0 included
        else:
            key = self.key(0, step, tensor_index, chunk)
            self.compressor.decode_into_(payloads[0], total, expected_key=key, dtype=dtype)
        for rank in range(1, len(payloads)):
            if rank in known:
                total.add_(known[rank])  # out + v, the float add decode_add_ makes
                continue
            key = self.key(rank, step, tensor_index, chunk)
            self.compressor.decode_add_(payloads[rank], total, expected_key=key, dtype=dtype)
        if len(payloads) == 1:
            return total
        # by a tensor on the sum's device: CUDA divides by a host scalar through its reciprocal
        return total.div_(device_scalar(len(payloads), total))
