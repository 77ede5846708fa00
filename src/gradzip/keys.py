"""Keys that name one message for shared randomness and for validation on receipt."""

from __future__ import annotations

from dataclasses import dataclass

_U64 = 2**64


@dataclass(frozen=True)
class StreamKey:
    """Identifies one compressed message: whose, when, and which tensor.

    Sender and receiver build the same key from public facts (spec 0.4): ``run_seed`` is the run's
    base seed, ``rank`` the sending worker, ``step`` the communication round (incremented once per
    round on both sides), ``tensor_index`` the parameter tensor's position in
    ``model.parameters()``, and ``chunk`` a sub-division of that tensor when it is sent in several
    pieces (communication buckets, reduce-scatter slices). The key is written into every payload
    header so that a receiver can detect a step or seed mismatch instead of decoding garbage.
    """

    run_seed: int = 0
    rank: int = 0
    step: int = 0
    tensor_index: int = 0
    chunk: int = 0

    def __post_init__(self) -> None:
        for name in ("run_seed", "rank", "step", "tensor_index", "chunk"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"StreamKey.{name} must be an int, got {type(value).__name__}")
            if not 0 <= value < _U64:
                raise ValueError(f"StreamKey.{name} must lie in [0, 2**64), got {value}")

    def with_step(self, step: int) -> StreamKey:
        """The same key at another communication round."""
        return StreamKey(self.run_seed, self.rank, step, self.tensor_index, self.chunk)

    def describe_difference(self, other: StreamKey) -> str:
        """Human-readable list of the fields in which ``self`` differs from ``other``."""
        parts = []
        for name in ("run_seed", "rank", "step", "tensor_index", "chunk"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                parts.append(f"{name} {mine} != expected {theirs}")
        return ", ".join(parts)
