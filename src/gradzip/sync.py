"""Gradient synchronisation: compress, exchange and average a model's gradients each step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from gradzip.comm.transport import Transport
from gradzip.compressors.base import Compressor
from gradzip.errors import GradzipError, NonFiniteInputError
from gradzip.feedback import ErrorFeedback
from gradzip.schemes import AllGatherDecode

_STATE_VERSION = 1


class GradientSync:
    """One communication round per :meth:`synchronize` call, over any transport.

    Each rank encodes each gradient tensor (through :class:`~gradzip.feedback.ErrorFeedback` if
    ``error_feedback``) with the key ``(run_seed, rank, step, tensor index)``, the payloads are
    exchanged with the all-gather-decode scheme (:class:`~gradzip.schemes.AllGatherDecode`), and
    every rank gets the same average. The step counter, the run seed and the error-feedback
    residuals are the whole state (:meth:`state_dict`), so a run resumes bit-exactly.

    A step is all-or-nothing on every rank: the ranks first agree that every gradient is finite
    (one byte per rank), so a NaN or Inf on any rank raises
    :class:`~gradzip.errors.NonFiniteInputError` on all of them; any other failure (a payload of
    another step, a peer that is gone) restores the error-feedback state and leaves the step
    counter unchanged.
    """

    def __init__(
        self,
        transport: Transport,
        compressor: Compressor,
        *,
        error_feedback: bool = False,
        run_seed: int = 0,
    ) -> None:
        self.transport = transport
        self.scheme = AllGatherDecode(compressor, run_seed=run_seed)
        self.feedback = ErrorFeedback(compressor) if error_feedback else None
        self.run_seed = run_seed
        self.step = 0

    def synchronize(self, gradients: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The rank-average of each gradient (same order, shapes and dtypes; on the CPU)."""
        self._agree_all_finite(gradients)
        saved = self.feedback.snapshot() if self.feedback is not None else None
        try:
            means = [self._mean(index, g) for index, g in enumerate(gradients)]
        except BaseException:
            if self.feedback is not None and saved is not None:
                self.feedback.restore(saved)
            raise
        self.step += 1
        return means

    def _mean(self, index: int, gradient: torch.Tensor) -> torch.Tensor:
        key = self.scheme.key(self.transport.rank, self.step, index)
        if self.feedback is None:
            payload = self.scheme.compressor.encode(gradient, key).payload
            wire_dtype = gradient.dtype
        else:
            payload = self.feedback.encode(gradient, key).payload
            # error feedback encodes g + e in float32 (float64 for float64 gradients)
            wire_dtype = torch.float64 if gradient.dtype == torch.float64 else torch.float32
        mean = self.scheme.exchange(
            self.transport, payload, self.step, index, gradient.shape, wire_dtype
        )
        return mean.to(gradient.dtype)

    def _agree_all_finite(self, gradients: Sequence[torch.Tensor]) -> None:
        finite = all(bool(torch.isfinite(g).all()) for g in gradients)
        self.transport.meter.step = self.step
        flags = self.transport.all_gather_bytes(b"\x01" if finite else b"\x00")
        bad = [rank for rank, flag in enumerate(flags) if flag != b"\x01"]
        if bad:
            raise NonFiniteInputError(
                f"step {self.step}: rank(s) {bad} have NaN or Inf gradients; no rank applied "
                "anything (parameters and error-feedback state unchanged)"
            )

    def state_dict(self) -> dict[str, Any]:
        """The step counter, the run seed and the error-feedback residuals (``torch.save``-able)."""
        return {
            "version": _STATE_VERSION,
            "step": self.step,
            "run_seed": self.run_seed,
            "rank": self.transport.rank,
            "world_size": self.transport.world_size,
            "error_feedback": None if self.feedback is None else self.feedback.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`; the run seed, rank and group size must match."""
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"sync state has version {state.get('version')!r}")
        for name, mine in (
            ("run_seed", self.run_seed),
            ("rank", self.transport.rank),
            ("world_size", self.transport.world_size),
        ):
            if state[name] != mine:
                raise GradzipError(f"sync state was saved with {name} {state[name]}, not {mine}")
        if (state["error_feedback"] is None) != (self.feedback is None):
            raise GradzipError("sync state and this object disagree on error feedback")
        if self.feedback is not None:
            self.feedback.load_state_dict(state["error_feedback"])
        self.step = int(state["step"])
