"""The hook's step transaction: one backward pass is one all-or-nothing step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gradzip.errors import GradzipError, NonFiniteInputError
from gradzip.feedback import Slot
from gradzip.integrations._job import BucketJob
from gradzip.schemes.base import Scheme


class StepTransaction:
    """The step counter, the skip count and the step in progress: the scheme's restore point
    (taken when the step begins), its buckets, whether every rank agreed to skip it, and its
    error.

    [CHOICE] A step is all-or-nothing on every rank: :meth:`finish` commits it (the counter
    advances and every bucket's future gets its mean) only when no bucket failed; otherwise the
    scheme's state returns to the restore point, the counter stays and every future gets the
    step's error. A skipped step also restores the state, and its futures get zeros.

    [CHOICE] The restore point holds the residual tensors themselves, wherever they live (on
    the gradient's device on the device path), not copies: error feedback replaces a residual
    with a new tensor instead of writing into it, so the old one is intact for a rollback, and
    a step costs no clone of every residual (on a GPU, a device-to-device copy of the model's
    size per step). A scheme that wrote residuals in place would have to clone them on their
    device in :meth:`~gradzip.schemes.base.Scheme.snapshot`.
    """

    def __init__(self, scheme: Scheme) -> None:
        self.scheme = scheme
        self.step = 0
        self.skipped_steps = 0
        #: the transfer stage's verdict: this step's later buckets are not communicated
        self.halted = False
        #: every rank agreed to skip the step (a rank's gradients are not finite, ``"skip"``)
        self.skipping = False
        self._saved: dict[str, dict[Slot, torch.Tensor]] | None = None
        self._failure: BaseException | None = None
        self._jobs: list[BucketJob] = []

    @property
    def open(self) -> bool:
        """Whether a step has begun and not finished."""
        return self._saved is not None

    def begin(self) -> None:
        """Start a step: take the scheme's restore point."""
        self._saved = self.scheme.snapshot()

    def add(self, job: BucketJob) -> None:
        """A bucket of the step in progress (its future completes when the step finishes)."""
        self._jobs.append(job)

    def skip(self) -> None:
        """Every rank agreed to skip the step."""
        self.skipping = True
        self.skipped_steps += 1

    def abandon(self) -> None:
        """Roll back a step left without its last bucket (a backward pass abandoned half way
        applies nothing)."""
        self._failure = GradzipError(f"step {self.step} was abandoned before its last bucket")
        self.finish()

    def error(self) -> BaseException | None:
        """The step's error: its own (an abandoned step), else its first failed bucket's."""
        if self._failure is not None:
            return self._failure
        return next((job.outcome for job in self._jobs if job.outcome is not None), None)

    def finish(self) -> None:
        """Complete every future of the step: with the step's error (state restored), with
        zeros (skipped, state restored), or with the averaged buffers (the counter advances)."""
        failure, jobs = self.error(), self._jobs
        if (failure is not None or self.skipping) and self._saved is not None:
            self.scheme.restore(self._saved)
        if failure is None and self.skipping:
            for job in jobs:
                job.buffer.zero_()
        elif failure is None:
            self.step += 1
        for job in jobs:
            job.failure = failure
            if failure is None:
                job.future.set_result(job.buffer if self.skipping else job.result)
            else:
                error = failure if isinstance(failure, Exception) else GradzipError(repr(failure))
                job.future.set_exception(error)  # type: ignore[arg-type]  # torch annotates T
        self._saved, self.skipping, self._failure, self._jobs = None, False, None, []
        self.halted = False

    def wrapped(self, err: BaseException, job: BucketJob) -> GradzipError:
        """``err`` as the error of ``job``'s bucket in this step."""
        failure = GradzipError(
            f"gradzip DDP hook: step {self.step}, bucket {job.position} failed "
            f"({type(err).__name__}: {err}); this rank's scheme state was restored and its "
            f"step counter stays at {self.step}"
        )
        failure.__cause__ = err
        return failure

    def attempt(self, job: BucketJob, work: Callable[[Any], Any], item: Any) -> bool:
        """``work(item)``; whether it succeeded. A failure becomes the bucket's outcome unless
        it has one already (a gradzip ``NonFiniteInputError`` as it is, any other exception
        wrapped with the step and the bucket)."""
        try:
            work(item)
            return True
        except NonFiniteInputError as err:
            failure: BaseException = err
        except Exception as err:
            failure = self.wrapped(err, job)
        except BaseException as err:
            failure = err
        job.outcome = job.outcome or failure
        return False
