"""Gradient synchronisation: compress, exchange and average a model's gradients each step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from gradzip.comm.transport import Transport
from gradzip.compressors.base import Compressor
from gradzip.schemes import AllGatherDecode
from gradzip.schemes.base import Scheme
from gradzip.stepping import (
    OnNonfinite,
    StepState,
    check_on_nonfinite,
    install_step_state,
    parse_step_state,
    reduce_all_finite,
    step_state,
)

_STATE_VERSION = 2


class GradientSync:
    """One communication round per :meth:`synchronize` call, over any transport and scheme.

    Each rank hands its gradient tensors to an aggregation scheme (default
    :class:`~gradzip.schemes.AllGatherDecode`; any :class:`~gradzip.schemes.base.Scheme`), which
    compresses them with the key ``(run_seed, rank, step, tensor index)``, exchanges the
    payloads and returns the same average on every rank. The step counter, the run seed and the
    scheme's buffers (error-feedback residuals) are the whole state (:meth:`state_dict`), so a
    run resumes bit-exactly.

    A step is all-or-nothing on every rank: the ranks agree that every gradient is finite, on
    the first tensor's first message (:func:`~gradzip.stepping.reduce_all_finite`: a flag bit in
    its header for the allgather scheme, one byte per rank on a message of its own for the
    others). A NaN or Inf on any rank raises
    :class:`~gradzip.errors.NonFiniteInputError` on all of them (``on_nonfinite="raise"``, the
    default), or, with ``on_nonfinite="skip"``, every rank returns ``None`` for that step and
    counts it in ``skipped_steps`` (the step counter does not advance: nothing was sent). Any
    other failure (a payload of another step, a peer that is gone) restores the scheme's state
    and leaves the step counter unchanged.

    Pass either ``compressor`` (with ``run_seed``) for the default scheme, an all-gather
    without error feedback, or a ready ``scheme``: error feedback is the scheme's setting
    (``AllGatherDecode(compressor, run_seed=..., error_feedback=True)``).
    """

    def __init__(
        self,
        transport: Transport,
        compressor: Compressor | None = None,
        *,
        scheme: Scheme | None = None,
        run_seed: int = 0,
        on_nonfinite: OnNonfinite = "raise",
    ) -> None:
        if (compressor is None) == (scheme is None):
            raise ValueError("give GradientSync either a compressor or a scheme (not both)")
        if scheme is not None and run_seed:
            raise ValueError("run_seed is the scheme's setting: pass it to the scheme")
        if scheme is None:
            assert compressor is not None
            scheme = AllGatherDecode(compressor, run_seed=run_seed)
        self.transport = transport
        self.scheme = scheme
        self.on_nonfinite = check_on_nonfinite(on_nonfinite)
        self.step = 0
        self.skipped_steps = 0

    @property
    def run_seed(self) -> int:
        return self.scheme.run_seed

    def synchronize(self, gradients: Sequence[torch.Tensor]) -> list[torch.Tensor] | None:
        """The rank-average of each gradient (same order, shapes and dtypes; on the CPU, or on
        the gradients' device where the compressor is device resident and the scheme averages
        there, see :mod:`gradzip.device`), or ``None`` when ``on_nonfinite="skip"`` and some
        rank's gradients are not finite."""
        saved = self.scheme.snapshot()
        try:
            means = reduce_all_finite(
                self.transport,
                self.scheme,
                gradients,
                range(len(gradients)),
                self.step,
                self.on_nonfinite,
                "",
            )
        except BaseException:
            self.scheme.restore(saved)
            raise
        if means is None:
            self.scheme.restore(saved)
            self.skipped_steps += 1
            return None
        self.step += 1
        return [m.to(g.dtype) for m, g in zip(means, gradients, strict=True)]

    def state_dict(self) -> dict[str, Any]:
        """The step counter, the run seed and the scheme's buffers (``torch.save``-able)."""
        return step_state(
            _STATE_VERSION, self.step, self.skipped_steps, self.transport, self.scheme
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`; the run seed, rank and group size must match.

        Everything is validated before anything changes: a refused state raises
        :class:`~gradzip.errors.CheckpointError` and leaves the counters and buffers as they were.
        """
        self.install_state(self.parse_state(state))

    def parse_state(self, state: dict[str, Any]) -> StepState:
        """Validate a :meth:`state_dict` without changing anything (see :meth:`install_state`)."""
        return parse_step_state(state, _STATE_VERSION, "sync state", self.transport, self.scheme)

    def install_state(self, parsed: StepState) -> None:
        """Install a state :meth:`parse_state` accepted (cannot fail)."""
        self.step, self.skipped_steps = install_step_state(parsed, self.scheme)
