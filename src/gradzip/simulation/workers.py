"""Every simulated data-parallel worker's gradient: exactly as a real rank computes it, or (an
explicit opt-in) in one vectorized pass.

In synchronous data-parallel training all workers hold the same parameters and differ only in
their batch shard. Two ways to get the P gradients of one step:

* :class:`PerWorkerGradients` (the default of ``gradzip train``): one ordinary forward and
  ``torch.autograd.grad`` per worker, in turn, each on a fresh copy of that worker's shard and on
  one intra-op thread. A process rank (``--backend gloo`` or ``env``) calls the very same code on
  its own shard, so a simulated worker's gradient equals the real rank's **bit for bit on any
  CPU**: the same kernels see the same inputs at the same alignment with the same thread count.
  Why one thread: on this project's development machine a float32 matrix product of a 4096-wide
  layer gives different last bits on 1 and 2 intra-op threads, and spawned ranks run on one
  thread each (as ``torchrun`` sets ``OMP_NUM_THREADS=1`` by default); fixing the gradient pass
  to one thread makes the result independent of how many threads the caller's process uses.
* :class:`WorkerGradients` (``gradzip train --vectorized-gradients``): ``torch.func.vmap`` of
  ``grad(loss)`` over the P shards, one forward and one backward of batched kernels. About twice
  as fast, but **not bit-exact**: a batched matrix product may sum in another order than P
  separate ones (it did on a CPU with AVX-512/AMX), so it agrees with the process backends to
  ``allclose`` only.

Both return a :class:`WorkerStep` and leave the model's parameters and ``.grad`` fields alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor
from torch.func import functional_call, grad_and_value, vmap
from torch.nn.functional import cross_entropy

Randomness = Literal["different", "same", "error"]


@dataclass
class WorkerStep:
    """The P workers' results of one step (worker ``w`` is index ``w`` of dimension 0)."""

    #: one ``(P, *param.shape)`` tensor per trainable parameter, in ``model.parameters()`` order
    grads: list[Tensor]
    #: ``(P,)``: each worker's loss on its shard
    loss: Tensor
    #: ``(P,)``: how many of each worker's samples the model classified right (argmax == label)
    correct: Tensor
    #: each buffer after the step, one copy per worker: ``(P, *buffer.shape)`` by name
    buffers: dict[str, Tensor]

    @property
    def workers(self) -> int:
        return int(self.loss.shape[0])

    def worker(self, index: int) -> list[Tensor]:
        """Worker ``index``'s gradients, one tensor per trainable parameter (views)."""
        return [g[index] for g in self.grads]


class WorkerGradients:
    """``step = WorkerGradients(model)(x, y)``: P workers' gradients of ``loss(model(x_w), y_w)``
    in one vectorized pass (an opt-in: equal to :class:`PerWorkerGradients` up to floating-point
    rounding only, not bit for bit).

    ``x`` is ``(P, b, ...)`` (worker ``w``'s shard of ``b`` samples is ``x[w]``) and ``y`` is
    ``(P, b)``; the model sees ``x[w]`` exactly as one worker would. Gradients are taken with
    respect to every parameter with ``requires_grad`` (the others are held fixed), in
    ``model.parameters()`` order, which is the order
    :class:`~gradzip.optim.CompressedOptimizer` exchanges them in.

    The model's own ``training`` flag applies: in train mode dropout draws
    ``randomness="different"`` masks per worker by default, as independent workers would
    (``"same"`` gives every worker the same mask; ``"error"`` refuses random operations). Each
    worker gets its own copy of the model's buffers, so a module that updates a buffer in train
    mode (batch-norm running statistics) updates it per worker from that worker's shard; the
    model then keeps worker 0's buffers, as ``DistributedDataParallel`` broadcasts rank 0's
    buffers. The model's parameters and ``.grad`` fields are left untouched.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        loss: Callable[[Tensor, Tensor], Tensor] = cross_entropy,
        *,
        randomness: Randomness = "different",
    ) -> None:
        self.model = model
        self.loss = loss
        self.randomness = randomness

        def objective(
            trainable: dict[str, Tensor],
            frozen: dict[str, Tensor],
            buffers: dict[str, Tensor],
            x: Tensor,
            y: Tensor,
        ) -> tuple[Tensor, Tensor]:
            logits = functional_call(self.model, (trainable, frozen, buffers), (x,))
            correct = (logits.argmax(dim=-1) == y).sum()
            return self.loss(logits, y), correct

        self._step = vmap(
            grad_and_value(objective, has_aux=True),
            in_dims=(None, None, 0, 0, 0),
            randomness=randomness,
        )

    def __call__(self, x: Tensor, y: Tensor) -> WorkerStep:
        if x.dim() < 2 or y.dim() < 1 or x.shape[:2] != y.shape[:2]:
            raise ValueError(
                "x must be (workers, batch, ...) and y (workers, batch), got "
                f"{tuple(x.shape)} and {tuple(y.shape)}"
            )
        workers = x.shape[0]
        named = list(self.model.named_parameters())
        trainable = {name: p.detach() for name, p in named if p.requires_grad}
        frozen = {name: p.detach() for name, p in named if not p.requires_grad}
        shared = dict(self.model.named_buffers())
        buffers = {
            name: b.detach().unsqueeze(0).expand(workers, *b.shape).clone()
            for name, b in shared.items()
        }
        grads, (loss, correct) = self._step(trainable, frozen, buffers, x, y)
        with torch.no_grad():
            for name, b in shared.items():
                b.copy_(buffers[name][0])
        return WorkerStep(
            grads=[grads[name] for name in trainable],
            loss=loss.detach(),
            correct=correct,
            buffers=buffers,
        )


@contextlib.contextmanager
def one_intra_op_thread() -> Iterator[None]:
    """Run the body with ``torch.set_num_threads(1)``, restoring the caller's count after: the
    exact gradient pass's thread count, so its result does not depend on the process's."""
    before = torch.get_num_threads()
    if before != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if before != 1:
            torch.set_num_threads(before)


def worker_gradient(
    model: torch.nn.Module,
    x: Tensor,
    y: Tensor,
    loss: Callable[[Tensor, Tensor], Tensor] = cross_entropy,
) -> tuple[list[Tensor], Tensor, Tensor]:
    """One worker's ``(gradients, loss, correct)`` on its shard ``x`` (``(b, ...)``), ``y``
    (``(b,)``): an ordinary forward and ``torch.autograd.grad`` with respect to every parameter
    with ``requires_grad``, in ``model.parameters()`` order (zeros for unused ones), on one
    intra-op thread and on a fresh, contiguous copy of the shard (so the kernels see the same
    memory alignment wherever the shard came from). This is the computation a process rank
    performs, and the one the simulation repeats per worker. The model's buffers are updated as
    a forward pass in train mode updates them."""
    params = [p for p in model.parameters() if p.requires_grad]
    with one_intra_op_thread(), torch.enable_grad():
        shard, labels = x.clone(memory_format=torch.contiguous_format), y.clone()
        logits = model(shard)
        value = loss(logits, labels)
        grads = torch.autograd.grad(value, params, allow_unused=True)
        correct = (logits.argmax(dim=-1) == labels).sum()
    out = [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)]
    return out, value.detach(), correct


class PerWorkerGradients:
    """``step = PerWorkerGradients(model)(x, y)``: the P workers' gradients, each computed by
    :func:`worker_gradient` exactly as a process rank computes its own (bit-exact with the
    process backends on any CPU; see the module docstring). Same interface as
    :class:`WorkerGradients`: ``x`` is ``(P, b, ...)`` and ``y`` is ``(P, b)``.

    Worker ``w`` starts from the model's buffers as they were before the call (as every real
    rank holds the same buffers at the start of a step), and the model keeps worker 0's buffers
    afterwards, as ``DistributedDataParallel`` broadcasts rank 0's. Dropout masks come from
    torch's global generator in worker order: the models of ``gradzip train`` draw none
    (dropout 0), and a model that does is not bit-exact with independent processes.
    """

    def __init__(
        self, model: torch.nn.Module, loss: Callable[[Tensor, Tensor], Tensor] = cross_entropy
    ) -> None:
        self.model = model
        self.loss = loss

    def __call__(self, x: Tensor, y: Tensor) -> WorkerStep:
        if x.dim() < 2 or y.dim() < 1 or x.shape[0] < 1 or x.shape[:2] != y.shape[:2]:
            raise ValueError(
                "x must be (workers, batch, ...) and y (workers, batch) with workers >= 1, got "
                f"{tuple(x.shape)} and {tuple(y.shape)}"
            )
        shared = dict(self.model.named_buffers())
        start = {name: b.detach().clone() for name, b in shared.items()}
        grads: list[list[Tensor]] = []
        losses, corrects = [], []
        buffers: dict[str, list[Tensor]] = {name: [] for name in shared}
        for w in range(x.shape[0]):
            with torch.no_grad():
                for name, b in shared.items():
                    b.copy_(start[name])
            worker_grads, value, correct = worker_gradient(self.model, x[w], y[w], self.loss)
            if not grads:
                grads = [[] for _ in worker_grads]
            for column, g in zip(grads, worker_grads, strict=True):
                column.append(g)
            losses.append(value)
            corrects.append(correct)
            for name, b in shared.items():
                buffers[name].append(b.detach().clone())
        with torch.no_grad():
            for name, b in shared.items():
                b.copy_(buffers[name][0])
        return WorkerStep(
            grads=[torch.stack(g) for g in grads],
            loss=torch.stack(losses),
            correct=torch.stack(corrects),
            buffers={name: torch.stack(v) for name, v in buffers.items()},
        )


def per_worker_gradients(
    model: torch.nn.Module,
    x: Tensor,
    y: Tensor,
    loss: Callable[[Tensor, Tensor], Tensor] = cross_entropy,
) -> WorkerStep:
    """``PerWorkerGradients(model, loss)(x, y)``: every worker's exact gradient, in turn."""
    return PerWorkerGradients(model, loss)(x, y)
