"""Every simulated data-parallel worker's gradient in one vectorized pass.

In synchronous data-parallel training all workers hold the same parameters and differ only in
their batch shard, so their P gradients are one function, ``grad(loss)(params, shard)``,
evaluated at P shards. :class:`WorkerGradients` maps that function over the shards with
``torch.func.vmap`` (the parameters shared, the data batched along dimension 0): one forward and
one backward of batched kernels instead of P ordinary backward passes.

The result equals each worker's own ``loss.backward()`` up to floating-point rounding: a batched
matrix product may sum in another order than P separate ones, so the two agree to ``allclose``
with tight tolerances, not bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
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
    """``step = WorkerGradients(model)(x, y)``: P workers' gradients of ``loss(model(x_w), y_w)``.

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


def per_worker_gradients(
    model: torch.nn.Module,
    x: Tensor,
    y: Tensor,
    loss: Callable[[Tensor, Tensor], Tensor] = cross_entropy,
) -> WorkerStep:
    """The reference :class:`WorkerGradients` computes in one pass: one ordinary forward and
    ``backward()`` per worker, in turn (P times slower; for checks and benchmarks). Worker
    ``w`` starts from the model's buffers as they were before the call, and the model keeps
    worker 0's buffers afterwards; the parameters' ``.grad`` fields are left untouched."""
    if x.dim() < 2 or x.shape[0] < 1:
        raise ValueError(f"x must be (workers, batch, ...) with workers >= 1, got {tuple(x.shape)}")
    params = [p for p in model.parameters() if p.requires_grad]
    shared = dict(model.named_buffers())
    start = {name: b.detach().clone() for name, b in shared.items()}
    grads: list[list[Tensor]] = [[] for _ in params]
    losses, corrects = [], []
    buffers: dict[str, list[Tensor]] = {name: [] for name in shared}
    for w in range(x.shape[0]):
        with torch.no_grad():
            for name, b in shared.items():
                b.copy_(start[name])
        logits = model(x[w])
        value = loss(logits, y[w])
        worker_grads = torch.autograd.grad(value, params, allow_unused=True)
        for i, (p, g) in enumerate(zip(params, worker_grads, strict=True)):
            grads[i].append(torch.zeros_like(p) if g is None else g)
        losses.append(value.detach())
        corrects.append((logits.argmax(dim=-1) == y[w]).sum())
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
