"""Accelerate: gradzip's DDP hook on the model that ``Accelerator.prepare`` wrapped.

::

    import gradzip
    from accelerate import Accelerator
    from gradzip.integrations.accelerate import attach_gradzip_hook
    from gradzip.schemes import make_scheme

    accelerator = Accelerator()
    model, opt, loader = accelerator.prepare(model, opt, loader)
    scheme = make_scheme("allgather", gradzip.create("dqsg", M=2), error_feedback=True, run_seed=7)
    state = attach_gradzip_hook(accelerator, model, scheme)  # before the first backward pass
    for x, y in loader:
        opt.zero_grad()
        accelerator.backward(loss_fn(model(x), y))  # the hook runs here, once per bucket
        opt.step()

[CHOICE] A function called after ``prepare()``, not an ``Accelerator`` subclass or a kwargs
handler: ``prepare()`` is where Accelerate builds the ``DistributedDataParallel`` wrapper, and
its ``DistributedDataParallelKwargs(comm_hook=...)`` accepts only torch's own hooks by name, so
the wrapper that ``prepare()`` returns is the public place to register another hook. DDP allows
one hook per model, registered before the first backward pass.

Needs the ``accelerate`` package (``pip install 'gradzip[integrations]'``); importing this
module without it raises an ``ImportError`` that says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.nn.parallel import DistributedDataParallel

from gradzip.errors import GradzipError
from gradzip.integrations.ddp import CHUNK_ELEMENTS, GradzipHookState, register_gradzip_hook
from gradzip.schemes.base import Scheme
from gradzip.stepping import OnNonfinite

try:
    from accelerate.utils import DDPCommunicationHookType
except ImportError as err:  # pragma: no cover - exercised by a test that hides the package
    raise ImportError(
        "gradzip.integrations.accelerate needs the 'accelerate' package (1.15 is tested): "
        "pip install 'gradzip[integrations]' or pip install 'accelerate==1.15.*'"
    ) from err

if TYPE_CHECKING:
    from accelerate import Accelerator


def _ddp_inside(model: torch.nn.Module) -> DistributedDataParallel | None:
    """The DDP wrapper ``prepare()`` returned, also under ``torch.compile``'s wrapper."""
    while not isinstance(model, DistributedDataParallel):
        inner = getattr(model, "_orig_mod", None)  # torch.compile's OptimizedModule
        if not isinstance(inner, torch.nn.Module):
            return None
        model = inner
    return model


def attach_gradzip_hook(
    accelerator: Accelerator,
    model: torch.nn.Module,
    scheme: Scheme,
    on_nonfinite: OnNonfinite = "raise",
    chunk_elements: int = CHUNK_ELEMENTS,
    record_timeline: bool = False,
) -> GradzipHookState:
    """Register :func:`~gradzip.integrations.ddp.gradzip_hook` on ``model``, the model that
    ``accelerator.prepare`` returned, and return its
    :class:`~gradzip.integrations.ddp.GradzipHookState` (the step counter, the bytes on
    ``state.transport.meter``, ``state_dict()`` for checkpoints).

    The hook communicates over the default process group, which the ``Accelerator`` set up.
    ``on_nonfinite``, ``chunk_elements`` and ``record_timeline`` are the hook state's. Raises
    :class:`~gradzip.errors.GradzipError` when ``prepare`` did not wrap the model in
    ``DistributedDataParallel`` (one process, FSDP, DeepSpeed: the message names what the
    accelerator runs) and when ``DistributedDataParallelKwargs(comm_hook=...)`` already gave
    the model torch's hook.
    """
    handler = accelerator.ddp_handler
    if handler is not None and handler.comm_hook != DDPCommunicationHookType.NO:
        raise GradzipError(
            f"the Accelerator registers torch's {handler.comm_hook} comm hook "
            "(DistributedDataParallelKwargs(comm_hook=...)); DDP allows one hook: leave "
            "comm_hook unset to use gradzip's"
        )
    ddp = _ddp_inside(model)
    if ddp is None:
        raise GradzipError(
            f"attach_gradzip_hook needs the model that accelerator.prepare() wrapped in "
            f"DistributedDataParallel; got a {type(model).__name__} (the accelerator runs "
            f"{accelerator.distributed_type} with {accelerator.num_processes} process(es): "
            "gradzip's hook needs DDP with several processes, launched by `accelerate launch` "
            "or torchrun)"
        )
    return register_gradzip_hook(
        ddp,
        scheme,
        on_nonfinite=on_nonfinite,
        chunk_elements=chunk_elements,
        record_timeline=record_timeline,
    )


__all__ = ["attach_gradzip_hook"]
