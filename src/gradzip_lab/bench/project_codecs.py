"""What the scaling model measures on this machine: payload sizes, codec seconds, compute.

Every byte count is ``len(payload)`` of a real encode of a float32 tensor of the size in
question (a parameter, or the chunk of it a ring hop carries), never a bits-per-coordinate
formula; every second is a timed run on this machine, at the thread count the caller set
(the command sets one: a rank of ``gradzip bench cluster`` on 2 cores runs at one or less).

[CHOICE] The gradzip DDP hook encodes each parameter on its own
(:mod:`gradzip.integrations.ddp`), so payloads are measured per parameter, not per DDP bucket;
DDP's bucket count only sets the rounds of the uncompressed baselines (:func:`ddp_buckets`).
[CHOICE] Inputs are standard normal draws from a fixed seed: gradients' scale does not change
the sizes of fixed-width codes; an entropy-coded payload (dqsg's symbols) is a little smaller on
real, peakier gradients.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from gradzip.compressors import get
from gradzip.keys import StreamKey

KEY = StreamKey(run_seed=2024, rank=0, step=1, tensor_index=0)
#: DDP's defaults: the first bucket holds 1 MiB, the others 25 MiB (``bucket_cap_mb``)
FIRST_BUCKET_BYTES = 1 << 20
BUCKET_BYTES = 25 << 20


def ddp_buckets(numels: Sequence[int]) -> list[int]:
    """The float32 element counts of DDP's buckets for parameters of ``numels`` (model order):
    filled in reverse order, the first up to 1 MiB, the others 25 MiB, a parameter never split.
    [RECON] DDP's own assignment also splits by dtype and device; here one of each."""
    buckets: list[int] = []
    current, cap = 0, FIRST_BUCKET_BYTES
    for n in reversed(numels):
        current += n
        if 4 * current >= cap:
            buckets.append(current)
            current, cap = 0, BUCKET_BYTES
    if current:
        buckets.append(current)
    return buckets


def seconds_best_of(fn: Callable[[], Any], repeat: int) -> float:
    """The fastest of ``repeat`` runs of ``fn``, in seconds (see :meth:`CodecMeasure.time_codec`
    for why the best)."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _normal(numel: int) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(numel % 100_003))


@dataclass
class CodecMeasure:
    """One compressor (with its parameters) measured: payload bytes per tensor size (cached, so
    each size is encoded once), and encode/decode seconds per float32 coordinate."""

    compressor: str
    params: dict[str, Any]
    encode_s_per_coord: float = 0.0
    decode_s_per_coord: float = 0.0
    _sizes: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._codec = get(self.compressor)(**self.params)

    @property
    def label(self) -> str:
        return str(self._codec.describe())

    def payload_bytes(self, numel: int) -> int:
        """``len(payload)`` of encoding ``numel`` standard normal values (measured once)."""
        if numel < 1:
            raise ValueError(f"a tensor to encode needs >= 1 element, got {numel}")
        if numel not in self._sizes:
            self._sizes[numel] = len(self._codec.encode(_normal(numel), KEY).payload)
        return self._sizes[numel]

    def total_bytes(self, numels: Sequence[int]) -> int:
        return sum(self.payload_bytes(n) for n in numels)

    def time_codec(self, numel: int, repeat: int = 9) -> None:
        """Time encode and decode on ``numel`` values (after an untimed call on a small tensor:
        numba's kernel loading stays out); keeps the seconds per coordinate. [CHOICE] The best
        of many short runs: on a shared machine the best run is the one the load left alone."""
        small = _normal(4096)
        side = small if self._codec.needs_side_information else None
        self._codec.decode(self._codec.encode(small, KEY).payload, shape=small.shape, side=side)
        x = _normal(numel)
        side = x if self._codec.needs_side_information else None
        encoded = self._codec.encode(x, KEY)
        self._sizes.setdefault(numel, len(encoded.payload))
        self.encode_s_per_coord = (
            seconds_best_of(lambda: self._codec.encode(x, KEY), repeat) / numel
        )
        self.decode_s_per_coord = (
            seconds_best_of(
                lambda: self._codec.decode(encoded.payload, shape=x.shape, side=side), repeat
            )
            / numel
        )


def error_feedback_s_per_coord(numel: int, repeat: int = 9) -> float:
    """Seconds a coordinate of error feedback's own work: adding the residual and keeping the new
    one (two float32 passes), timed."""
    x, residual = _normal(numel), torch.zeros(numel)

    def step() -> None:
        corrected = x + residual
        residual.copy_(corrected - x)

    return seconds_best_of(step, repeat) / numel


def cast_s_per_coord(numel: int, repeat: int = 9) -> float:
    """Seconds a coordinate of ``fp16_compress_hook``'s own work: float32 to float16, back, and
    the division by P (timed)."""
    x = _normal(numel)
    return seconds_best_of(lambda: x.half().float().div_(2.0), repeat) / numel


def matrix_shapes(shapes: Sequence[torch.Size]) -> list[tuple[int, int]]:
    """The (rows, columns) PowerSGD views each parameter of more than one dimension as."""
    return [(s[0], int(torch.Size(s[1:]).numel())) for s in shapes if len(s) > 1]


def powersgd_compresses(rows: int, cols: int, rank: int) -> bool:
    """torch's ``powerSGD_hook`` compresses a matrix only when its factors are at most half its
    size (``min_compression_rate=2``, the default)."""
    return rows * cols >= 2 * (rows + cols) * rank


def powersgd_seconds(shapes: Sequence[torch.Size], rank: int, repeat: int = 4) -> float:
    """Seconds of one rank's PowerSGD arithmetic for one step on parameters of ``shapes`` (the
    compressed matrices): error feedback, ``P = MQ``, orthonormalizing P, ``Q = M^T P`` and the
    new residual ``M - PQ^T``, timed (the collectives between them are the link's)."""
    total = 0.0
    for rows, cols in matrix_shapes(shapes):
        if not powersgd_compresses(rows, cols, rank):
            continue
        m, err = _normal(rows * cols).view(rows, cols), torch.zeros(rows, cols)
        q = torch.randn(cols, rank, generator=torch.Generator().manual_seed(1))

        def step(m: torch.Tensor = m, err: torch.Tensor = err, q: torch.Tensor = q) -> None:
            corrected = m + err
            p = corrected @ q
            p = torch.linalg.qr(p).Q
            q2 = corrected.T @ p
            err.copy_(corrected - p @ q2.T)

        total += seconds_best_of(step, repeat)
    return total


def gradzip_powersgd_seconds(shapes: Sequence[torch.Size], rank: int, repeat: int = 4) -> float:
    """Seconds of one rank's arithmetic in gradzip's PowerSGD for one step on parameters of
    ``shapes``: the scheme itself (its numba kernels: ``M + e`` with ``P``, the Gram-Schmidt,
    ``Q``, ``P Q^T`` with the residual) reducing every parameter in one group over a one-rank
    in-memory transport, float32 factors and error feedback, timed after two untimed steps
    (the warm start and the residuals in place, the recycled arrays mapped)."""
    from gradzip.comm.local import LocalGroup
    from gradzip.schemes.powersgd import PowerSGD

    scheme = PowerSGD(get("identity")(), error_feedback=True, rank=rank)
    transport = LocalGroup(1).endpoint(0)
    tensors = [_normal(int(s.numel())).view(s) for s in shapes]
    indices = list(range(len(tensors)))
    steps = itertools.count()

    def step() -> None:
        scheme.reduce_many_if_all_finite(transport, tensors, indices, next(steps), True)

    step()
    step()
    return seconds_best_of(step, repeat)


def compute_seconds(model: torch.nn.Module, sample: torch.Tensor, repeat: int = 3) -> float:
    """Seconds of one forward and backward of ``model`` on ``sample`` (a batch; the loss is the
    mean output, enough to run every gradient), the best of ``repeat`` after one untimed."""

    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(sample).float().mean().backward()

    step()
    return seconds_best_of(step, repeat)
