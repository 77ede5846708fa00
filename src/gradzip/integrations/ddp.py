"""A ``DistributedDataParallel`` communication hook that averages gradients through gradzip.

Any gradzip scheme (and so any compressor it accepts) replaces DDP's all-reduce::

    import gradzip
    from gradzip.integrations.ddp import register_gradzip_hook
    from gradzip.schemes import AllGatherDecode

    ddp_model = DistributedDataParallel(model)
    scheme = AllGatherDecode(gradzip.create("dqsg", M=2), run_seed=7, error_feedback=True)
    state = register_gradzip_hook(ddp_model, scheme)
    for x, y in data:
        opt.zero_grad()
        loss_fn(ddp_model(x), y).backward()  # the hook runs here, once per bucket
        opt.step()
    state.close()  # stops the stages' threads (garbage collection and interpreter exit do too)

DDP calls ``hook(state, bucket)`` as each flat bucket of gradients becomes ready; the hook
returns a future of the bucket's *average* (DDP then neither communicates nor divides). Each
bucket travels as one tensor keyed by the smallest model-order index of its parameters (a
:attr:`~gradzip.schemes.base.Scheme.needs_shapes` scheme, PowerSGD, gets each parameter in its
own shape instead), with the finite-gradient agreement on its first message.

[CHOICE] Overlap: the hook only queues the bucket; three threads (encode, transfer, decode)
reduce it while backward goes on. With the allgather scheme they pipeline chunks of at most
``chunk_elements`` values, so the codec's time hides behind the wire; other schemes requantize
between messages and run whole in the transfer stage. The last bucket's call waits for the step
and raises its error, so it reaches the caller of ``loss.backward()``.

[CHOICE] Residuals are kept per parameter (:mod:`gradzip.integrations._residuals`), so they
survive DDP's bucket rebuild and a resume with another ``bucket_cap_mb``; a checkpoint
(:meth:`GradzipHookState.state_dict`) resumes bit-exactly.

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
from gradzip.errors import CheckpointError, GradzipError, NonFiniteInputError
from gradzip.feedback import Slot
from gradzip.integrations._job import BucketJob, BucketPart
from gradzip.integrations._layout import BucketLayout
from gradzip.integrations._residuals import Entries, ResidualStore
from gradzip.integrations._timeline import Timeline
from gradzip.integrations._worker import BucketWorker
from gradzip.schemes._ring_ints import slice_bounds
from gradzip.schemes.allgather_decode import AllGatherDecode
from gradzip.schemes.base import Scheme
from gradzip.stepping import (
    check_on_nonfinite,
    flag_rides_on_payload,
    install_step_state,
    nonfinite_verdict,
    parse_step_state,
    reduce_all_finite,
    step_state,
)

if TYPE_CHECKING:
    from torch.nn.parallel import DistributedDataParallel

#: [CHOICE] values per chunk of a bucket in the pipelined all-gather (8 MB of float32): small
#: enough that the wire starts after one chunk's encoding and only the last chunk's decoding
#: follows the last byte (a few ms each on one core of the development machine), large enough
#: that each chunk's fixed costs (a payload header, the transport's round trips, a kernel
#: launch) are paid a few times per 16M-value bucket rather than per thousand values. Not
#: tuned beyond that: measure other sizes with ``benchmarks/hook_timeline.py``
CHUNK_ELEMENTS = 1 << 21

_STATE_VERSION = 2  # 2: per-parameter residuals beside the scheme's (empty) buffers
_ADVICE = (
    ". DDP will refuse the next forward pass of this wrapper: wrap the module again and "
    "register this hook state on it, or resume from a checkpoint"
)


def _where(job: BucketJob) -> str:
    return f", DDP bucket {job.position}"


def _match_threads(job: BucketJob) -> None:
    """Run at the main thread's intra-op thread count, so results cannot depend on it."""
    if torch.get_num_threads() != job.threads:
        torch.set_num_threads(job.threads)


class GradzipHookState:
    """The state of :func:`gradzip_hook`: the scheme, the transport, the step counter, the
    per-parameter residuals and the worker threads.

    ``model`` is the DDP wrapper or the module it wraps (both list the same parameters in the
    same order); ``transport`` defaults to a
    :class:`~gradzip.comm.distributed.DistributedTransport` on the default process group, built
    on first use (see :attr:`transport`), so the state can be built before
    ``init_process_group``.

    [CHOICE] One backward pass is one step, and a step is all-or-nothing on every rank: the
    counter keys the payloads and advances after the last bucket; if any bucket fails, the
    scheme's state and the residuals return to where the step began, the counter stays and the
    last bucket's hook call raises the error (a gradzip ``NonFiniteInputError`` as it is, any
    other exception as a :class:`~gradzip.errors.GradzipError` naming the step and bucket).
    Whether a later bucket is still communicated depends only on what every rank knows at the
    transfer stage, so the ranks' collectives always pair up. DDP then needs a fresh wrapper;
    this state stays consistent.

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
        on_nonfinite: str = "raise",
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
        self.step = 0
        self.skipped_steps = 0
        # the list keeps the parameters alive, so their ids stay theirs
        self._parameters = [p for p in model.parameters() if p.requires_grad]
        self._index = {id(p): i for i, p in enumerate(self._parameters)}
        self._numels = [p.numel() for p in self._parameters]
        self._shapes = [p.shape for p in self._parameters]
        self._residuals = ResidualStore(
            tuple(scheme.feedback), self._numels, [p.dtype for p in self._parameters]
        )
        self._layouts: dict[tuple[int, ...], BucketLayout] = {}
        # the step in progress (worker thread only): its restore point (None between steps),
        # whether it is skipped, its error, and its jobs (their futures complete at its end)
        self._saved: tuple[dict[str, dict[Slot, torch.Tensor]], Entries] | None = None
        self._skipping = False
        self._failure: BaseException | None = None
        self._jobs: list[BucketJob] = []
        # [CHOICE] the allgather scheme runs as a pipeline of three threads (encode, transfer,
        # decode), so that encoding the next bucket and decoding the previous one overlap the
        # bytes on the wire; other schemes requantize between their messages and run whole in
        # the transfer stage
        self._pipelined = flag_rides_on_payload(scheme)
        self._halted = False  # transfer stage: this step's later buckets are not communicated
        self._stages: tuple[BucketWorker, ...] | None = None
        self._closed = False

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
        )
        try:
            job.layout = self._layout_of(bucket, buffer)
        except GradzipError as err:
            job.error = err
        if self._stages is None:
            self._stages = tuple(
                BucketWorker(self, handle, f"gradzip-ddp-hook-{name}")
                for name, handle in (
                    ("encode", GradzipHookState._encode_stage),
                    ("transfer", GradzipHookState._transfer_stage),
                    ("decode", GradzipHookState._decode_stage),
                )
            )
        self._stages[0].submit(job)
        if job.last:
            job.done.wait()
            if job.failure is not None:
                raise job.failure
        return job.future

    def _layout_of(self, bucket: GradBucket, buffer: torch.Tensor) -> BucketLayout:
        params = tuple(self._index_of(p) for p in bucket.parameters())
        layout = self._layouts.get(params)
        if layout is None:
            layout = self._layouts[params] = BucketLayout.of(params, self._numels)
        if layout.numel != buffer.numel() or buffer.dim() != 1:
            raise GradzipError(
                f"bucket {bucket.index()} has a buffer of shape {tuple(buffer.shape)}, but its "
                f"parameters hold {layout.numel} values"
            )
        return layout

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
        try:
            _match_threads(job)
            if job.position == 0 or self._saved is None:
                self._begin_step()
            self._jobs.append(job)
            if job.error is not None:
                job.outcome = self._wrapped(job.error, job)
            elif self._pipelined and not self._halted:
                self._attempt(job, self._encode, job)
        except BaseException as err:  # bookkeeping itself failed: fail the bucket, stay alive
            job.outcome = job.outcome or err
        finally:
            if not job.sealed:  # the bucket as one piece, or what is left after a failure
                self._hand_on(BucketPart(job, None, 0, job.buffer.numel(), True, job.outcome))
            job.encoded.set()

    def _hand_on(self, piece: BucketPart) -> None:
        """Give ``piece`` to the transfer stage (the bucket's last piece seals the job)."""
        assert self._stages is not None
        piece.job.sealed = piece.job.sealed or piece.last
        self._stages[1].submit(piece)

    def _transfer_stage(self, piece: BucketPart) -> None:
        """Stage 2: the piece's communication; pipelined, the all-gather of its payloads and
        the agreement on their flags, else the scheme's whole reduction of the bucket.

        Whether a piece is communicated depends only on what every rank learns at this stage
        or before (the encode stage's verdict on the piece, the agreed flags, this stage's own
        failures), never on a later stage's progress, so the ranks' collectives always pair
        up."""
        job = piece.job
        try:
            _match_threads(job)
            failed = piece.error is not None
            if not failed and not self._halted and not self._skipping:
                with self._span("transfer", job, piece.chunk):
                    if piece.chunk is not None:
                        failed = not self._attempt(job, self._exchange, piece)
                    elif not self._pipelined:
                        failed = not self._attempt(job, self._reduce, job)
            if failed:
                self._halted = True  # no later piece of the step is communicated
        except BaseException as err:
            job.outcome, self._halted = job.outcome or err, True
        finally:
            assert self._stages is not None
            self._stages[2].submit(piece)

    def _decode_stage(self, piece: BucketPart) -> None:
        """Stage 3: pipelined, the decoding and averaging of the piece's payloads into its
        place in the bucket (no communication); after the step's last piece, the step's end."""
        job = piece.job
        ends_step = piece.last and job.last
        try:
            _match_threads(job)
            if piece.last:  # the encode stage may still be storing the bucket's residuals
                job.encoded.wait()
            if piece.payloads is not None and not self._skipping and self._step_error() is None:
                with self._span("decode", job, piece.chunk):
                    self._attempt(job, self._average, piece)
            if ends_step:
                self._finish_step()
        except BaseException as err:
            job.outcome = job.outcome or err
            if ends_step:
                self._finish_step()
        finally:
            if piece.last:
                job.done.set()

    def _span(self, stage: str, job: BucketJob, chunk: int | None) -> ContextManager[None]:
        """Record the stage's work on the piece in :attr:`timeline` (when it is kept)."""
        if self.timeline is None:
            return nullcontext()
        return self.timeline.span(self.step, stage, job.position, chunk)

    def _attempt(self, job: BucketJob, work: Callable[[Any], Any], item: Any) -> bool:
        """``work(item)``; whether it succeeded. A failure becomes the bucket's outcome unless
        it has one already (a gradzip ``NonFiniteInputError`` as it is, any other exception
        wrapped with the step and the bucket)."""
        try:
            work(item)
            return True
        except NonFiniteInputError as err:
            failure: BaseException = err
        except Exception as err:
            failure = self._wrapped(err, job)
        except BaseException as err:
            failure = err
        job.outcome = job.outcome or failure
        return False

    def _wrapped(self, err: BaseException, job: BucketJob) -> GradzipError:
        failure = GradzipError(
            f"gradzip DDP hook: step {self.step}, bucket {job.position} failed "
            f"({type(err).__name__}: {err}); this rank's scheme state was restored and its "
            f"step counter stays at {self.step}"
        )
        failure.__cause__ = err
        return failure

    # pipelined: the three phases of AllGatherDecode, chunk by chunk
    def _chunks(self, numel: int) -> list[tuple[int, int]]:
        """The bucket's pieces: ``ceil(numel / chunk_elements)`` ranges of (nearly) equal size."""
        return slice_bounds(numel, max(1, -(-numel // self.chunk_elements)))

    def _encode(self, job: BucketJob) -> None:
        """Encode the bucket chunk by chunk (each chunk its own payload, key ``chunk`` and
        error-feedback slot), handing each chunk on as soon as it is encoded. The residuals are
        stored while the last chunk travels (the decode stage ends the bucket only once
        ``job.encoded`` is set): storing them copies every parameter that several chunks share,
        which delayed the last chunk by 10-70 ms when it came first."""
        assert job.layout is not None and isinstance(self.scheme, AllGatherDecode)
        scheme, rank = self.scheme, self.transport.rank
        bounds = self._chunks(job.buffer.numel())
        slots = [(chunk, lo, hi) for chunk, (lo, hi) in enumerate(bounds)]

        def encode_chunks(flat: torch.Tensor, index: int) -> bool:
            """Hand on every chunk as soon as it is encoded."""
            for chunk, lo, hi in slots:
                with self._span("encode", job, chunk):
                    outgoing = scheme.encode_flagged(
                        rank, flat[lo:hi], self.step, index, chunk=chunk
                    )
                last = chunk == len(slots) - 1
                self._hand_on(BucketPart(job, chunk, lo, hi, last, outgoing=outgoing))
            return True

        self._residuals.reduce(
            scheme,
            self.transport,
            job.buffer.detach(),
            job.layout,
            encode_chunks,
            {role: slots for role in scheme.feedback},
        )

    def _exchange(self, piece: BucketPart) -> None:
        assert piece.outgoing is not None and isinstance(self.scheme, AllGatherDecode)
        payloads, down = self.scheme.gather_flagged(self.transport, piece.outgoing, self.step)
        if nonfinite_verdict(down, self.step, self.on_nonfinite, _where(piece.job), _ADVICE):
            piece.payloads = payloads
        else:
            self._skip()

    def _average(self, piece: BucketPart) -> None:
        """The piece's mean, built in its place in the bucket where it fits (CPU, the working
        dtype), else copied there."""
        job, outgoing = piece.job, piece.outgoing
        assert piece.payloads is not None and outgoing is not None and job.layout is not None
        assert isinstance(self.scheme, AllGatherDecode) and piece.chunk is not None
        place = job.buffer[piece.lo : piece.hi]
        # [CHOICE] the mean is built in the bucket itself where it fits: DDP then finds it in
        # the gradients (they are views of the bucket) instead of copying the whole model's
        # means after the last bucket, on the step's critical path
        into = place if place.device.type == "cpu" else None
        mean = self.scheme.average(
            piece.payloads,
            self.step,
            job.layout.tensor_index,
            place.shape,
            outgoing.dtype,
            outgoing.own_term(self.transport.rank),
            into,
            chunk=piece.chunk,
        )
        if mean.dtype != place.dtype or mean.data_ptr() != place.data_ptr():
            place.copy_(mean)  # into the bucket: its device and dtype

    # not pipelined: the scheme's reduction in one piece
    def _reduce(self, job: BucketJob) -> None:
        assert job.layout is not None
        mean = self._residuals.reduce(
            self.scheme,
            self.transport,
            job.buffer.detach(),
            job.layout,
            lambda flat, _: self._reduce_flat(flat, job.layout, job.position),
        )
        if mean is None:  # some rank's bucket is not finite and on_nonfinite="skip"
            self._skip()
        else:
            self._deliver(job, mean)

    def _reduce_flat(
        self, flat: torch.Tensor, layout: BucketLayout | None, position: int
    ) -> torch.Tensor | None:
        """The bucket's mean once every rank agreed it is finite, the agreement riding on the
        reduction's first message (:func:`~gradzip.stepping.reduce_all_finite`).

        [CHOICE] The bucket is one tensor (key ``tensor_index`` = its smallest parameter
        index), except for a scheme that :attr:`~gradzip.schemes.base.Scheme.needs_shapes`
        (PowerSGD), which gets each parameter's gradient in its own shape under the
        parameter's model-order index: its warm starts and residuals then belong to the
        parameters and survive DDP's bucket rebuild."""
        assert layout is not None
        if self.scheme.needs_shapes:
            tensors = [
                flat[a:b].view(self._shapes[index])
                for index, a, b, _, _ in layout.overlaps(0, layout.numel)
            ]
            indices: tuple[int, ...] = layout.params
        else:
            tensors, indices = [flat], (layout.tensor_index,)
        means = reduce_all_finite(
            self.transport,
            self.scheme,
            tensors,
            indices,
            self.step,
            self.on_nonfinite,
            f", DDP bucket {position}",
            _ADVICE,
        )
        if means is None:
            return None
        if not self.scheme.needs_shapes:
            return means[0]
        # every input was read before the means exist: they go back into the bucket's buffer
        # (resident memory, not a fresh concatenation of up to 100 MB), in its dtype and device
        for tensor, mean in zip(tensors, means, strict=True):
            tensor.copy_(mean)
        return flat

    def _deliver(self, job: BucketJob, mean: torch.Tensor) -> None:
        if (mean.dtype, mean.device) == (job.buffer.dtype, job.buffer.device):
            # [CHOICE] the future hands DDP the mean itself: DDP copies a hook's result into the
            # parameters' gradients anyway, so copying it into the bucket first is a second pass
            job.result = mean.reshape(job.buffer.shape)
        else:
            job.buffer.copy_(mean)  # into the bucket's buffer: its device and dtype

    def _skip(self) -> None:
        """Every rank agreed to skip the step (a rank's bucket is not finite, ``"skip"``)."""
        self._skipping = True
        self.skipped_steps += 1

    # -- step bookkeeping (encode stage at a step's start, decode stage at its end) -------------
    def _begin_step(self) -> None:
        if self._saved is not None:  # a backward pass abandoned half way applies nothing
            assert self._stages is not None
            for stage in self._stages[1:]:  # its buckets leave the later stages first
                stage.drain()
            self._failure = GradzipError(f"step {self.step} was abandoned before its last bucket")
            self._finish_step()
        self._saved = (self.scheme.snapshot(), self._residuals.snapshot())

    def _restore(self) -> None:
        if self._saved is not None:
            self.scheme.restore(self._saved[0])
            self._residuals.restore(self._saved[1])

    def _step_error(self) -> BaseException | None:
        """The step's error: its own (an abandoned step), else its first failed bucket's."""
        if self._failure is not None:
            return self._failure
        return next((job.outcome for job in self._jobs if job.outcome is not None), None)

    def _finish_step(self) -> None:
        """Complete every future of the step: with the step's error (state restored), with
        zeros (skipped, state restored), or with the averaged buffers (the counter advances)."""
        failure, jobs = self._step_error(), self._jobs
        if failure is not None or self._skipping:
            self._restore()
        if failure is None and self._skipping:
            for job in jobs:
                job.buffer.zero_()
        elif failure is None:
            self.step += 1
        for job in jobs:
            job.failure = failure
            if failure is None:
                job.future.set_result(job.buffer if self._skipping else job.result)
            else:
                error = failure if isinstance(failure, Exception) else GradzipError(repr(failure))
                job.future.set_exception(error)  # type: ignore[arg-type]  # torch annotates T
        self._saved, self._skipping, self._failure, self._jobs = None, False, None, []
        self._halted = False

    # -- main thread: idle-time operations ------------------------------------------------------
    def _settle(self) -> None:
        """Wait for the stages, then roll back a step left without its last bucket."""
        for stage in self._stages or ():
            stage.drain()
        if self._saved is not None:
            self._failure = GradzipError(f"step {self.step} was abandoned before its last bucket")
            self._finish_step()

    def close(self) -> None:
        """Finish the queued buckets, then stop and join the stages' threads (idempotent). A
        closed state refuses further buckets; its checkpoint stays readable."""
        self._settle()
        self._closed = True
        for stage in self._stages or ():
            stage.close()

    def state_dict(self) -> dict[str, Any]:
        """The step counter, the skip count, the run seed, rank and group size, and the
        per-parameter residuals (``torch.save``-able); with the model's and the optimizer's
        state it resumes a run bit-exactly, whatever the resumed run's buckets."""
        self._settle()
        state = step_state(
            _STATE_VERSION, self.step, self.skipped_steps, self.transport, self.scheme
        )
        state["residuals"] = self._residuals.state_dict()
        state["numels"] = list(self._numels)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict` (on every rank, with that rank's own state, before the
        first backward pass of the resumed run); the run seed, rank, group size and the
        parameters' sizes must match.

        Everything is validated before anything changes: a refused state raises
        :class:`~gradzip.errors.CheckpointError` and leaves the counters and residuals as they
        were.
        """
        self._settle()
        parsed = parse_step_state(
            state, _STATE_VERSION, "DDP hook state", self.transport, self.scheme
        )
        if self.scheme.feedback and any(parsed.buffers.values()):
            raise CheckpointError(
                "DDP hook state holds residuals in its scheme part; the hook keeps them per "
                "parameter under 'residuals' (a GradientSync checkpoint does not fit the hook)"
            )
        if state.get("numels") != self._numels:
            raise CheckpointError(
                f"DDP hook state was saved for parameters of sizes {state.get('numels')}, this "
                f"model's parameters that require grad have sizes {self._numels}"
            )
        residuals = self._residuals.parse_state(state.get("residuals"))
        self.step, self.skipped_steps = install_step_state(parsed, self.scheme)
        self._residuals.restore(residuals)


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
    on_nonfinite: str = "raise",
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
