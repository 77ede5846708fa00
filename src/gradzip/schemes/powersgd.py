"""PowerSGD: rank-r gradient approximation by one step of power iteration, with real payloads.

Vogels, Karimireddy, Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for Distributed
Optimization", NeurIPS 2019 (Alg. 1 and 2); the same method as PyTorch's ``powerSGD_hook``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from gradzip.comm.transport import Transport
from gradzip.compressors.base import Compressor
from gradzip.errors import CheckpointError, GradzipError
from gradzip.feedback import Slot
from gradzip.kernels import lowrank
from gradzip.kernels._threads import call_parallel
from gradzip.keys import StreamKey
from gradzip.rng import shared_uniform
from gradzip.schemes.allgather_decode import AllGatherDecode
from gradzip.schemes.base import Scheme, working_dtype

_STATE_VERSION = 1
#: chunk numbers of the two factor payloads of a tensor (chunk 0: a tensor sent whole)
P_CHUNK, Q_CHUNK = 1, 2
#: the chunk of the key whose shared stream draws a tensor's first Q (never a payload's)
_INIT_CHUNK = 3
#: columns per parallel task of ``Q = M^T P`` (a block of each row stays in L1)
_COLUMN_BLOCK = 256


class PowerSGD(Scheme):
    """Rank-``r`` PowerSGD over gradzip's transport: every byte is a real, counted payload.

    Per tensor of shape ``(n, ...)`` viewed as an ``n x m`` matrix ``M`` (plus this rank's
    residual ``e`` with error feedback): ``P = (M + e) Q`` with ``Q`` the previous step's
    (warm start; the first from the shared stream, uniform in ``[-1, 1)``), ``P`` averaged over
    the ranks, orthonormalised (Gram-Schmidt), ``Q = (M + e)^T P`` averaged, and the result
    ``P Q^T``: the projection of the ranks' mean onto the span of ``P``, bit-identical on every
    rank. The residual becomes ``(M + e) - P Q^T``. The two averages are all-gathers of
    payloads of the factor codec (``compressor``: ``identity`` for float32 factors, as in the
    paper; ``fp16``, ``bf16`` or a quantizer to send fewer bytes), decoded and summed in rank
    order (:class:`AllGatherDecode`), so a lossy codec's error lands in the result and in the
    residual, never in disagreement between ranks.

    Bits per rank and step for a compressed ``n x m`` tensor: the codec's payloads of ``r n``
    and ``r m`` values (with ``identity``: ``32 r (n + m)`` plus two headers), against ``32 n
    m`` uncompressed, sent to each of the other ``P - 1`` ranks. A tensor of one dimension, or
    one whose ``r (n + m) * min_compression_rate`` is not below ``n m`` (PyTorch's rule), is
    sent whole through the factor codec instead (with ``identity``: its exact float32 mean).

    Variance and bias: the approximation is biased (it drops the mean's components outside the
    span of ``P``); error feedback (``error_feedback=True``, the default, as in the paper)
    carries them to the next steps, and the warm start makes the power iteration converge to
    the mean's top singular directions over the steps.

    Determinism [CHOICE]: the products and the orthonormalisation are numba kernels with a
    fixed order of operations (:mod:`gradzip.kernels.lowrank`), not BLAS, whose order depends on
    the CPU and the thread count; the same inputs give the same bits on every machine, so a
    simulated run equals a real one and a resumed run its uninterrupted twin. The first ``Q`` is
    uniform rather than normal (PyTorch's) [CHOICE]: any full-rank random start serves the power
    iteration, and a uniform one is exact arithmetic on the shared Philox stream.

    Precision: a compressed tensor is approximated in float32 whatever its dtype (a float64
    gradient's result is the float32 approximation widened, as the scheme contract's dtype).

    State: the warm-start ``Q`` and the residual of every compressed tensor (``state_dict``);
    both are replaced only once a reduction has completed, so a step that fails half way
    changes nothing.
    """

    name = "powersgd"
    feedback_roles = ()
    exact_with_lossless_codec = False

    def __init__(
        self,
        compressor: Compressor,
        *,
        run_seed: int = 0,
        error_feedback: bool = True,
        rank: int = 1,
        min_compression_rate: float = 2.0,
    ) -> None:
        super().__init__(compressor, run_seed=run_seed, error_feedback=False)
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"rank must be an int >= 1, got {rank!r}")
        if not isinstance(min_compression_rate, int | float) or not min_compression_rate >= 1:
            raise ValueError(f"min_compression_rate must be >= 1, got {min_compression_rate!r}")
        if not isinstance(error_feedback, bool):
            raise ValueError(f"error_feedback must be a bool, got {error_feedback!r}")
        self.rank = rank
        self.min_compression_rate = float(min_compression_rate)
        self.keeps_residuals = error_feedback
        self.factors = AllGatherDecode(compressor, run_seed=run_seed)
        self.produced = self.factors.produced  # the factor payloads, for bit accounting
        self._q: dict[int, torch.Tensor] = {}
        self._residuals: dict[int, torch.Tensor] = {}

    @property
    def error_feedback(self) -> bool:
        return self.keeps_residuals

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
        if not self.compresses(tensor.shape):
            return self.factors.reduce(transport, tensor, step, tensor_index)
        shape = tensor.shape
        n = shape[0]
        m = shape.numel() // n
        r = min(self.rank, n, m)
        matrix = tensor.detach().to("cpu", torch.float32).reshape(n, m)
        residual = self._residuals.get(tensor_index)
        if residual is not None and residual.shape == matrix.shape:
            matrix = matrix + residual
        else:
            matrix = matrix.contiguous().clone()
        qt = self._q.get(tensor_index)
        if qt is None or qt.shape != (r, m):
            qt = self.initial_q(tensor_index, r, m)
        pt = torch.empty(r, n, dtype=torch.float32)
        call_parallel(lowrank.project, matrix.numpy(), qt.numpy(), pt.numpy())
        pt = self._average(transport, pt, step, tensor_index, P_CHUNK)
        lowrank.orthonormalize(pt.numpy())
        qt = torch.empty(r, m, dtype=torch.float32)
        call_parallel(lowrank.back_project, matrix.numpy(), pt.numpy(), qt.numpy(), _COLUMN_BLOCK)
        qt = self._average(transport, qt, step, tensor_index, Q_CHUNK)
        approx = torch.empty(n, m, dtype=torch.float32)
        call_parallel(lowrank.reconstruct, pt.numpy(), qt.numpy(), approx.numpy())
        # the state changes only now, after both exchanges have succeeded
        if self.keeps_residuals:
            self._residuals[tensor_index] = matrix.sub_(approx)
        self._q[tensor_index] = qt
        return approx.view(shape).to(working_dtype(tensor.dtype))

    def initial_q(self, tensor_index: int, r: int, m: int) -> torch.Tensor:
        """The first ``Q^T`` of a tensor: ``2u - 1`` for shared uniforms ``u`` (exact), the same
        on every rank."""
        key = StreamKey(self.run_seed, 0, 0, tensor_index, _INIT_CHUNK)
        return shared_uniform(key, r * m).mul_(2.0).sub_(1.0).view(r, m)

    def _average(
        self, transport: Transport, factor: torch.Tensor, step: int, tensor_index: int, chunk: int
    ) -> torch.Tensor:
        """The ranks' mean of ``factor`` through the factor codec (a fresh contiguous tensor)."""
        outgoing = self.factors.encode_flagged(
            transport.rank, factor, step, tensor_index, True, chunk
        )
        payloads, down = self.factors.gather_flagged(transport, outgoing, step)
        if down:
            raise GradzipError(
                f"powersgd: rank(s) {down} could not encode their factor of tensor "
                f"{tensor_index} at step {step} (non-finite values: the gradient or the "
                "residual overflowed); nothing was updated"
            )
        mean = self.factors.average(
            payloads, step, tensor_index, factor.shape, torch.float32, chunk=chunk
        )
        return mean.to(torch.float32).contiguous().clone()

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
