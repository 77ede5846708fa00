"""Single-machine training runs for the QESGD experiments: SGD, whole-vector QSGD and QESGD
(Algorithm 2) on one model, as the paper ran them ("since the distributed version of these
methods take synchronous strategy, the performance is equivalent to that on single machine").

* ``sgd``: ``w <- w - eta (g + lambda w)`` (``torch.optim.SGD``, no momentum: the seed names
  none [CHOICE]). Bits: the fp32 gradient as an ``identity`` payload (what a worker would push).
* ``qsgd``: the flat gradient of all parameters through the ``qsgd_l2`` compressor
  (``delta = ||g||_2 / 2^(b-1)``, one scale for the whole vector, spec 2.3), decoded, then the
  same SGD step; weight decay is added after decoding (the communicated gradient is the loss's)
  [CHOICE]. Bits: the payload.
* ``qesgd``: :class:`~gradzip.algorithms.qesgd.QESGDOptimizer` (weight decay inside the
  offset update, spec 2.2), one epoch per pass over the training subset, the schedule
  calibrated once on the full gradient at ``w_0``. Bits: the offset payload.

Every payload is really encoded and decoded; the bits reported are the payloads' measured sizes.
Learning rate: ``lr0`` divided by 10 at each milestone epoch (the same for every method, as the
seed says) [CHOICE: the seed gives no schedule; He et al.'s steps at 50% and 75%].
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 (the conventional alias)

from gradzip.accounting import Encoded
from gradzip.algorithms.qesgd import QESGDOptimizer
from gradzip.algorithms.qesgd.schedule import DeltaSchedule, flatten
from gradzip.algorithms.qesgd.state import QesgdOutput
from gradzip.compressors.identity import Identity
from gradzip.compressors.qsgd_l2 import QSGDL2
from gradzip.keys import StreamKey
from gradzip_lab.reproduce.outcome import Row
from gradzip_lab.reproduce.plots import line_plot

KINDS = ("sgd", "qsgd", "qesgd")


@dataclass(frozen=True)
class Method:
    """One row of the comparison: the method, its weight decay and bits (None for SGD), the
    paper's number for it (None where the paper has none) and, for QESGD, a ``c`` of its own
    (None: the experiment's)."""

    label: str
    kind: str
    weight_decay: float
    bits: int | None
    paper: float | None = None
    c: float | None = None

    @property
    def name(self) -> str:
        bits = "" if self.bits is None else f", {self.bits} bits"
        c = "" if self.c is None else f", c {self.c:g}"
        return f"{self.label} (wd {self.weight_decay:g}{bits}{c})"


@dataclass
class Schedule:
    """Epochs, steps per epoch (``K``), the initial rate and the epochs where it drops x0.1."""

    epochs: int
    steps_per_epoch: int
    lr0: float
    milestones: tuple[int, ...] = ()

    def lr(self, epoch: int) -> float:
        return self.lr0 * 0.1 ** sum(epoch >= m for m in self.milestones)


@dataclass
class Result:
    """One finished run: evaluations ``(step, value)``, the last value, the mean measured bits
    per iteration, and the wall time."""

    method: Method
    curve: list[tuple[int, float]] = field(default_factory=list)
    train_loss: list[tuple[int, float]] = field(default_factory=list)
    bits_per_step: float = 0.0
    seconds: float = 0.0
    diverged: bool = False
    #: QESGD: the share of coordinate updates its grid clipped (a sign that c is too large)
    clipped_share: float | None = None

    @property
    def final(self) -> float | None:
        return self.curve[-1][1] if self.curve else None


class Updater:
    """Applies one method's update to ``params`` from their ``.grad``; counts payload bits."""

    def __init__(
        self,
        method: Method,
        params: Sequence[torch.nn.Parameter],
        schedule: Schedule,
        *,
        c: float,
        output: QesgdOutput,
        norms: tuple[float, ...],
        seed: int,
    ) -> None:
        if method.kind not in KINDS:
            raise ValueError(f"unknown method kind {method.kind!r}; choose one of {KINDS}")
        self.method, self.params, self.seed = method, list(params), seed
        self.bits, self.steps = 0, 0
        lr, wd = schedule.lr(0), method.weight_decay
        self.optimizer: torch.optim.Optimizer
        if method.kind == "qesgd":
            bits = method.bits or 8
            c = c if method.c is None else method.c
            self.optimizer = QESGDOptimizer(
                self.params,
                lr,
                bits=bits,
                c=c,
                weight_decay=wd,
                output=output,
                steps_per_epoch=schedule.steps_per_epoch,
                schedule=DeltaSchedule(norms, bits, c),
                run_seed=seed,
            )
        else:
            self.optimizer = torch.optim.SGD(self.params, lr=lr, weight_decay=wd)
            self.codec = (
                Identity()
                if method.kind == "sgd"
                else QSGDL2(bits=method.bits or 8, bucket_size=None)
            )

    def clipped_share(self) -> float | None:
        """QESGD's clipped coordinates over all coordinate updates so far (None otherwise)."""
        if not isinstance(self.optimizer, QESGDOptimizer) or self.steps == 0:
            return None
        d = self.optimizer.epoch_state.numel
        return self.optimizer.clipped_total / (d * self.steps)

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def step(self) -> None:
        if isinstance(self.optimizer, QESGDOptimizer):
            before = self.optimizer.encoded_bits
            self.optimizer.step()
            self.bits += self.optimizer.encoded_bits - before
        else:
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
            flat = flatten(grads)
            key = StreamKey(self.seed, 0, self.steps, 0)
            encoded: Encoded
            encoded, decoded = self.codec.round_trip(flat, key)
            self.bits += encoded.wire_bits
            if self.method.kind == "qsgd":
                offset = 0
                for p in self.params:
                    p.grad = decoded[offset : offset + p.numel()].view_as(p).clone()
                    offset += p.numel()
            self.optimizer.step()
        self.steps += 1


def evaluate_accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Test accuracy (fraction) in eval mode, in chunks."""
    model.eval()
    correct = 0
    with torch.no_grad():
        for start in range(0, len(y), 1000):
            logits = model(x[start : start + 1000])
            correct += int((logits.argmax(1) == y[start : start + 1000]).sum())
    model.train()
    return correct / len(y)


def train_classifier(
    method: Method,
    build: Callable[[], torch.nn.Module],
    data: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    schedule: Schedule,
    *,
    batch: int,
    c: float,
    output: QesgdOutput,
    norms: tuple[float, ...],
    seed: int,
    evals_per_epoch: int = 1,
) -> Result:
    """Train a fresh ``build()`` with ``method``; test accuracy (%) after every epoch."""
    from gradzip.data.datasets import EpochBatches

    train_x, train_y, test_x, test_y = data
    model = build()
    updater = Updater(
        method, list(model.parameters()), schedule, c=c, output=output, norms=norms, seed=seed
    )
    batches = EpochBatches(len(train_y), batch, 1, seed)
    if len(batches) < schedule.steps_per_epoch:
        raise ValueError(
            f"{len(train_y)} samples hold fewer than {schedule.steps_per_epoch} batches"
        )
    result, started, every = (
        Result(method),
        time.perf_counter(),
        max(1, schedule.steps_per_epoch // evals_per_epoch),
    )
    for epoch in range(schedule.epochs):
        updater.set_lr(schedule.lr(epoch))
        for k in range(schedule.steps_per_epoch):
            index = batches.indices(epoch, k)[0]
            loss: torch.Tensor = F.cross_entropy(model(train_x[index]), train_y[index])
            model.zero_grad()
            torch.autograd.backward(loss)
            step = epoch * schedule.steps_per_epoch + k + 1
            if not math.isfinite(float(loss.detach())):
                result.diverged = True
                result.curve.append((step, 10.0))  # chance level: a diverged run is a guess
                break
            updater.step()
            if step % 10 == 0:
                result.train_loss.append((step, float(loss.detach())))
            if (k + 1) % every == 0 and (k + 1) != schedule.steps_per_epoch:
                result.curve.append((step, 100 * evaluate_accuracy(model, test_x, test_y)))
        if result.diverged:
            break
        result.curve.append(
            ((epoch + 1) * schedule.steps_per_epoch, 100 * evaluate_accuracy(model, test_x, test_y))
        )
    result.bits_per_step = updater.bits / max(1, updater.steps)
    result.clipped_share = updater.clipped_share()
    result.seconds = time.perf_counter() - started
    return result


def plot_results(results: Sequence[Result], path: Any, title: str, ylabel: str) -> None:
    """Every run's curve in one PNG."""
    series = [(r.method.name, [p[0] for p in r.curve], [p[1] for p in r.curve]) for r in results]
    line_plot(path, series, title=title, ylabel=ylabel, legend_size=7, figsize=(7, 4.5))


def traffic_rows(results: Sequence[Result]) -> list[Row]:
    """Each run's measured Kbit per iteration and, for the quantized ones, the share of
    coordinates the grid clipped (rows with no paper value)."""
    rows = [
        Row(f"{r.method.name}: measured Kbit per iteration", None, r.bits_per_step / 1000, "Kbit")
        for r in results
    ]
    rows += [
        Row(f"{r.method.name}: coordinates clipped by the grid", None, 100 * r.clipped_share, "%")
        for r in results
        if r.clipped_share is not None
    ]
    return rows
