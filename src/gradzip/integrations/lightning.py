"""Lightning: a ``DDPStrategy`` that averages gradients through gradzip's DDP hook on any device.

::

    import lightning.pytorch as pl
    import gradzip
    from gradzip.integrations.lightning import GradzipDDPStrategy
    from gradzip.schemes import make_scheme

    scheme = make_scheme("allgather", gradzip.create("dqsg", M=2), error_feedback=True, run_seed=7)
    strategy = GradzipDDPStrategy(scheme)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_epochs=1)
    trainer.fit(module, loader)
    print(strategy.hook_state.step)  # the steps gradzip averaged on this rank

[CHOICE] A strategy rather than ``DDPStrategy(ddp_comm_hook=gradzip_hook, ...)``: Lightning's
``DDPStrategy`` registers a comm hook only when its device is CUDA (on the CPU it silently
trains as plain DDP), and it takes the hook's state when the strategy is built, before the
processes and the model's DDP wrapper exist. :class:`GradzipDDPStrategy` builds its
:class:`~gradzip.integrations.ddp.GradzipHookState` when Lightning wraps the module in DDP
(every device type, CPU included), in each process, on the default process group that Lightning
initialised; every other ``DDPStrategy`` option works as there.

Needs the ``lightning`` package (``pip install 'gradzip[integrations]'``); importing this module
without it raises an ``ImportError`` that says so. The standalone ``pytorch_lightning`` package
is not supported.
"""

from __future__ import annotations

from typing import Any

from torch.nn.parallel import DistributedDataParallel

from gradzip.errors import GradzipError
from gradzip.integrations.ddp import CHUNK_ELEMENTS, GradzipHookState, gradzip_hook
from gradzip.schemes.base import Scheme
from gradzip.stepping import OnNonfinite, check_on_nonfinite

try:
    from lightning.pytorch.strategies import DDPStrategy
except ImportError as err:  # pragma: no cover - exercised by a test that hides the package
    raise ImportError(
        "gradzip.integrations.lightning needs the 'lightning' package (2.6 is tested): "
        "pip install 'gradzip[integrations]' or pip install 'lightning==2.6.*'"
    ) from err

#: ``DDPStrategy`` arguments for torch's own hooks: DDP takes one hook per model, and this
#: strategy registers gradzip's
_OTHER_HOOK_OPTIONS = (
    "ddp_comm_state",
    "ddp_comm_hook",
    "ddp_comm_wrapper",
    "model_averaging_period",
)


class GradzipDDPStrategy(DDPStrategy):
    """Lightning's ``DDPStrategy`` with :func:`~gradzip.integrations.ddp.gradzip_hook`
    registered on the DDP wrapper, on CPU (gloo) and GPU (NCCL) alike.

    ``scheme`` is the gradzip scheme every rank averages with (the same settings and
    ``run_seed`` on every rank; each process gets its own copy when Lightning spawns them).
    ``on_nonfinite``, ``chunk_elements`` and ``record_timeline`` are
    :class:`~gradzip.integrations.ddp.GradzipHookState`'s; every other keyword argument goes to
    ``DDPStrategy`` (``process_group_backend``, ``start_method``, ``find_unused_parameters``,
    ``bucket_cap_mb``, ...), except those of torch's own comm hooks (``ddp_comm_hook``,
    ``ddp_comm_state``, ``ddp_comm_wrapper``, ``model_averaging_period``), refused with a
    ``TypeError``: DDP takes one hook.

    :attr:`hook_state` exists once ``Trainer.fit`` has wrapped the module. [CHOICE] A later
    ``fit`` of the same module (a new DDP wrapper) keeps it, with its step counter and
    residuals; a different module is refused, since the state holds the first one's parameters.
    """

    def __init__(
        self,
        scheme: Scheme,
        *,
        on_nonfinite: OnNonfinite = "raise",
        chunk_elements: int = CHUNK_ELEMENTS,
        record_timeline: bool = False,
        **kwargs: Any,
    ) -> None:
        if not isinstance(scheme, Scheme):
            raise TypeError(
                f"GradzipDDPStrategy needs a gradzip Scheme, got {type(scheme).__name__}"
            )
        refused = [name for name in _OTHER_HOOK_OPTIONS if name in kwargs]
        if refused:
            raise TypeError(
                f"GradzipDDPStrategy registers gradzip's DDP hook and takes no other: remove "
                f"{', '.join(refused)} (DDP allows one comm hook per model)"
            )
        super().__init__(**kwargs)
        self.scheme = scheme
        self._hook_options: dict[str, Any] = {
            "on_nonfinite": check_on_nonfinite(on_nonfinite),
            "chunk_elements": chunk_elements,
            "record_timeline": record_timeline,
        }
        self._hook_state: GradzipHookState | None = None
        self._hooked_module: Any = None  # the module hook_state was built for

    @property
    def hook_state(self) -> GradzipHookState:
        """This process's hook state: the step counter (``step``, ``skipped_steps``), the bytes
        its transport moved (``transport.meter``), ``state_dict()`` for checkpoints."""
        if self._hook_state is None:
            raise GradzipError(
                "GradzipDDPStrategy has no hook state yet: it is built when Trainer.fit wraps "
                "the module in DistributedDataParallel"
            )
        return self._hook_state

    def configure_ddp(self) -> None:
        """Wrap the module in DDP (``DDPStrategy``'s work), then register gradzip's hook on the
        wrapper, whatever the device."""
        super().configure_ddp()
        ddp = self.model
        if not isinstance(ddp, DistributedDataParallel):  # Lightning's contract; say if it moves
            raise GradzipError(
                f"GradzipDDPStrategy expected DDPStrategy to wrap the module in "
                f"DistributedDataParallel, found {type(ddp).__name__}"
            )
        if self._hook_state is None:
            self._hook_state = GradzipHookState(self.scheme, ddp, **self._hook_options)
            self._hooked_module = ddp.module
        elif ddp.module is not self._hooked_module:
            raise GradzipError(
                "this GradzipDDPStrategy's hook state belongs to another module: give each "
                "LightningModule its own strategy (and scheme)"
            )
        ddp.register_comm_hook(self._hook_state, gradzip_hook)


__all__ = ["GradzipDDPStrategy"]
