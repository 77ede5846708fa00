"""When the Triton kernels may run: :func:`triton_available`, :func:`forced_triton`.

The Triton kernels (:mod:`gradzip.kernels.triton_dithered`, :mod:`gradzip.kernels.triton_stochastic`)
are the device path's fused passes: bit-equal to the numba CPU kernels and to their torch-ops
twins, one launch instead of dozens of torch operations. They run on CUDA tensors, and on CPU
tensors only under Triton's interpreter (``TRITON_INTERPRET=1``) inside :func:`forced_triton`,
which is how the tests compare them with the numba kernels on a machine without a GPU.

Triton decides between compiling and interpreting when a ``@triton.jit`` function is *defined*
(it reads ``TRITON_INTERPRET`` at decoration time), so the kernel modules run in the mode that
was in force when they were first imported; this module imports neither Triton's compiler nor
the kernels, so a caller can ask without paying for either.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

_FORCED: ContextVar[bool] = ContextVar("gradzip_forced_triton", default=False)


def triton_installed() -> bool:
    """Whether the ``triton`` package can be imported (without importing it)."""
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """Whether Triton's interpreter is requested (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@contextmanager
def forced_triton() -> Iterator[None]:
    """Let :func:`triton_available` accept CPU tensors while ``TRITON_INTERPRET=1`` is set (the
    tests' way to run the kernels in Triton's interpreter on a machine without a GPU)."""
    token = _FORCED.set(True)
    try:
        yield
    finally:
        _FORCED.reset(token)


def triton_available(t: torch.Tensor) -> bool:
    """Whether the Triton kernels may process ``t``: Triton is installed, and ``t`` is a CUDA
    tensor, or a CPU tensor inside :func:`forced_triton` with ``TRITON_INTERPRET=1``."""
    if not triton_installed():
        return False
    if t.is_cuda:
        return True
    return t.device.type == "cpu" and _FORCED.get() and interpreting()


def require_triton(t: torch.Tensor) -> None:
    """Raise ``ValueError`` unless :func:`triton_available` accepts ``t``."""
    if not triton_available(t):
        raise ValueError(
            f"the Triton kernels take CUDA tensors (or CPU tensors under forced_triton() with "
            f"TRITON_INTERPRET=1), not a {t.device.type} tensor here"
        )
