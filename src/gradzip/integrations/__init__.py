"""Adapters that plug gradzip's compressors and schemes into training frameworks.

* :mod:`gradzip.integrations.ddp`: a communication hook for PyTorch's
  ``DistributedDataParallel`` (``ddp_model.register_comm_hook(state, gradzip_hook)``).
"""

from __future__ import annotations

from gradzip.integrations.ddp import GradzipHookState, gradzip_hook, register_gradzip_hook

__all__ = ["GradzipHookState", "gradzip_hook", "register_gradzip_hook"]
