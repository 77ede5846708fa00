"""How LPC-SVRG, ALPC-SVRG and the SGD baselines talk: the per-epoch full gradient in fp32 and
the per-round averaged message through an aggregation scheme (spec 3.3, 3.4).

* :func:`make_inner_scheme` builds the paper's communication schemes for the inner message
  ``u_alpha`` from the existing aggregation schemes: (a) broadcast =
  :class:`~gradzip.schemes.AllGatherDecode`, (b) parameter server summing integer codes =
  :class:`~gradzip.schemes.ServerIntegerSum` (``downlink="sum"``), (c) the same with a
  re-quantized downlink (``downlink="requantize"``), each around the
  :class:`~gradzip.compressors.lpc.LPC` codec; ``b=None`` is the fp32 baseline (the identity
  codec, 32 bits per entry, through scheme (a)).
* :class:`Channel` runs one round: every rank first agrees that its message is finite (one flag
  byte each, counted under ``"finite_check"``), then the scheme averages the float32 messages;
  the full gradient is a float32 all-gather of the ranks' shard sums, counted under
  :data:`FULL_GRADIENT` ("communication step 1", excluded from the paper's counts [SEED] but
  measured like everything else).

Messages travel as float32 whatever the problem's dtype (the papers' 32-bit baseline); the
averages come back in the problem's dtype. A failed round (a non-finite message on any rank, a
corrupt payload, a peer that died) raises on the ranks that see it and restores the scheme's
error-feedback buffers, so the caller's state is unchanged.
"""

from __future__ import annotations

from typing import Literal

import torch

from gradzip.algorithms.svrg.problems import FiniteSum
from gradzip.choices import check_choice, choices_of
from gradzip.codecs.symbols import Packing
from gradzip.comm.transport import Transport, host_bytes
from gradzip.compressors.identity import Identity
from gradzip.compressors.lpc import LPC
from gradzip.keys import StreamKey
from gradzip.schemes import AllGatherDecode, Scheme, ServerIntegerSum
from gradzip.schemes.server_integer_sum import IntSumDownlink
from gradzip.stepping import agree_all_finite

#: the meter's collective label of the per-epoch full-gradient exchange
FULL_GRADIENT = "svrg_full_gradient"
#: the label of the one-byte finiteness flags
FINITE_CHECK = "finite_check"
#: ``tensor_index`` of the full-gradient payloads (the inner message uses 0, sampling 1)
FULL_TENSOR_INDEX = 3
#: spec 3.3's inner-message schemes: (a) payloads all-gathered, (b) integer codes summed at
#: a server, (c) the same with the sum re-quantized
InnerScheme = Literal["a", "b", "c"]
SCHEMES: tuple[InnerScheme, ...] = choices_of(InnerScheme)


def make_inner_scheme(
    scheme: InnerScheme,
    b: int | None,
    theta: float = 1.0,
    packing: Packing = "fixed",
    run_seed: int = 0,
) -> Scheme:
    """The inner-message scheme (a), (b) or (c) of spec 3.3 around ``LPC(b, theta)``.

    ``b=None`` gives full precision (float32 payloads through scheme (a)); schemes (b) and (c)
    add integer codes on a common scale and so need the LPC codec.
    """
    check_choice("scheme", scheme, SCHEMES)
    if b is None:
        if scheme != "a":
            raise ValueError(
                f"scheme ({scheme}) adds low-precision integer codes at a server; full "
                "precision (b=None) travels with scheme (a)"
            )
        return AllGatherDecode(Identity(), run_seed=run_seed)
    codec = LPC(b=b, theta=theta, packing=packing)
    if scheme == "a":
        return AllGatherDecode(codec, run_seed=run_seed)
    if packing != "fixed":
        raise ValueError(
            f"scheme ({scheme}) packs the integer codes itself at fixed width; packing="
            f"{packing!r} applies to scheme (a) only"
        )
    downlink: IntSumDownlink = "sum" if scheme == "b" else "requantize"
    return ServerIntegerSum(codec, run_seed=run_seed, downlink=downlink)


def shard(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """Rank ``rank``'s contiguous share ``[start, stop)`` of ``n`` samples (sizes differ by at
    most one)."""
    return rank * n // world_size, (rank + 1) * n // world_size


class Channel:
    """One rank's end of the rounds of a run: averaged messages and full gradients."""

    def __init__(self, transport: Transport, scheme: Scheme) -> None:
        self.transport = transport
        self.scheme = scheme
        self.run_seed = scheme.run_seed
        self._fp32 = Identity()

    def average(self, u: torch.Tensor, step: int, what: str = "message") -> torch.Tensor:
        """``(1/M) sum_alpha Q(u_alpha)`` through the scheme, equal on every rank, in ``u``'s
        dtype; raises (on every rank) if any rank's ``u`` is not finite."""
        agree_all_finite(self.transport, [u], step, "raise", f" (the {what})")
        saved = self.scheme.snapshot()
        try:
            mean = self.scheme.reduce(self.transport, u.to(torch.float32), step, 0)
        except BaseException:
            self.scheme.restore(saved)
            raise
        return mean.to(u.dtype)

    def full_gradient(self, problem: FiniteSum, x: torch.Tensor, step: int) -> torch.Tensor:
        """``grad f(x)``: every rank computes the gradient sum of its shard, the float32 sums are
        all-gathered and added in rank order (so every rank gets the same bits), then divided
        by ``n``. Counted under :data:`FULL_GRADIENT`."""
        t = self.transport
        start, stop = shard(problem.n, t.rank, t.world_size)
        part = problem.grad_range(x, start, stop) if stop > start else torch.zeros_like(x)
        agree_all_finite(t, [part], step, "raise", " (the full gradient)")
        key = StreamKey(self.run_seed, t.rank, step, FULL_TENSOR_INDEX)
        payload = bytes(self._fp32.encode(part.to(torch.float32), key).payload)
        with t.step_scope(step):
            payloads = [host_bytes(p) for p in t.all_gather_bytes(payload, FULL_GRADIENT)]
        total = torch.zeros(x.shape, dtype=torch.float64)
        for rank, payload in enumerate(payloads):
            expected = StreamKey(self.run_seed, rank, step, FULL_TENSOR_INDEX)
            total += self._fp32.decode(payload, expected_key=expected, shape=x.shape)
        return total.div_(problem.n).to(x.dtype)

    def inner_bits(self, step: int) -> int:
        """Bits this rank sent in round ``step`` for the averaged message (headers and length
        prefixes included; the finiteness flags and the full gradient excluded)."""
        meter = self.transport.meter
        sent = meter.total(step).sent
        sent -= meter.total(step, FINITE_CHECK).sent + meter.total(step, FULL_GRADIENT).sent
        return 8 * sent

    def full_gradient_bits(self, step: int) -> int:
        """Bits this rank sent in round ``step`` for the full gradient."""
        return 8 * self.transport.meter.total(step, FULL_GRADIENT).sent
