"""Algorithm 2 of the NDQSG paper: DQSG workers first, nested workers decoded against the
running mean of those already decoded."""

from __future__ import annotations

import math
from typing import Literal

import torch

from gradzip.choices import check_choice, choices_of
from gradzip.comm.transport import Payload, Transport, host_bytes, in_step_scope
from gradzip.compressors.base import Compressor, empty_output
from gradzip.compressors.dqsg import DQSG
from gradzip.compressors.identity import Identity
from gradzip.compressors.ndqsg import NDQSG, failure_rate
from gradzip.feedback import working_dtype
from gradzip.kernels.running_mean import update_running_mean_
from gradzip.schemes._messages import serve
from gradzip.schemes.base import Scheme

#: who decodes the nested payloads: every rank (all-gather), or one server rank
NestedTopology = Literal["allgather", "server"]
_TOPOLOGIES: tuple[NestedTopology, ...] = choices_of(NestedTopology)
#: what the server sends back: the mean in float32 (the paper), or as a DQSG payload
NestedDownlink = Literal["fp32", "dqsg"]
_DOWNLINKS: tuple[NestedDownlink, ...] = choices_of(NestedDownlink)


class NestedScheme(Scheme):
    """Ranks ``p < ceil(ratio * P)`` (group P1) send DQSG payloads (``coarse``, default
    ``DQSG(M=2)`` on ``compressor``'s seed schedule, the paper's experiment; the authors' code
    uses ``M = 3``); the others
    (group P2) send nested NDQSG payloads (``compressor``, paper ``(L1, k, alpha) = (3, 3, 1)``).
    Decoding runs in ascending rank order with the running mean ``g_bar`` of all workers
    decoded so far as side information (P1 first, then P2, each P2 worker against a mean that
    includes the earlier P2 workers [CODE]): ``g_bar += (g_hat - g_bar) / cnt``.

    ``topology="allgather"``: every rank receives every payload and decodes identically
    (scheme (a) traffic, ``P - 1`` payloads per rank). ``topology="server"``: payloads go to the
    server rank, which decodes and returns the mean: in fp32 (``downlink="fp32"``, Alg. 2 as
    written), or as a DQSG payload (``downlink="dqsg"``, ``downlink_M`` levels per sign, default
    8: 17 symbols, 5 bits a coordinate with fixed packing, one float32 scale per 512 entries)
    [CHOICE, not in the paper]. The DQSG downlink is subtractively dithered with the shared
    stream of rank ``P``, so every rank, the server included, decodes the same unbiased mean
    whose added error is uniform and independent of it: ``(Delta^2/12) sum_b n_b sigma_b^2``
    with ``Delta = 1/downlink_M`` and ``sigma_b`` the mean's largest entry in bucket ``b`` (no
    error feedback is needed for an unbiased downlink). The server then sends ``P - 1``
    payloads of about 5 bits a coordinate instead of ``32``.

    Bits: a P2 worker sends ``32*#buckets + n*ceil(log2 k)`` bits (``n*log2 3 = 1.585 n`` for
    ``k = 3``), a P1 worker DQSG's ``32*#buckets + n*ceil(log2(2M+1))``.

    Variance and failures: a P2 worker's error is DQSG's with ``Delta = 1/L1`` when decoding
    succeeds (``alpha = 1``); decoding fails, undetected, where ``|g_p - g_bar|`` is large
    compared with the coarse cell ``k*sigma_p/L1`` (spec 1.8: ``P(fail) <= Delta1^2 /
    (3 Delta2^2) + 4 alpha^2 sigma_z^2 / Delta2^2``). With ``record=True`` the scheme keeps the
    last step's decoded tensors and side information, and :meth:`failure_rate` measures the
    rate when the caller knows the true gradients (simulation).

    Error feedback is not offered: a nested sender cannot know what the receiver decodes.

    References: Abdi & Fekri, "Nested Dithered Quantization for Communication Reduction in
    Distributed Training", Alg. 2; spec 1.6-1.8.
    """

    name = "nested"
    feedback_roles = ()

    def __init__(
        self,
        compressor: Compressor,
        *,
        run_seed: int = 0,
        error_feedback: bool = False,
        coarse: Compressor | None = None,
        ratio: float = 0.5,
        topology: NestedTopology = "allgather",
        server: int = 0,
        record: bool = False,
        downlink: NestedDownlink = "fp32",
        downlink_M: int = 8,
    ) -> None:
        if error_feedback:
            raise ValueError(
                "the nested scheme has no error feedback (the sender cannot know "
                "what a nested payload decodes to)"
            )
        check_choice("topology", topology, _TOPOLOGIES)
        if not 0.0 < ratio <= 1.0:
            raise ValueError(f"ratio (the share of DQSG workers) must lie in (0, 1], got {ratio}")
        super().__init__(compressor, run_seed=run_seed)
        self.coarse = coarse if coarse is not None else _default_coarse(compressor)
        if self.coarse.needs_side_information:
            raise ValueError("the P1 (coarse) compressor must decode without side information")
        self.ratio = ratio
        self.topology = topology
        self.server = server
        self.record = record
        self.decoded: list[torch.Tensor] = []
        self.side: list[torch.Tensor | None] = []
        check_choice("downlink", downlink, _DOWNLINKS)
        if downlink != "fp32" and topology != "server":
            raise ValueError("a compressed downlink needs topology='server'")
        self.downlink = downlink
        self._down: Compressor = Identity() if downlink == "fp32" else DQSG(M=downlink_M)

    @classmethod
    def check_compatible(cls, compressor: Compressor) -> None:
        if not compressor.needs_side_information:
            raise ValueError(
                f"the nested scheme needs a side-information compressor (ndqsg), not "
                f"{compressor.name}"
            )

    def first_group(self, world_size: int) -> int:
        """``|P1| = ceil(ratio * P)``: ranks below it send DQSG."""
        # the epsilon keeps float noise from adding a rank (0.3 * 10 is 3.0000000000000004)
        return max(1, math.ceil(self.ratio * world_size - 1e-9))

    @in_step_scope
    def reduce(
        self, transport: Transport, tensor: torch.Tensor, step: int, tensor_index: int = 0
    ) -> torch.Tensor:
        rank, size = transport.rank, transport.world_size
        own = self.coarse if rank < self.first_group(size) else self.compressor
        key = self.key(rank, step, tensor_index)
        encoded = own.encode(tensor, key)
        self.produced["worker", key.tensor_index, key.chunk] = encoded
        payload = host_bytes(encoded.payload)
        if self.topology == "allgather":
            gathered = [host_bytes(p) for p in transport.all_gather_bytes(payload)]
            return self._decode_all(gathered, tensor, step, tensor_index)
        down_key = self.key(size, step, tensor_index)

        def reply(gathered: list[Payload]) -> Payload:
            mean = self._decode_all([host_bytes(p) for p in gathered], tensor, step, tensor_index)
            return host_bytes(self._down.encode(mean, down_key).payload)

        received = serve(transport, payload, self.server, reply, down_key)
        work = working_dtype(tensor.dtype)
        return self._down.decode(received, expected_key=down_key, shape=tensor.shape, dtype=work)

    def _decode_all(
        self, payloads: list[bytes], tensor: torch.Tensor, step: int, tensor_index: int
    ) -> torch.Tensor:
        shape, dtype = tensor.shape, tensor.dtype
        work = working_dtype(dtype)
        # [CHOICE] the running mean lives in recycled memory and is updated in place, in one
        # pass (update_running_mean_, the bits of ``mean += (g_hat - mean) / cnt``): the
        # expression's fresh tensors (and the zeros' and the side information's copy) cost a
        # 2**24-value step about 200 ms of page faults, 87% of the scheme's time
        mean = empty_output(shape.numel(), work).view(shape).zero_()
        first = self.first_group(len(payloads))
        decoded, sides = [], []
        for rank, payload in enumerate(payloads):
            key = self.key(rank, step, tensor_index)
            # the decoder only reads its side information, and the mean changes after it
            side = None if rank < first else mean.clone() if self.record else mean
            codec = self.coarse if rank < first else self.compressor
            g_hat = codec.decode(payload, expected_key=key, shape=shape, dtype=dtype, side=side)
            update_running_mean_(mean, g_hat.to(work), rank + 1)
            if self.record:
                decoded.append(g_hat)
                sides.append(side)
        self.decoded, self.side = decoded, sides
        return mean

    def failure_rate(self, true_tensors: list[torch.Tensor]) -> float:
        """Fraction of the P2 coordinates of the last recorded step that were decoded wrongly
        (spec 1.6), given every rank's true tensor; needs ``record=True``."""
        if not self.record or not self.decoded:
            raise ValueError("construct the scheme with record=True and run a step first")
        if len(true_tensors) != len(self.decoded):
            raise ValueError(f"need {len(self.decoded)} true tensors, got {len(true_tensors)}")
        nested = self.compressor
        assert isinstance(nested, NDQSG)
        rates = [
            failure_rate(
                g,
                g_hat,
                side,
                L1=nested.L1,
                alpha=nested.alpha,
                bucket_size=nested.bucket_size or None,
            )
            for g, g_hat, side in zip(true_tensors, self.decoded, self.side, strict=True)
            if side is not None
        ]
        return sum(rates) / len(rates) if rates else 0.0


def _default_coarse(compressor: Compressor) -> DQSG:
    """``DQSG(M=2)`` on the nested compressor's seed schedule, so ``seed_schedule="chain"``
    of ``ndqsg`` chains every worker's dither, as the authors' code does (spec 0.4)."""
    if isinstance(compressor, NDQSG):
        schedule = compressor.seed_schedule
        return DQSG(M=2, seed_schedule=schedule.name, chain_draws=schedule.chain_draws)
    return DQSG(M=2)
