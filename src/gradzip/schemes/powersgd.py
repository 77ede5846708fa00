"""PowerSGD: rank-r gradient approximation by one step of power iteration, with real payloads.

Vogels, Karimireddy, Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for Distributed
Optimization", NeurIPS 2019 (Alg. 1 and 2); the same method as PyTorch's ``powerSGD_hook``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from gradzip.choices import check_choice, choices_of
from gradzip.comm.transport import Transport
from gradzip.compressors.base import Compressor, empty_output_on
from gradzip.device.ops import on_device
from gradzip.errors import CheckpointError, GradzipError
from gradzip.feedback import Slot, working_dtype
from gradzip.keys import StreamKey
from gradzip.rng import shared_uniform
from gradzip.schemes._powersgd_ops import HOST_OPS, LowRankOps, lowrank_ops
from gradzip.schemes.allgather_decode import AllGatherDecode
from gradzip.schemes.base import Scheme
from gradzip.schemes.integer_allreduce import IntegerAllreduce

_STATE_VERSION = 1
#: the two messages of a reduction: the tensors sent whole with every ``P``, then every ``Q``
FIRST, SECOND = 0, 1
#: how the factors are averaged: all-gathered payloads decoded in rank order, or the
#: all-reduce-compatible integer sums (a quantizer on a common scale, codes summed by a ring)
#: how the factors travel: all-gathered payloads, or integer codes summed by a ring
FactorScheme = Literal["allgather", "allreduce"]
FACTOR_SCHEMES = {"allgather": AllGatherDecode, "allreduce": IntegerAllreduce}
#: the chunk of the key whose shared stream draws a tensor's first Q: no encoder draws from a
#: key of this chunk (payloads draw from chunk 0; a ring's integer messages only name
#: themselves with theirs)
_INIT_CHUNK = 3


@dataclass
class _Factors:
    """One approximated tensor during a reduction: its gradient, residual, matrix ``M + e``
    and factors."""

    index: int
    gradient: torch.Tensor  # (n, m) float32 where the ops compute (the tensor where it can be)
    residual: torch.Tensor | None  # (n, m) float32: the residual kept, left as it is
    qt: torch.Tensor  # (r, m): the warm start, then the mean of Q
    pt: torch.Tensor  # (r, n): room for this rank's P, then the orthonormalised mean
    #: ``M + e`` in fresh room, built with ``P`` (this rank's own: becomes the residual)
    matrix: torch.Tensor | None = None

    @property
    def built(self) -> torch.Tensor:
        """``M + e``, once built (every rank's flag was up, so every rank built it)."""
        if self.matrix is None:
            raise GradzipError(f"powersgd: tensor {self.index}'s M + e was not built")
        return self.matrix


def _joined(parts: list[torch.Tensor], dtype: torch.dtype, on_host: bool) -> torch.Tensor:
    """The parts flattened into one contiguous tensor of ``dtype``: on the CPU for the host
    path, where the parts are for the device path."""
    if not parts:
        return torch.empty(0, dtype=dtype)
    if on_host:
        return torch.cat([p.reshape(-1).to("cpu", dtype) for p in parts])
    return torch.cat([p.reshape(-1).to(dtype) for p in parts])


def _rooms(tensors: Sequence[torch.Tensor], on_host: bool) -> list[torch.Tensor | None]:
    """Where each tensor's mean is written: consecutive views of one run (recycled host memory
    on the host path, the tensors' device otherwise) when every tensor is float32, so a group's
    means lie end to end (the DDP hook hands such a run to DDP whole instead of copying the
    means into the bucket); else nowhere (None each: each mean in room of its own)."""
    if not tensors or any(t.dtype != torch.float32 for t in tensors):
        return [None] * len(tensors)
    device = None if on_host else tensors[0].device
    room = empty_output_on(sum(t.numel() for t in tensors), torch.float32, device)
    return list(_split(room, [t.numel() for t in tensors]))


def _split(flat: torch.Tensor, numels: list[int]) -> list[torch.Tensor]:
    """``flat`` cut into consecutive pieces of ``numels`` elements (views)."""
    return list(torch.split(flat, numels)) if numels else []


class PowerSGD(Scheme):
    """Rank-``r`` PowerSGD over gradzip's transport: every byte is a real, counted payload.

    Per tensor of shape ``(n, ...)`` viewed as an ``n x m`` matrix ``M`` (plus this rank's
    residual ``e`` with error feedback): ``P = (M + e) Q`` with ``Q`` the previous step's
    (warm start; the first from the shared stream, uniform in ``[-1, 1)``), ``P`` averaged over
    the ranks, orthonormalised (Gram-Schmidt), ``Q = (M + e)^T P`` averaged, and the result
    ``P Q^T``: the projection of the ranks' mean onto the span of ``P``, bit-identical on every
    rank. The residual becomes ``(M + e) - P Q^T``. The two averages go through the factor
    codec (``compressor``: ``identity`` for float32 factors, as in the paper; ``fp16``, ``bf16``
    or a quantizer to send fewer bytes) and the factor scheme: ``"allgather"`` (default) sends
    every rank's payload to every rank and decodes them in rank order
    (:class:`AllGatherDecode`, any codec); ``"allreduce"`` quantizes on a scale common to the
    ranks and sums the integer codes in a ring (:class:`IntegerAllreduce`: dqsg, qsgd, terngrad,
    lpc), an exact integer sum whose bytes per rank stay near ``2 (P-1)/P`` of one payload as
    ``P`` grows, at the price of a scale round and ``2 (P-1)`` ring steps per message. Either
    way a lossy codec's error lands in the result and in the residual, never in disagreement
    between ranks.

    Bits per rank and step for a compressed ``n x m`` tensor: the codec's payloads of ``r n``
    and ``r m`` values (with ``identity``: ``32 r (n + m)`` plus two headers), against ``32 n
    m`` uncompressed, sent to each of the other ``P - 1`` ranks. A tensor of one dimension, or
    one whose ``r (n + m) * min_compression_rate`` is not below ``n m`` (PyTorch's rule), is
    sent whole through the factor codec instead (with ``identity``: its exact float32 mean).

    ``start_step`` (PyTorch's ``start_powerSGD_iter``, 0 by default): the steps before it send
    every tensor whole through the factor codec (float32 with ``identity``, half precision with
    ``fp16``) and leave the warm starts and residuals untouched; a few such steps at the start
    of training spare it the low-rank error while the gradients change fastest.

    Variance and bias: the approximation is biased (it drops the mean's components outside the
    span of ``P``); error feedback (``error_feedback=True``, as in the paper and PyTorch's
    hook; off by default like every scheme's [CHOICE], so pass it) carries them to the next steps, and the warm start makes the power iteration converge to
    the mean's top singular directions over the steps.

    Determinism [CHOICE]: the products and the orthonormalisation are numba kernels with a
    fixed order of operations (:mod:`gradzip.kernels.lowrank`), not BLAS, whose order depends on
    the CPU and the thread count; the same inputs give the same bits on every machine, so a
    simulated run equals a real one and a resumed run its uninterrupted twin.

    On the device (tensors not on the CPU, or inside
    :func:`~gradzip.device.mode.forced_device_payloads`): ``M + e``, the products, the
    orthonormalisation, ``P Q^T`` and the residual are torch operations on the gradient's
    device in the same order (:mod:`gradzip.kernels.lowrank_torch`: the same bits as the CPU
    kernels), and the factors travel as device payloads of a device-resident factor codec
    (fp16, bf16, identity) through the all-gather: nothing gradient-sized reaches the host.
    Host reads per bucket and rank with ``"allgather"``: the reads of the all-gather's two
    reductions (each: the encode's flag, a header and a flag per rank's payload;
    ``tests/schemes/test_powersgd_device.py`` bounds them); the ``"allreduce"`` factor scheme
    reads its messages on the host. The first ``Q`` is
    uniform rather than normal (PyTorch's) [CHOICE]: any full-rank random start serves the power
    iteration, and a uniform one is exact arithmetic on the shared Philox stream.

    Precision: a compressed tensor is approximated in float32 whatever its dtype (a float64
    gradient's result is the float32 approximation widened, as the scheme contract's dtype).

    Groups: :meth:`reduce_many_if_all_finite` takes several tensors (``GradientSync`` hands it
    a step's gradients, the DDP hook a bucket's parameters, each in its own shape) in two
    messages, as PyTorch's hook does per bucket; warm starts and residuals stay keyed by each
    tensor's index, so the grouping changes nothing in the state.

    State: the warm-start ``Q`` and the residual of every compressed tensor (``state_dict``);
    both are replaced only once a reduction has completed, so a step that fails half way
    changes nothing.
    """

    name = "powersgd"
    feedback_roles = ()
    exact_with_lossless_codec = False
    needs_shapes = True
    encodes_all_before_sending = True

    def __init__(
        self,
        compressor: Compressor,
        *,
        run_seed: int = 0,
        error_feedback: bool = False,
        rank: int = 1,
        min_compression_rate: float = 2.0,
        factor_scheme: FactorScheme = "allgather",
        start_step: int = 0,
    ) -> None:
        check_choice("factor_scheme", factor_scheme, choices_of(FactorScheme))
        super().__init__(compressor, run_seed=run_seed, error_feedback=False)
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"rank must be an int >= 1, got {rank!r}")
        if not isinstance(min_compression_rate, int | float) or not min_compression_rate >= 1:
            raise ValueError(f"min_compression_rate must be >= 1, got {min_compression_rate!r}")
        if isinstance(start_step, bool) or not isinstance(start_step, int) or start_step < 0:
            raise ValueError(f"start_step must be an int >= 0, got {start_step!r}")
        if not isinstance(error_feedback, bool):
            raise ValueError(f"error_feedback must be a bool, got {error_feedback!r}")
        self.rank = rank
        self.min_compression_rate = float(min_compression_rate)
        self.keeps_residuals = error_feedback
        self.factor_scheme = factor_scheme
        self.start_step = start_step
        self.factors: Scheme = FACTOR_SCHEMES[factor_scheme](compressor, run_seed=run_seed)
        # the all-gather's encoder refuses a non-finite value and lowers the flag itself
        # (AllGatherDecode.encode_flagged); the integer sum's needs the values scanned first
        self._scan_factors = not self.factors.flag_rides_on_payload
        self.produced = self.factors.produced  # the factor payloads, for bit accounting
        self._q: dict[int, torch.Tensor] = {}
        self._residuals: dict[int, torch.Tensor] = {}

    @property
    def error_feedback(self) -> bool:
        return self.keeps_residuals

    @property
    def groups_exactly(self) -> bool:
        """Whether the means are independent of how the tensors are grouped: the factors of a
        group travel joined in one payload, so only with a codec that
        :attr:`~gradzip.compressors.base.Compressor.encodes_each_value_alone` (``identity``,
        ``bf16``); ``fp16``'s scale and a quantizer's scale and dither belong to the group."""
        return self.compressor.encodes_each_value_alone

    def compresses(self, shape: torch.Size) -> bool:
        """Whether a tensor of ``shape`` is approximated (else it is sent whole)."""
        if len(shape) < 2:
            return False
        n = shape[0]
        m = shape.numel() // n if n else 0
        r = min(self.rank, n, m)
        return r > 0 and r * (n + m) * self.min_compression_rate < n * m

    def reduce(
        self, transport: Transport, tensor: torch.Tensor, step: int, tensor_index: int = 0
    ) -> torch.Tensor:
        means, down = self.reduce_many_if_all_finite(
            transport, [tensor], [tensor_index], step, True
        )
        if down:
            raise GradzipError(
                f"powersgd: rank(s) {down} could not encode tensor {tensor_index} at step {step} "
                "(non-finite values); nothing was updated"
            )
        return means[0]

    def reduce_many_if_all_finite(
        self,
        transport: Transport,
        tensors: Sequence[torch.Tensor],
        indices: Sequence[int],
        step: int,
        finite: bool,
    ) -> tuple[list[torch.Tensor], list[int]]:
        """Every tensor in two messages, as PyTorch's hook does per bucket: the first carries
        the tensors sent whole and every approximated tensor's ``P``, the second every ``Q``.

        Keys: tensor index ``2 indices[0] + m`` for message ``m`` (:data:`FIRST`, then
        :data:`SECOND`; unique in the step, as every index belongs to one group). Warm starts
        and residuals are kept per tensor index, so any grouping of the tensors gives the same
        state (and, with a codec that treats each value on its own, the same means). Every
        tensor's values reach the first message (a non-finite gradient or residual sum makes
        its ``P`` non-finite), which carries the agreed ``finite`` flag: in the payload's header
        with the all-gather, whose encoder lowers it on a non-finite value; after a scan of the
        message, and in a flag message of its own, with the integer sum. A flag down in the second message
        (a ``Q`` that overflowed) raises :class:`~gradzip.errors.GradzipError`. Nothing
        changes unless both succeed."""
        if len(tensors) != len(indices) or not tensors:
            raise ValueError(f"{len(tensors)} tensors but {len(indices)} tensor indices")
        key_index = indices[0]
        # before start_step every tensor travels whole and the state stays as it is
        approximating = step >= self.start_step
        ops = lowrank_ops(tensors)
        on_host = ops is HOST_OPS
        sets = [
            self._factor_set(t, i, ops) if approximating and self.compresses(t.shape) else None
            for t, i in zip(tensors, indices, strict=True)
        ]
        whole = [t for t, f in zip(tensors, sets, strict=True) if f is None]
        approximated = [f for f in sets if f is not None]
        if finite:
            for f in approximated:
                f.matrix, f.pt = ops.matrix_projected(f.gradient, f.residual, f.qt)
        # [CHOICE] the first message is float64 where a tensor sent whole is (its exact mean)
        dtype = torch.float64 if any(t.dtype == torch.float64 for t in whole) else torch.float32
        first = _joined(
            [t.detach().reshape(-1) for t in whole] + [f.pt for f in approximated],
            dtype,
            on_host,
        )
        mean, down = self._average(transport, first, step, key_index, FIRST, finite)
        if down:
            return [], down
        parts = iter(
            _split(mean, [t.numel() for t in whole] + [f.pt.numel() for f in approximated])
        )
        whole_means = [next(parts).view(t.shape).to(working_dtype(t.dtype)) for t in whole]
        for f in approximated:
            f.pt = ops.orthonormalized(next(parts).view(f.pt.shape))
            f.qt = ops.back_project(f.built, f.pt)
        if approximated:
            second = _joined([f.qt for f in approximated], torch.float32, on_host)
            mean, down = self._average(transport, second, step, key_index, SECOND, True)
            if down:
                raise GradzipError(
                    f"powersgd: rank(s) {down} could not encode their Q factors of tensors "
                    f"{list(indices)} at step {step} (non-finite values: the gradient or the "
                    "residual overflowed); nothing was updated"
                )
            for f, qt in zip(
                approximated, _split(mean, [f.qt.numel() for f in approximated]), strict=True
            ):
                f.qt = qt.view(f.qt.shape).contiguous()
        # the residual (M + e) - P Q^T is written into the fresh matrix with the approximation
        # (the kept residual is not touched), and becomes the state only below
        rooms = _rooms(tensors, on_host)
        approximations = {
            position: ops.reconstructed(f.pt, f.qt, f.built, self.keeps_residuals, room)
            for position, (f, room) in enumerate(zip(sets, rooms, strict=True))
            if f is not None
        }
        # the state changes only now, after every exchange has succeeded
        for f in approximated:
            if self.keeps_residuals:
                self._residuals[f.index] = f.built
            self._q[f.index] = f.qt
        whole_iter = iter(whole_means)
        means = []
        for position, (t, room) in enumerate(zip(tensors, rooms, strict=True)):
            if position in approximations:
                mean = approximations[position].view(t.shape).to(working_dtype(t.dtype))
            else:
                mean = next(whole_iter)
                if room is not None:  # beside the approximations: the group's means are one run
                    mean = room.view(t.shape).copy_(mean)
            means.append(mean)
        return means, []

    def _factor_set(self, tensor: torch.Tensor, tensor_index: int, ops: LowRankOps) -> _Factors:
        """The tensor as an ``n x m`` float32 matrix and its residual (where ``ops``
        computes), the warm start ``Q^T`` and room for ``P^T``; ``M + e`` is built with ``P``
        (:meth:`~gradzip.schemes._powersgd_ops.LowRankOps.matrix_projected`)."""
        n = tensor.shape[0]
        m = tensor.numel() // n
        r = min(self.rank, n, m)
        gradient = ops.gradient(tensor).reshape(n, m)
        device = gradient.device
        # M + e will go into fresh room (on the host a recycled array): the old residual is
        # not touched (a failed step restores it) and is dropped once replaced
        residual = self._residuals.get(tensor_index)
        if residual is not None and residual.shape == gradient.shape:
            residual = on_device(residual, device)
        else:
            residual = None
        qt = self._q.get(tensor_index)
        if qt is None or qt.shape != (r, m):
            qt = self.initial_q(tensor_index, r, m, device)
        pt = torch.empty(r, n, dtype=torch.float32, device=device)
        return _Factors(tensor_index, gradient, residual, on_device(qt, device), pt)

    def initial_q(
        self, tensor_index: int, r: int, m: int, device: torch.device | None = None
    ) -> torch.Tensor:
        """The first ``Q^T`` of a tensor: ``2u - 1`` for shared uniforms ``u`` (exact), the same
        on every rank and device (drawn there: :func:`~gradzip.rng.shared_uniform`)."""
        key = StreamKey(self.run_seed, 0, 0, tensor_index, _INIT_CHUNK)
        return shared_uniform(key, r * m, device).mul_(2.0).sub_(1.0).view(r, m)

    def _average(
        self,
        transport: Transport,
        values: torch.Tensor,
        step: int,
        key_index: int,
        message: int,
        finite: bool,
    ) -> tuple[torch.Tensor, list[int]]:
        """The ranks' mean of ``values`` through the factor scheme, or the ranks whose flag is
        down (this rank's is lowered by ``finite`` or by a non-finite value)."""
        if self._scan_factors:
            finite = finite and bool(torch.isfinite(values).all())
        result = self.factors.reduce_if_all_finite(
            transport, values, step, 2 * key_index + message, finite
        )
        if isinstance(result, list):
            return values, result
        return result, []

    # -- state ----------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, dict[Slot, torch.Tensor]]:
        """The current warm starts and residuals (references: reductions replace, never
        mutate, them)."""
        return {
            "q": {(i, 0): t for i, t in self._q.items()},
            "residual": {(i, 0): t for i, t in self._residuals.items()},
        }

    def restore(self, snapshot: Mapping[str, dict[Slot, torch.Tensor]]) -> None:
        self._q = {i: t for (i, _), t in snapshot["q"].items()}
        self._residuals = {i: t for (i, _), t in snapshot["residual"].items()}

    def state_dict(self) -> dict[str, Any]:
        """The rank, the warm-start ``Q^T`` and the residual of every compressed tensor."""
        return {
            "version": _STATE_VERSION,
            "scheme": self.name,
            "rank": self.rank,
            "q": {i: t.clone() for i, t in self._q.items()},
            "residual": {i: t.clone() for i, t in self._residuals.items()},
        }

    def parse_state(self, state: Mapping[str, Any]) -> dict[str, dict[Slot, torch.Tensor]]:
        """The :meth:`restore` point of a :meth:`state_dict`, every entry checked first."""
        if not isinstance(state, Mapping) or state.get("version") != _STATE_VERSION:
            found = state.get("version") if isinstance(state, Mapping) else type(state).__name__
            raise CheckpointError(f"powersgd state has version {found!r}")
        if state.get("scheme") != self.name:
            raise CheckpointError(f"scheme state is for {state.get('scheme')!r}, not {self.name!r}")
        if state.get("rank") != self.rank:
            raise CheckpointError(
                f"powersgd state was saved at rank {state.get('rank')!r}, this scheme has rank "
                f"{self.rank}"
            )
        parsed: dict[str, dict[Slot, torch.Tensor]] = {}
        for part in ("q", "residual"):
            entries = state.get(part)
            if not isinstance(entries, Mapping):
                raise CheckpointError(f"powersgd state has no {part!r} mapping")
            parsed[part] = {}
            for index, tensor in entries.items():
                ok = isinstance(index, int) and isinstance(tensor, torch.Tensor)
                if not ok or tensor.dtype != torch.float32 or tensor.dim() != 2:
                    raise CheckpointError(
                        f"powersgd state's {part}[{index!r}] must be a 2-D float32 tensor"
                    )
                if not bool(torch.isfinite(tensor).all()):
                    raise CheckpointError(f"powersgd state's {part}[{index}] is not finite")
                parsed[part][(index, 0)] = tensor.clone()
        if not self.keeps_residuals and parsed["residual"]:
            raise CheckpointError("powersgd state holds residuals; this scheme keeps none")
        return parsed

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict`; on a :class:`CheckpointError` nothing changes."""
        self.restore(self.parse_state(state))
