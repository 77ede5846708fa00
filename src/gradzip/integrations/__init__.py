"""Adapters that plug gradzip's compressors and schemes into training frameworks.

* :mod:`gradzip.integrations.ddp`: a communication hook for PyTorch's
  ``DistributedDataParallel`` (``ddp_model.register_comm_hook(state, gradzip_hook)``).
* :mod:`gradzip.integrations.lightning`: ``GradzipDDPStrategy``, Lightning's ``DDPStrategy``
  running that hook on every device, CPU included (needs ``lightning``).
* :mod:`gradzip.integrations.accelerate`: ``attach_gradzip_hook``, the hook on the model that
  ``Accelerator.prepare`` wrapped (needs ``accelerate``).

The last two are not imported here: gradzip works without those packages, and importing either
module without its package raises an ``ImportError`` naming it
(``pip install 'gradzip[integrations]'``).
"""

from __future__ import annotations

from gradzip.integrations.ddp import GradzipHookState, gradzip_hook, register_gradzip_hook

__all__ = ["GradzipHookState", "gradzip_hook", "register_gradzip_hook"]
