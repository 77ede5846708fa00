"""A ``DistributedDataParallel`` communication hook that averages gradients through gradzip.

Any gradzip scheme (and so any compressor it accepts) replaces DDP's all-reduce::

    import gradzip
    from gradzip.integrations.ddp import register_gradzip_hook
    from gradzip.schemes import AllGatherDecode

    ddp_model = DistributedDataParallel(model)
    scheme = AllGatherDecode(gradzip.create("dqsg", M=2), run_seed=7, error_feedback=True)
    state = register_gradzip_hook(ddp_model, scheme)
    # the same as: state = GradzipHookState(scheme, ddp_model)
    #              ddp_model.register_comm_hook(state, gradzip_hook)
    for x, y in data:
        opt.zero_grad()
        loss_fn(ddp_model(x), y).backward()  # the hook runs here, once per bucket
        opt.step()

How it fits PyTorch's hook interface (``DistributedDataParallel.register_comm_hook`` and the
stock hooks in ``torch.distributed.algorithms.ddp_comm_hooks``: ``allreduce_hook``, the
fp16/bf16 compression hooks, PowerSGD): DDP packs gradients into flat buckets, and as each
bucket becomes ready during ``backward()`` it calls ``hook(state, bucket)``, which must return a
``torch.futures.Future`` whose value is the bucket's *averaged* flat tensor. With a hook
registered DDP neither communicates nor divides by the world size itself; when every bucket's
future is done it copies the results into the parameters' ``.grad``.

What goes over the wire, per rank and backward pass: for each bucket, one flag byte all-gathered
(``P - 1`` messages of 1 + 8 bytes sent and as many received: the finite-gradient agreement),
then for each parameter whatever ``scheme.reduce`` sends for that one tensor. Every payload
carries a gradzip header and CRC (about 25 to 40 bytes) plus the transport's 8-byte length
prefix, and every parameter travels in payloads of its own (one per rank, or one per slice in
schemes that split tensors), so a model with many small tensors (biases, norms) pays that
overhead many times. The bytes are counted on ``state.transport.meter``, tagged with the hook's
step counter. Under ``ddp_model.no_sync()`` (gradient accumulation) DDP calls no hook; the next
synchronising backward pass is one step.

The hook computes on the CPU (the schemes do), then writes the averages into the bucket's own
buffer, so the result has the buffer's device and dtype; with NCCL, build the transport as
:class:`~gradzip.comm.distributed.DistributedTransport` documents (the current CUDA device
selected first). It runs synchronously inside ``backward()``: communication does not overlap
with the rest of the backward pass as DDP's asynchronous all-reduce does.

Checkpoints: ``state.state_dict()`` holds the step counter, the skip count, the run seed, rank
and group size, and the scheme's error-feedback buffers (``torch.save``-able, one per rank: the
buffers differ between ranks). To resume, rebuild the DDP wrapper, register a fresh hook state
with the same scheme settings and run seed, and call ``state.load_state_dict(saved)`` on every
rank with that rank's own state, beside the model's and the optimizer's ``load_state_dict``,
before the first backward pass; the run then continues bit-exactly. A state saved by another
rank, group size or run seed, or a malformed one (negative counters, a residual slot listed
twice, ...) raises :class:`~gradzip.errors.CheckpointError` and changes nothing.

Buffers are not gradients: the hook reduces gradients only, so BatchNorm's running statistics
(and every other module buffer) are updated by each rank from its own batch. DDP's default
``broadcast_buffers=True`` then overwrites every rank's buffers with rank 0's at the start of
each training forward pass, so the ranks agree on rank 0's statistics (not their average);
with ``broadcast_buffers=False`` they stay per rank and drift apart. Save the model from rank 0,
or convert it with ``torch.nn.SyncBatchNorm`` for statistics over the global batch.

Not supported: DDP's ``join()`` context for uneven inputs and sparse gradients (they were not
tested and the gradient keys assume dense, identically shaped tensors on every rank).
"""

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

# [CHOICE] Imported at run time, for the annotation of ``gradzip_hook`` only: DDP's
# ``register_comm_hook`` compares the hook's ``bucket`` annotation with this very class (so
# this module cannot use ``from __future__ import annotations``: a string annotation is refused).
from torch.distributed import GradBucket  # type: ignore[attr-defined]  # re-exported by torch

from gradzip.comm.distributed import DistributedTransport
from gradzip.comm.transport import Transport
from gradzip.errors import GradzipError, NonFiniteInputError
from gradzip.feedback import Slot
from gradzip.schemes.base import Scheme
from gradzip.stepping import (
    agree_all_finite,
    check_on_nonfinite,
    install_step_state,
    parse_step_state,
    step_state,
)

if TYPE_CHECKING:
    from torch.nn.parallel import DistributedDataParallel

_STATE_VERSION = 1


class GradzipHookState:
    """The state of :func:`gradzip_hook`: the scheme, the transport, the step counter.

    ``GradzipHookState(scheme, model, transport=None, on_nonfinite="raise")``: ``model`` is the
    DDP wrapper or the module it wraps (both list the same parameters in the same order);
    ``transport`` defaults to a :class:`~gradzip.comm.distributed.DistributedTransport` on the
    default process group.

    [CHOICE] Per-parameter reduction. The hook does not compress DDP's flat bucket: it reduces
    each parameter's gradient (``bucket.gradients()``, views into the bucket's buffer) with
    ``scheme.reduce(transport, grad, step, tensor_index=i)``, where ``i`` is that parameter's
    position among ``model.parameters()`` that require grad (matched by identity). DDP decides
    the buckets, and rebuilds them after the first iteration in the order gradients became
    ready; keying by bucket would change every payload key and error-feedback slot at that
    rebuild (and whenever the bucket size changes). Keyed by parameter, the keys and residuals
    do not depend on the bucketing at all, and the averages are bit-identical to those of
    :class:`~gradzip.sync.GradientSync` with the parameters in model order (what
    :class:`~gradzip.optim.CompressedOptimizer` sends). The price is one message (with its
    header) per parameter instead of per bucket.

    [CHOICE] Steps. One backward pass is one step: the counter keys the payloads and advances
    after the bucket for which ``bucket.is_last()`` holds (DDP hands the buckets over in index
    order on every rank). A step is all-or-nothing: at its first bucket the scheme's state is
    snapshot; if any bucket fails, the snapshot is restored, the step counter stays and the
    error propagates out of ``loss.backward()``. A gradzip ``NonFiniteInputError`` passes
    through unchanged; any other exception is re-raised as a
    :class:`~gradzip.errors.GradzipError` naming the step and bucket (the original as its
    ``__cause__``). Note that DDP itself refuses the next forward pass of a wrapper whose
    backward raised ("Expected to have finished reduction in the prior iteration"): wrap the
    module in a new ``DistributedDataParallel`` and register this state on it again (its state
    is consistent), or resume from a checkpoint. A backward pass abandoned for a reason outside
    the hook is rolled back when the next one starts (or at :meth:`state_dict`).

    [CHOICE] Non-finite gradients. Before reducing a bucket the ranks agree, one byte each,
    that its gradients are finite (as ``GradientSync`` does once per step; a hook only sees one
    bucket at a time). A NaN or Inf on any rank then either raises
    :class:`~gradzip.errors.NonFiniteInputError` on every rank (``on_nonfinite="raise"``;
    nothing applied, state restored) or, with ``on_nonfinite="skip"``, skips the whole step on
    every rank: the scheme's state is restored, the buckets already reduced in this step and
    every later one are zero-filled, ``skipped_steps`` counts it and the step counter does not
    advance. Beware what a skip means under DDP: a hook cannot stop the optimizer, so
    ``opt.step()`` then runs with zero gradients. Plain SGD leaves the parameters unchanged,
    but momentum, weight decay and Adam-like optimizers still move them and update their own
    state. To skip the optimizer step too, compare ``state.skipped_steps`` before and after the
    backward pass.
    """

    def __init__(
        self,
        scheme: Scheme,
        model: torch.nn.Module,
        transport: Transport | None = None,
        on_nonfinite: str = "raise",
    ) -> None:
        if not isinstance(scheme, Scheme):
            raise TypeError(f"GradzipHookState needs a gradzip Scheme, got {type(scheme).__name__}")
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self.scheme = scheme
        self.transport: Transport = DistributedTransport() if transport is None else transport
        self.on_nonfinite = check_on_nonfinite(on_nonfinite)
        self.step = 0
        self.skipped_steps = 0
        # the list keeps the parameters alive, so their ids stay theirs
        self._parameters = [p for p in model.parameters() if p.requires_grad]
        self._index = {id(p): i for i, p in enumerate(self._parameters)}
        # the step in progress: its restore point (None between steps), whether it is being
        # skipped, and the buffers of the buckets handed back so far (zero-filled on a skip)
        self._saved: dict[str, dict[Slot, torch.Tensor]] | None = None
        self._skipping = False
        self._buffers: list[torch.Tensor] = []

    @property
    def run_seed(self) -> int:
        return self.scheme.run_seed

    # -- one bucket ----------------------------------------------------------------------------
    def reduce_bucket(self, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        """Average one bucket's gradients in place (what :func:`gradzip_hook` calls)."""
        position = bucket.index()
        if position == 0 or self._saved is None:
            self._begin_step()
        try:
            self._reduce(bucket, position)
        except NonFiniteInputError:
            self._roll_back()
            raise
        except Exception as err:
            step = self.step
            self._roll_back()
            raise GradzipError(
                f"gradzip DDP hook: step {step}, bucket {position} failed "
                f"({type(err).__name__}: {err}); this rank's scheme state was restored and its "
                f"step counter stays at {step}"
            ) from err
        except BaseException:
            self._roll_back()
            raise
        if bucket.is_last():
            if not self._skipping:
                self.step += 1
            self._end_step()
        buffer = bucket.buffer()
        # a future holding device tensors must name their devices (torch.futures.Future)
        devices: list[int | str | torch.device] | None = (
            None if buffer.device.type == "cpu" else [buffer.device]
        )
        future: torch.futures.Future[torch.Tensor] = torch.futures.Future(devices=devices)
        future.set_result(buffer)
        return future

    def _reduce(self, bucket: GradBucket, position: int) -> None:
        grads = bucket.gradients()
        indices = [self._index_of(p) for p in bucket.parameters()]
        if len(indices) != len(grads):
            raise GradzipError(
                f"bucket {position} lists {len(indices)} parameters but {len(grads)} gradients"
            )
        buffer = bucket.buffer()
        self._buffers.append(buffer)
        if self._skipping:  # every rank decided so together at an earlier bucket
            buffer.zero_()
            return
        if not self._agree_all_finite(grads, position):
            assert self._saved is not None
            self.scheme.restore(self._saved)
            self._skipping = True
            self.skipped_steps += 1
            # DDP reads the earlier buckets' futures only when the backward pass ends, so
            # zero-filling their buffers now still reaches the gradients
            for earlier in self._buffers:
                earlier.zero_()
            return
        means = [
            self.scheme.reduce(self.transport, grad.detach(), self.step, index)
            for grad, index in zip(grads, indices, strict=True)
        ]
        for grad, mean in zip(grads, means, strict=True):
            grad.copy_(mean)  # into the bucket's buffer: its device and dtype

    def _index_of(self, parameter: torch.Tensor) -> int:
        try:
            return self._index[id(parameter)]
        except KeyError:
            raise GradzipError(
                f"DDP handed the hook a parameter of shape {tuple(parameter.shape)} that is not "
                "among the model's parameters given to GradzipHookState (pass the model that "
                "DDP wraps)"
            ) from None

    def _agree_all_finite(self, grads: list[torch.Tensor], position: int) -> bool:
        return agree_all_finite(
            self.transport,
            grads,
            self.step,
            self.on_nonfinite,
            f", DDP bucket {position}",
            ". DDP will refuse the next forward pass of this wrapper: wrap the module again and "
            "register this hook state on it, or resume from a checkpoint",
        )

    # -- step bookkeeping ----------------------------------------------------------------------
    def _begin_step(self) -> None:
        self._roll_back()  # a backward pass abandoned half way applies nothing
        self._saved = self.scheme.snapshot()

    def _roll_back(self) -> None:
        if self._saved is not None:
            self.scheme.restore(self._saved)
        self._end_step()

    def _end_step(self) -> None:
        self._saved = None
        self._skipping = False
        self._buffers = []

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The step counter, the skip count, the run seed, rank and group size, and the
        scheme's buffers (``torch.save``-able); with the model's and the optimizer's state it
        resumes a run bit-exactly."""
        self._roll_back()
        return step_state(
            _STATE_VERSION, self.step, self.skipped_steps, self.transport, self.scheme
        )

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict` (call it on every rank, with that rank's own state,
        before the first backward pass of the resumed run, beside the model's and the
        optimizer's ``load_state_dict``); the run seed, rank and group size must match.

        Everything is validated before anything changes: a refused state raises
        :class:`~gradzip.errors.CheckpointError` and leaves the counters and error-feedback
        buffers as they were.
        """
        parsed = parse_step_state(
            state, _STATE_VERSION, "DDP hook state", self.transport, self.scheme
        )
        self._roll_back()
        self.step, self.skipped_steps = install_step_state(parsed, self.scheme)


def gradzip_hook(state: GradzipHookState, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The communication hook: ``ddp_model.register_comm_hook(state, gradzip_hook)``.

    Replaces the bucket's gradients by their rank-average through ``state.scheme`` (see
    :class:`GradzipHookState`) and returns an already completed future holding the bucket's
    buffer.

    [CHOICE] Completed futures. The schemes are synchronous (each ``reduce`` returns the
    average), so the hook finishes its communication before returning, as PyTorch's own
    ``noop_hook`` hands back a completed future; nothing is left in flight when the backward
    pass ends or fails.
    """
    return state.reduce_bucket(bucket)


def register_gradzip_hook(
    ddp_model: "DistributedDataParallel",
    scheme: Scheme,
    transport: Transport | None = None,
    on_nonfinite: str = "raise",
) -> GradzipHookState:
    """Build a :class:`GradzipHookState` for ``ddp_model`` and register :func:`gradzip_hook`
    on it (DDP allows one hook per model, registered before the first backward pass)."""
    state = GradzipHookState(scheme, ddp_model, transport=transport, on_nonfinite=on_nonfinite)
    ddp_model.register_comm_hook(state, gradzip_hook)
    return state


__all__ = ["GradzipHookState", "gradzip_hook", "register_gradzip_hook"]
