"""A parameter server: payloads gathered at one rank, decoded, averaged, sent back."""

from __future__ import annotations

from typing import Literal

import torch

from gradzip.choices import check_choice, choices_of
from gradzip.comm.transport import Payload, Transport, in_step_scope
from gradzip.compressors.base import Compressor
from gradzip.compressors.identity import Identity
from gradzip.feedback import working_dtype
from gradzip.schemes._messages import serve
from gradzip.schemes.base import Scheme

#: what the server sends back: the mean in float32, or re-compressed by the compressor
PsDownlink = Literal["fp32", "requantize"]
_DOWNLINKS: tuple[PsDownlink, ...] = choices_of(PsDownlink)


class ParameterServer(Scheme):
    """Every rank sends its payload to the server rank, which decodes them in ascending rank
    order, averages, and returns the mean to every rank: un-quantized (``downlink="fp32"``,
    Alg. 1 of the DQSG paper: "broadcast un-quantized") or compressed again with the same
    compressor (``downlink="requantize"``, the re-quantized downlink of LPC scheme (c) and of
    DeepSpeed-style compressed allreduce). The server is also a worker: its own payload is
    decoded locally and never crosses the wire.

    The downlink is a payload too: the fp32 mean travels as an ``identity`` payload (float32,
    float64 for float64 tensors) and the re-quantized mean as a compressor payload, both keyed
    with rank ``P`` [CHOICE: the server's stream is the rank after the last worker, so its
    randomness never collides with a worker's]. Every rank, the server included, decodes the
    downlink payload, so all hold bit-identical means.

    Bytes per step: a worker sends one payload and receives one; the server receives ``P - 1``
    payloads and sends ``P - 1`` downlinks, so its traffic grows linearly with ``P`` while a
    worker's is constant. fp32 downlink: ``32 n`` bits per worker per step.

    Variance: fp32 downlink, as allgather-decode (``sum_p V_p / P^2``); re-quantized, plus the
    compressor's variance on the mean (``V(mean)``), or, with error feedback, a delayed residual.

    Error feedback: roles ``"worker"`` (each rank's uplink) and, for the re-quantized downlink,
    ``"server"`` (the server's residual of the re-quantized mean, DeepSpeed/1-bit Adam style).

    References: DQSG paper Alg. 1; Yu, Wu & Huang (AISTATS 2019) scheme (c); Tang et al.,
    "1-bit Adam" (ICML 2021) for the server-side error feedback.
    """

    name = "ps"

    def __init__(
        self,
        compressor: Compressor,
        *,
        run_seed: int = 0,
        error_feedback: bool = False,
        server: int = 0,
        downlink: PsDownlink = "fp32",
    ) -> None:
        check_choice("downlink", downlink, _DOWNLINKS)
        self.feedback_roles = ("worker", "server") if downlink == "requantize" else ("worker",)
        super().__init__(compressor, run_seed=run_seed, error_feedback=error_feedback)
        self.server = server
        self.downlink = downlink
        self._fp32 = Identity()

    @in_step_scope
    def reduce(
        self, transport: Transport, tensor: torch.Tensor, step: int, tensor_index: int = 0
    ) -> torch.Tensor:
        size, shape = transport.world_size, tensor.shape
        payload, dtype = self.encode_own(
            "worker", tensor, self.key(transport.rank, step, tensor_index)
        )
        down_key = self.key(size, step, tensor_index)
        down_dtype = working_dtype(dtype)

        def reply(gathered: list[Payload]) -> Payload:
            total = torch.zeros(shape, dtype=down_dtype)
            for rank, received in enumerate(gathered):
                total += self.decode(received, self.key(rank, step, tensor_index), shape, dtype)
            mean = total.div_(size)
            if self.downlink == "fp32":
                return bytes(self._fp32.encode(mean, down_key).payload)
            return self.encode_own("server", mean, down_key)[0]

        received_down = serve(transport, payload, self.server, reply, down_key)
        decoder = self._fp32 if self.downlink == "fp32" else self.compressor
        out = decoder.decode(received_down, expected_key=down_key, shape=shape, dtype=down_dtype)
        return out.to(working_dtype(tensor.dtype))
