"""A ``DistributedDataParallel`` communication hook that averages gradients through gradzip.

Any gradzip scheme (and so any compressor it accepts) replaces DDP's all-reduce::

    import gradzip
    from gradzip.integrations.ddp import register_gradzip_hook
    from gradzip.schemes import make_scheme

    ddp_model = DistributedDataParallel(model)
    scheme = make_scheme("allgather", gradzip.create("dqsg", M=2), run_seed=7, error_feedback=True)
    state = register_gradzip_hook(ddp_model, scheme)
    for x, y in data:
        opt.zero_grad()
        loss_fn(ddp_model(x), y).backward()  # the hook runs here, once per bucket
        opt.step()
    state.close()  # stops the stages' threads (garbage collection and interpreter exit do too)

DDP calls ``hook(state, bucket)`` as each flat bucket of gradients becomes ready; the hook
returns a future of the bucket's *average* (DDP then neither communicates nor divides). Each
parameter's gradient is encoded on its own, in its own shape, keyed by the parameter's
model-order index (:mod:`gradzip.integrations._layout`): DDP's buckets only decide which
payloads share a message, so what travels never depends on the bucket layout. The
finite-gradient agreement rides on each bucket's first message.

[CHOICE] Overlap: the hook only queues the bucket; three threads (encode, transfer, decode,
:mod:`gradzip.integrations._pipeline`) reduce it while backward goes on. A scheme that
:attr:`~gradzip.schemes.base.Scheme.pipelines` (the allgather) has them pipeline messages of at
most ``chunk_elements`` values (a larger parameter is encoded in the fixed pieces the scheme
cuts, :meth:`~gradzip.schemes.base.Scheme.parameter_pieces`), so the codec's time hides behind
the wire; other schemes requantize between messages and run whole in the transfer stage, one
parameter after another. The last bucket's call waits for the step and
raises its error, so it reaches the caller of ``loss.backward()``.

[CHOICE] Because every payload, scale, dither and error-feedback slot belongs to a parameter
(or a fixed piece of one), the scheme's own state is the hook's state: it survives DDP's bucket
rebuild, and a checkpoint (:meth:`GradzipHookState.state_dict`) resumes bit-exactly into any
buckets (a fresh wrapper's initial ones, another ``bucket_cap_mb``), matching the uninterrupted
run. The hook trains bit for bit like :class:`~gradzip.sync.GradientSync` on the same
parameters (same pieces: no parameter above ``chunk_elements`` values, or a scheme that does not
pipeline). The step's all-or-nothing bookkeeping lives in
:mod:`gradzip.integrations._transaction`, the checkpoint's format and checks in
:mod:`gradzip.integrations._checkpoint`.

[CHOICE] Device buckets (issue 28): with a device-resident codec the bucket never leaves its
device in the hook. Its payloads are joined and split on the device
(:mod:`gradzip.integrations._messages`), the mean is averaged into the bucket there, a scheme
that does not pipeline gets one finite flag for the whole bucket
(:mod:`gradzip.integrations._finite`), and every stage runs on the CUDA stream backward handed
the bucket over on (:mod:`gradzip.integrations._streams`). The hook's own reads back to the
host: one 12-byte length prefix per payload of every rank's message (pipelined), or one
one-byte flag per bucket (not pipelined). CPU buckets take the host path unchanged.

The user guide's page "The DDP hook and GradientSync" (docs/guide/ddp-hook-and-gradientsync.md)
explains the pipeline, the state, checkpoints, buffers (BatchNorm) and every failure mode.
Not supported: DDP's ``join()`` for uneven inputs, and sparse gradients.
"""

import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager as ContextManager
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import torch

# [CHOICE] Imported at run time, for the annotation of ``gradzip_hook`` only: DDP's
# ``register_comm_hook`` compares the hook's ``bucket`` annotation with this very class (so
# this module cannot use ``from __future__ import annotations``: a string annotation is refused).
from torch.distributed import GradBucket  # type: ignore[attr-defined]  # re-exported by torch

from gradzip.comm.distributed import DistributedTransport
from gradzip.comm.transport import Transport
from gradzip.device.mode import device_path
from gradzip.errors import GradzipError
from gradzip.flat_views import adjacent_flat
from gradzip.integrations._checkpoint import HookCheckpoint
from gradzip.integrations._finite import bucket_finite
from gradzip.integrations._job import BucketJob, BucketPart
from gradzip.integrations._layout import BucketLayout, Unit
from gradzip.integrations._messages import joined, split
from gradzip.integrations._pipeline import DECODE, ENCODE, TRANSFER, StagePipeline
from gradzip.integrations._streams import capture, running_on
from gradzip.integrations._timeline import Timeline
from gradzip.integrations._transaction import StepTransaction
from gradzip.kernels._threads import kernel_thread_count, use_kernel_threads
from gradzip.schemes.base import Outgoing, Piece, Scheme
from gradzip.stepping import (
    OnNonfinite,
    check_on_nonfinite,
    install_step_state,
    nonfinite_verdict,
    reduce_all_finite,
)

if TYPE_CHECKING:
    from torch.nn.parallel import DistributedDataParallel

#: [CHOICE] values per message of a bucket in a pipelined reduction (8 MB of float32), and the
#: largest piece a pipelining scheme cuts a parameter into: small enough that the wire starts
#: after one message's encoding and only the last message's decoding follows the last byte,
#: large enough that each message's fixed costs (the transport's round trips, a kernel launch)
#: are paid a few times per large bucket rather than per thousand values. Not tuned beyond
#: that: measure other sizes with ``benchmarks/hook_timeline.py``
CHUNK_ELEMENTS = 1 << 21

_ADVICE = (
    ". DDP will refuse the next forward pass of this wrapper: wrap the module again and "
    "register this hook state on it, or resume from a checkpoint"
)


def _where(job: BucketJob) -> str:
    return f", DDP bucket {job.position}"


def _on_bucket_stream(
    handle: Callable[[Any, Any], None],
) -> Callable[[Any, Any], None]:
    """``handle`` (a stage) run on the stream of the item's bucket
    (:mod:`gradzip.integrations._streams`: a no-op for CPU buckets)."""

    def staged(owner: Any, item: BucketJob | BucketPart) -> None:
        job = item if isinstance(item, BucketJob) else item.job
        with running_on(job.stream):
            handle(owner, item)

    return staged


def _match_threads(job: BucketJob) -> None:
    """Run at the main thread's intra-op thread count, so results cannot depend on it, and the
    numba kernels at the count that thread would give them (a stage thread's numba count is its
    own: see :func:`~gradzip.kernels._threads.kernel_thread_count`)."""
    if torch.get_num_threads() != job.threads:
        torch.set_num_threads(job.threads)
    if job.kernel_threads is not None:
        use_kernel_threads(job.kernel_threads)


class GradzipHookState:
    """The state of :func:`gradzip_hook`: the scheme, the transport, the step transaction
    (counter, skip count, restore point), the bucket layouts and the stages' threads.

    ``model`` is the DDP wrapper or the module it wraps (both list the same parameters in the
    same order); ``transport`` defaults to a
    :class:`~gradzip.comm.distributed.DistributedTransport` on the default process group, built
    on first use (see :attr:`transport`), so the state can be built before
    ``init_process_group``.

    [CHOICE] One backward pass is one step, and a step is all-or-nothing on every rank
    (:class:`~gradzip.integrations._transaction.StepTransaction`): the counter keys the
    payloads and advances after the last bucket; if any bucket fails, the scheme's state and
    the residuals return to where the step began, the counter stays and the last bucket's hook
    call raises the error (a gradzip ``NonFiniteInputError`` as it is, any other exception as a
    :class:`~gradzip.errors.GradzipError` naming the step and bucket). Whether a later bucket
    is still communicated depends only on what every rank knows at the transfer stage, so the
    ranks' collectives always pair up. DDP then needs a fresh wrapper; this state stays
    consistent.

    [CHOICE] Non-finite gradients: the ranks agree on each bucket's first message. A NaN or Inf
    on any rank raises :class:`~gradzip.errors.NonFiniteInputError` on every rank
    (``on_nonfinite="raise"``) or, with ``"skip"``, zero-fills the whole step on every rank and
    counts it in ``skipped_steps`` (``opt.step()`` still runs: compare ``skipped_steps`` to skip
    it too).

    The user guide's page "The DDP hook and GradientSync" gives the details and the errors a
    user sees.
    """

    def __init__(
        self,
        scheme: Scheme,
        model: torch.nn.Module,
        transport: Transport | None = None,
        on_nonfinite: OnNonfinite = "raise",
        chunk_elements: int = CHUNK_ELEMENTS,
        record_timeline: bool = False,
    ) -> None:
        if not isinstance(chunk_elements, int) or chunk_elements < 1:
            raise ValueError(f"chunk_elements must be a positive integer, got {chunk_elements!r}")
        if not isinstance(scheme, Scheme):
            raise TypeError(f"GradzipHookState needs a gradzip Scheme, got {type(scheme).__name__}")
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self.scheme = scheme
        self._transport = transport  # None: bound on first use (the ``transport`` property)
        self._binding = threading.Lock()
        self.on_nonfinite = check_on_nonfinite(on_nonfinite)
        self.chunk_elements = chunk_elements
        #: with ``record_timeline``, when each stage worked on each piece (for profiling)
        self.timeline: Timeline | None = Timeline() if record_timeline else None
        # the list keeps the parameters alive, so their ids stay theirs
        self._parameters = [p for p in model.parameters() if p.requires_grad]
        self._index = {id(p): i for i, p in enumerate(self._parameters)}
        self._shapes = [p.shape for p in self._parameters]
        self._layouts: dict[tuple[int, ...], BucketLayout] = {}
        self._checkpoint = HookCheckpoint(
            self._shapes, [p.dtype for p in self._parameters], chunk_elements
        )
        # the step in progress (stage threads only; the main thread once they are drained)
        self._step = StepTransaction(scheme)
        # [CHOICE] a scheme that pipelines (the allgather) runs through three threads (encode,
        # transfer, decode), so that encoding the next bucket and decoding the previous one
        # overlap the bytes on the wire; other schemes requantize between their messages and
        # run whole in the transfer stage
        self._pipelined = scheme.pipelines
        self._stages = StagePipeline(
            self,
            (
                _on_bucket_stream(GradzipHookState._encode_stage),
                _on_bucket_stream(GradzipHookState._transfer_stage),
                _on_bucket_stream(GradzipHookState._decode_stage),
            ),
            "gradzip-ddp-hook",
        )
        self._closed = False

    @property
    def step(self) -> int:
        """The step counter: it keys the payloads and advances after each completed step."""
        return self._step.step

    @step.setter
    def step(self, value: int) -> None:
        self._step.step = value

    @property
    def skipped_steps(self) -> int:
        """How many steps every rank agreed to skip (``on_nonfinite="skip"``)."""
        return self._step.skipped_steps

    @skipped_steps.setter
    def skipped_steps(self, value: int) -> None:
        self._step.skipped_steps = value

    @property
    def transport(self) -> Transport:
        """The transport the hook communicates over: the one given to the constructor, else a
        :class:`~gradzip.comm.distributed.DistributedTransport` on the default process group,
        built the first time it is needed (the first bucket, :meth:`state_dict` or
        :meth:`load_state_dict`).

        [CHOICE] Bound lazily so that a state can be built before the process group exists:
        Lightning's ``DDPStrategy(ddp_comm_state=...)`` takes the state when the strategy is
        built, before the strategy initialises ``torch.distributed``. Without a process group
        by then, this raises :class:`~gradzip.errors.GradzipError` (from the first bucket it is
        ``loss.backward()`` that raises it).
        """
        transport = self._transport
        if transport is None:
            # the first bucket reaches the transport from a stage thread: bind exactly once
            with self._binding:
                if self._transport is None:
                    self._transport = DistributedTransport()
                transport = self._transport
        return transport

    @property
    def run_seed(self) -> int:
        return self.scheme.run_seed

    # -- main thread: hand a bucket to the stages --------------------------------------------
    def reduce_bucket(self, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        """Queue one bucket for averaging in place (what :func:`gradzip_hook` calls); for the
        last bucket, wait for the step and raise its error."""
        if self._closed:
            raise GradzipError("this gradzip DDP hook state was closed")
        buffer = bucket.buffer()
        # a future holding device tensors must name their devices (torch.futures.Future)
        devices: list[int | str | torch.device] | None = (
            None if buffer.device.type == "cpu" else [buffer.device]
        )
        job = BucketJob(
            position=bucket.index(),
            last=bucket.is_last(),
            buffer=buffer,
            layout=None,
            future=torch.futures.Future(devices=devices),
            threads=torch.get_num_threads(),
            kernel_threads=kernel_thread_count(),
            stream=capture(buffer),
        )
        try:
            job.layout = self._layout_of(bucket, buffer)
        except GradzipError as err:
            job.error = err
        self._stages.submit(ENCODE, job)
        if job.last:
            job.done.wait()
            if job.failure is not None:
                raise job.failure
        return job.future

    def _layout_of(self, bucket: GradBucket, buffer: torch.Tensor) -> BucketLayout:
        params = tuple(self._index_of(p) for p in bucket.parameters())
        layout = self._layouts.get(params)
        if layout is None:
            layout = BucketLayout.of(params, self._shapes, self.chunk_elements, self._pieces_of)
            self._layouts[params] = layout
        if layout.numel != buffer.numel() or buffer.dim() != 1:
            raise GradzipError(
                f"bucket {bucket.index()} has a buffer of shape {tuple(buffer.shape)}, but its "
                f"parameters hold {layout.numel} values"
            )
        return layout

    def _pieces_of(self, shape: torch.Size) -> list[Piece]:
        return self.scheme.parameter_pieces(shape, self.chunk_elements)

    def _index_of(self, parameter: torch.Tensor) -> int:
        try:
            return self._index[id(parameter)]
        except KeyError:
            raise GradzipError(
                f"DDP handed the hook a parameter of shape {tuple(parameter.shape)} that is not "
                "among the model's parameters given to GradzipHookState (pass the model that "
                "DDP wraps)"
            ) from None

    # -- the stages (one thread each; every piece goes through all three in order) ------------
    def _encode_stage(self, job: BucketJob) -> None:
        """Stage 1: step bookkeeping; pipelined, this rank's payloads, one chunk of the bucket
        at a time, each handed to the transfer stage once encoded; else the bucket as one
        piece."""
        step = self._step
        try:
            _match_threads(job)
            if job.position == 0 or not step.open:
                self._begin_step()
            step.add(job)
            if job.error is not None:
                job.outcome = step.wrapped(job.error, job)
            elif self._pipelined and not step.halted:
                step.attempt(job, self._encode, job)
        except BaseException as err:  # bookkeeping itself failed: fail the bucket, stay alive
            job.outcome = job.outcome or err
        finally:
            if not job.sealed:  # the bucket as one piece, or what is left after a failure
                self._hand_on(BucketPart(job, None, 0, job.buffer.numel(), True, job.outcome))
            job.encoded.set()

    def _hand_on(self, piece: BucketPart) -> None:
        """Give ``piece`` to the transfer stage (the bucket's last piece seals the job)."""
        piece.job.sealed = piece.job.sealed or piece.last
        self._stages.submit(TRANSFER, piece)

    def _transfer_stage(self, piece: BucketPart) -> None:
        """Stage 2: the piece's communication; pipelined, the all-gather of its payloads and
        the agreement on their flags, else the scheme's whole reduction of the bucket.

        Whether a piece is communicated depends only on what every rank learns at this stage
        or before (the encode stage's verdict on the piece, the agreed flags, this stage's own
        failures), never on a later stage's progress, so the ranks' collectives always pair
        up."""
        job, step = piece.job, self._step
        try:
            _match_threads(job)
            failed = piece.error is not None
            if not failed and not step.halted and not step.skipping:
                with self._span("transfer", job, piece.chunk):
                    if piece.chunk is not None:
                        failed = not step.attempt(job, self._exchange, piece)
                    elif not self._pipelined:
                        failed = not step.attempt(job, self._reduce, job)
            if failed:
                step.halted = True  # no later piece of the step is communicated
        except BaseException as err:
            job.outcome, step.halted = job.outcome or err, True
        finally:
            self._stages.submit(DECODE, piece)

    def _decode_stage(self, piece: BucketPart) -> None:
        """Stage 3: pipelined, the decoding and averaging of the piece's payloads into its
        place in the bucket (no communication); after the step's last piece, the step's end."""
        job, step = piece.job, self._step
        ends_step = piece.last and job.last
        try:
            _match_threads(job)
            if piece.last:  # the encode stage may still be storing the bucket's residuals
                job.encoded.wait()
            if piece.payloads is not None and not step.skipping and step.error() is None:
                with self._span("decode", job, piece.chunk):
                    step.attempt(job, self._average, piece)
            if ends_step:
                step.finish()
        except BaseException as err:
            job.outcome = job.outcome or err
            if ends_step:
                step.finish()
        finally:
            if piece.last:
                job.done.set()

    def _span(self, stage: str, job: BucketJob, chunk: int | None) -> ContextManager[None]:
        """Record the stage's work on the piece in :attr:`timeline` (when it is kept)."""
        if self.timeline is None:
            return nullcontext()
        return self.timeline.span(self.step, stage, job.position, chunk)

    # pipelined: the scheme's three stages (Scheme.encode_flagged, gather_flagged, average),
    # message by message
    def _encode(self, job: BucketJob) -> None:
        """Encode the bucket message by message (each unit its own payload, with its
        parameter's key and error-feedback slot), handing each message on as soon as it is
        encoded."""
        assert job.layout is not None
        messages = job.layout.messages
        flat = job.buffer.detach()
        for number, units in enumerate(messages):
            with self._span("encode", job, number):
                outgoing, per_unit = self._encode_message(flat, units)
            last = number == len(messages) - 1
            piece = BucketPart(job, number, units[0].lo, units[-1].hi, last, units=units)
            piece.outgoing, piece.unit_outgoing = outgoing, per_unit
            piece.expected_size = self._message_bound(flat, units)
            self._hand_on(piece)

    def _encode_message(
        self, flat: torch.Tensor, units: tuple[Unit, ...]
    ) -> tuple[Outgoing, tuple[Outgoing, ...]]:
        """This rank's message: its units' payloads joined, with the flag down (and nothing
        sent) if any unit is refused as not finite."""
        rank, per_unit = self.transport.rank, []
        for unit in units:
            outgoing = self.scheme.encode_flagged(
                rank,
                flat.narrow(0, unit.lo, unit.numel).view(unit.shape),
                self.step,
                unit.param,
                chunk=unit.piece,
            )
            if not outgoing.finite:
                return Outgoing(b"", False, outgoing.dtype), ()
            per_unit.append(outgoing)
        # device payloads are joined on the device (:mod:`gradzip.integrations._messages`)
        message = joined([outgoing.payload for outgoing in per_unit], flat.device)
        return Outgoing(message, True, per_unit[0].dtype), tuple(per_unit)

    def _message_bound(self, flat: torch.Tensor, units: tuple[Unit, ...]) -> int | None:
        """The most bytes any rank's message of ``units`` holds, where each unit's device
        payload has a size its shape fixes (:meth:`~gradzip.schemes.base.Scheme.
        device_payload_bound`; a message is its payloads back to back); None otherwise. From
        shapes alone, so a rank whose flag is down computes the same bound as the others."""
        total = 0
        for unit in units:
            view = flat.narrow(0, unit.lo, unit.numel).view(unit.shape)
            bound = self.scheme.device_payload_bound(
                self.transport.world_size, view, self.step, unit.param, unit.piece
            )
            if bound is None:
                return None
            total += bound
        return total

    def _exchange(self, piece: BucketPart) -> None:
        assert piece.outgoing is not None
        payloads, down = self.scheme.gather_flagged(
            self.transport, piece.outgoing, self.step, piece.expected_size
        )
        if nonfinite_verdict(down, self.step, self.on_nonfinite, _where(piece.job), _ADVICE):
            piece.payloads = payloads
        else:
            self._step.skip()

    def _average(self, piece: BucketPart) -> None:
        """Each unit's mean, built in its place in the bucket where it fits (the working
        dtype; on the CPU, or on the bucket's device for device payloads), else copied there."""
        job = piece.job
        assert piece.payloads is not None
        numels = [unit.numel for unit in piece.units]
        messages = [split(message, numels) for message in piece.payloads]
        rank = self.transport.rank
        for k, (unit, mine) in enumerate(zip(piece.units, piece.unit_outgoing, strict=True)):
            place = job.buffer.narrow(0, unit.lo, unit.numel)
            # [CHOICE] the mean is built in the bucket itself where it fits: DDP then finds it
            # in the gradients (they are views of the bucket) instead of copying the whole
            # model's means after the last bucket, on the step's critical path. Device payloads
            # average on the bucket's device, so their mean goes into the bucket there too;
            # host payloads of a bucket off the CPU average on the CPU and are copied over
            on_host = not isinstance(messages[0][k], torch.Tensor)
            into = place if place.device.type == "cpu" or not on_host else None
            mean = self.scheme.average(
                # (device payloads too: the Scheme API widens to them on the device path)
                [message[k] for message in messages],
                self.step,
                unit.param,
                unit.shape,
                mine.dtype,
                mine.own_term(rank),
                into,
                chunk=unit.piece,
            )
            if mean.dtype != place.dtype or mean.data_ptr() != place.data_ptr():
                place.copy_(mean.reshape(-1))  # into the bucket: its device and dtype

    # not pipelined: the scheme's reduction in one piece
    def _reduce(self, job: BucketJob) -> None:
        """The bucket's mean once every rank agreed it is finite, the agreement riding on the
        reduction's first message (:func:`~gradzip.stepping.reduce_all_finite`).

        [CHOICE] Each parameter's gradient is reduced as its own tensor, in its own shape,
        under its model-order index (as :class:`~gradzip.sync.GradientSync` does), so nothing
        the scheme computes depends on the bucket. The cost: a scheme without a batched
        :meth:`~gradzip.schemes.base.Scheme.reduce_many_if_all_finite` (the ring, the
        parameter server, the nested scheme) runs its messages once per parameter, where a
        bucket-wide reduction ran them once per bucket; the integer-sum schemes batch their
        scale agreement (``allreduce`` its code ring too) without changing a bit."""
        assert job.layout is not None
        flat = job.buffer.detach()
        tensors = list(job.layout.parameter_views(flat, self._shapes))
        params = job.layout.params
        # [CHOICE] a scheme whose means depend on the grouping (PowerSGD's factors joined in
        # one payload, with a codec that scales) gets the parameters one at a time: two
        # messages per parameter instead of per bucket, the price of bucket-free results
        groups = (
            [(tensors, params)]
            if self.scheme.groups_exactly
            else [([t], (i,)) for t, i in zip(tensors, params, strict=True)]
        )
        means: list[torch.Tensor] = []
        # the device path: the whole bucket checked at once, one flag read (see _finite)
        finite = bucket_finite(flat) if device_path(flat) else None
        for group, indices in groups:
            got = self._reduce_group(job, group, indices, finite)
            if got is None:  # some rank's bucket is not finite and on_nonfinite="skip"
                self._step.skip()
                return
            means += got
        if len(means) == 1:
            self._deliver(job, means[0])
            return
        joined = adjacent_flat(means)
        if joined is not None and joined.numel() == flat.numel():
            # a batched scheme's means already lie end to end in the bucket's order (one
            # decode of the whole bucket): handed over whole, not copied back piece by piece
            self._deliver(job, joined)
            return
        # every input was read before the means exist: they go back into the bucket's buffer
        # (resident memory, not a fresh concatenation of the bucket), in its dtype and device
        for tensor, mean in zip(tensors, means, strict=True):
            tensor.copy_(mean.reshape(tensor.shape))  # a scheme may return the mean flat

    def _reduce_group(
        self,
        job: BucketJob,
        group: list[torch.Tensor],
        indices: tuple[int, ...],
        finite: bool | None,
    ) -> list[torch.Tensor] | None:
        """The scheme's means of ``group`` once every rank agreed it is finite (None: skip the
        step). ``finite``: this rank's flag, already known for the whole bucket on the device
        path; None on the host path, where :func:`~gradzip.stepping.reduce_all_finite` scans."""
        if finite is None:
            return reduce_all_finite(
                self.transport,
                self.scheme,
                group,
                indices,
                self.step,
                self.on_nonfinite,
                _where(job),
                _ADVICE,
            )
        means, down = self.scheme.reduce_many_if_all_finite(
            self.transport, group, indices, self.step, finite
        )
        if down:
            nonfinite_verdict(down, self.step, self.on_nonfinite, _where(job), _ADVICE)
            return None
        return means

    def _deliver(self, job: BucketJob, mean: torch.Tensor) -> None:
        if (mean.dtype, mean.device) == (job.buffer.dtype, job.buffer.device):
            # [CHOICE] the future hands DDP the mean itself: DDP copies a hook's result into the
            # parameters' gradients anyway, so copying it into the bucket first is a second pass
            job.result = mean.reshape(job.buffer.shape)
        else:
            job.buffer.copy_(mean.reshape(job.buffer.shape))  # into the bucket: its device, dtype

    # -- step bookkeeping (encode stage at a step's start) ------------------------------------
    def _begin_step(self) -> None:
        if self._step.open:  # a backward pass abandoned half way applies nothing
            self._stages.drain(after=ENCODE)  # its buckets leave the later stages first
            self._step.abandon()
        self._step.begin()

    # -- main thread: idle-time operations ------------------------------------------------------
    def _settle(self) -> None:
        """Wait for the stages, then roll back a step left without its last bucket."""
        self._stages.drain()
        if self._step.open:
            self._step.abandon()

    def close(self) -> None:
        """Finish the queued buckets, then stop and join the stages' threads (idempotent). A
        closed state refuses further buckets; its checkpoint stays readable."""
        self._settle()
        self._closed = True
        self._stages.close()

    def state_dict(self) -> dict[str, Any]:
        """The step counter, the skip count, the run seed, rank and group size, the scheme's
        buffers (error-feedback residuals per parameter and piece, PowerSGD's warm starts) and
        the parameters' shapes and ``chunk_elements`` (``torch.save``-able); with the model's
        and the optimizer's state it resumes a run bit-exactly, whatever the resumed run's
        buckets."""
        self._settle()
        return self._checkpoint.save(
            self._step.step, self._step.skipped_steps, self.transport, self.scheme
        )

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict` (on every rank, with that rank's own state, before the
        first backward pass of the resumed run); the run seed, rank, group size, the parameters'
        shapes and (for a scheme that pipelines, whose pieces depend on it) ``chunk_elements``
        must match.

        Everything is validated before anything changes: a refused state raises
        :class:`~gradzip.errors.CheckpointError` and leaves the counters and residuals as they
        were.
        """
        self._settle()
        parsed = self._checkpoint.parse(state, self.transport, self.scheme)
        self._step.step, self._step.skipped_steps = install_step_state(parsed, self.scheme)


def gradzip_hook(state: GradzipHookState, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The communication hook: ``ddp_model.register_comm_hook(state, gradzip_hook)``.

    Queues the bucket on ``state``'s worker thread, which replaces the bucket's buffer by its
    rank-average through ``state.scheme`` (see :class:`GradzipHookState`), and returns the future
    of that buffer, completed when the step's last bucket is done.
    """
    return state.reduce_bucket(bucket)


def register_gradzip_hook(
    ddp_model: "DistributedDataParallel",
    scheme: Scheme,
    transport: Transport | None = None,
    on_nonfinite: OnNonfinite = "raise",
    chunk_elements: int = CHUNK_ELEMENTS,
    record_timeline: bool = False,
) -> GradzipHookState:
    """Build a :class:`GradzipHookState` for ``ddp_model`` and register :func:`gradzip_hook`
    on it (DDP allows one hook per model, registered before the first backward pass)."""
    state = GradzipHookState(
        scheme,
        ddp_model,
        transport=transport,
        on_nonfinite=on_nonfinite,
        chunk_elements=chunk_elements,
        record_timeline=record_timeline,
    )
    ddp_model.register_comm_hook(state, gradzip_hook)
    return state


__all__ = ["GradzipHookState", "gradzip_hook", "register_gradzip_hook"]
