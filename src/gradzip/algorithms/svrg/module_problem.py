"""Any ``torch.nn.Module`` with a per-sample loss as a finite-sum problem (LPC-SVRG's
nonconvex case, spec 3.1 and 3.4)."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable

import torch
from torch import nn
from torch.func import functional_call, grad

from gradzip.algorithms.svrg.problems import FiniteSum

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
_RANDOM_IN_TRAINING = (nn.modules.dropout._DropoutNd, nn.modules.batchnorm._BatchNorm)


class ModuleProblem(FiniteSum):
    """``f_i(x) = loss_fn(module_x(inputs[i]), targets[i])`` with ``x`` the module's parameters
    flattened in ``named_parameters()`` order.

    ``loss_fn(outputs, targets)`` returns one loss per sample (shape ``[batch]``), e.g.
    ``lambda o, t: torch.nn.functional.cross_entropy(o, t, reduction="none")``. Gradients come
    from ``torch.func`` on the flat vector, in chunks of ``chunk`` samples; the module itself is
    never modified (its parameters are only the starting point, :meth:`initial_point`).

    The module must be a deterministic function of its parameters, so that every rank computes
    the same bits: a module with dropout or batch norm in training mode is refused (call
    ``module.eval()``). ``f`` is in general nonconvex; LPC-SVRG's guarantee is then on the
    gradient mapping of a uniformly drawn iterate (``output="random"``, spec 3.4).

    Thread safety: ``functional_call`` swaps the given parameters into the module for the
    duration of the call, so two threads calling it on one module can see each other's
    parameters (simulated ranks, :func:`gradzip.comm.local.run_local`, share one problem:
    their results then depended on the thread timing). Each thread other than the one that
    built the problem therefore evaluates a deep copy of the module of its own, made on its
    first call.
    """

    def __init__(
        self,
        module: nn.Module,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        loss_fn: LossFn,
        chunk: int = 4096,
    ) -> None:
        params = list(module.named_parameters())
        if not params:
            raise ValueError("the module has no parameters to train")
        dtypes = {p.dtype for _, p in params}
        if len(dtypes) != 1 or next(iter(dtypes)) not in (torch.float32, torch.float64):
            raise ValueError(f"module parameters must all be float32 or float64, got {dtypes}")
        bad = [
            type(m).__name__
            for m in module.modules()
            if isinstance(m, _RANDOM_IN_TRAINING) and m.training
        ]
        if bad:
            raise ValueError(
                f"{bad[0]} in training mode makes the gradient random or stateful; call "
                "module.eval() first"
            )
        if inputs.shape[0] != targets.shape[0] or inputs.shape[0] == 0:
            raise ValueError(
                f"inputs ({inputs.shape[0]} samples) and targets ({targets.shape[0]}) must hold "
                "the same, non-zero number of samples"
            )
        if chunk < 1:
            raise ValueError(f"chunk must be positive, got {chunk}")
        self.module = module
        self.inputs, self.targets = inputs, targets
        self.loss_fn = loss_fn
        self.chunk = chunk
        self.names = [name for name, _ in params]
        self.shapes = [p.shape for _, p in params]
        self.numels = [p.numel() for _, p in params]
        self.n = int(inputs.shape[0])
        self.dim = sum(self.numels)
        self.dtype = next(iter(dtypes))
        self._grad = grad(self._loss_of)
        self._owner = threading.get_ident()
        self._local = threading.local()
        self._copy_lock = threading.Lock()

    def initial_point(self) -> torch.Tensor:
        """The module's current parameters as one flat vector (a copy)."""
        return torch.cat([p.detach().reshape(-1) for p in self.module.parameters()]).clone()

    def _params(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        views = torch.split(x, self.numels)
        return {n: v.view(s) for n, v, s in zip(self.names, views, self.shapes, strict=True)}

    def _thread_module(self) -> nn.Module:
        """The module this thread evaluates: the original in the building thread, else this
        thread's own deep copy (see the class docstring)."""
        if threading.get_ident() == self._owner:
            return self.module
        own = getattr(self._local, "module", None)
        if own is None:
            with self._copy_lock:
                # its parameters are placeholders: every call passes all of them
                own = copy.deepcopy(self.module)
            self._local.module = own
        return own

    def _loss_of(
        self, x: torch.Tensor, inputs: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        out = functional_call(self._thread_module(), self._params(x), (inputs,))
        losses = self.loss_fn(out, targets)
        if losses.dim() != 1 or losses.shape[0] != inputs.shape[0]:
            raise ValueError(
                f"loss_fn must return one loss per sample (shape [{inputs.shape[0]}]), got "
                f"{tuple(losses.shape)}; use reduction='none'"
            )
        return losses.sum()

    def grad_sum(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        total = torch.zeros(self.dim, dtype=self.dtype)
        for part in torch.split(idx, self.chunk):
            total += self._grad(x, self.inputs[part], self.targets[part])
        return total

    def grad_range(self, x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        total = torch.zeros(self.dim, dtype=self.dtype)
        for lo in range(start, stop, self.chunk):
            hi = min(stop, lo + self.chunk)
            total += self._grad(x, self.inputs[lo:hi], self.targets[lo:hi])
        return total

    def loss_sum(self, x: torch.Tensor, start: int, stop: int) -> float:
        total = 0.0
        with torch.no_grad():
            for lo in range(start, stop, self.chunk):
                hi = min(stop, lo + self.chunk)
                total += float(self._loss_of(x, self.inputs[lo:hi], self.targets[lo:hi]))
        return total
