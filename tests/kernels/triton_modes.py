"""Load the Triton kernel modules in a chosen mode: interpreted (``TRITON_INTERPRET=1``, CPU
tensors) or compiled (CUDA tensors).

Why: Triton decides between interpreting and compiling when a ``@triton.jit`` function is
*defined* (it reads ``TRITON_INTERPRET`` at decoration time, see
:mod:`gradzip.kernels.triton_dispatch`), so setting the variable in a test is too late once the
kernel modules were imported. :func:`load_kernels` imports fresh copies of the modules with the
variable set as asked and puts the previous ones (if any) back into ``sys.modules``, so the
interpreter tests and the GPU test run in one pytest process whatever imported what first.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from collections import Counter
from types import ModuleType, SimpleNamespace
from typing import Any

#: the modules holding ``@triton.jit`` functions, helpers before their users
KERNEL_MODULES = (
    "gradzip.kernels.triton_philox",
    "gradzip.kernels.triton_bitpack",
    "gradzip.kernels.triton_dithered",
    "gradzip.kernels.triton_stochastic",
    "gradzip.kernels.triton_signs",
    "gradzip.kernels.triton_crc32",
)


@functools.cache
def load_kernels(interpret: bool) -> SimpleNamespace:
    """Fresh ``philox``, ``bitpack``, ``dithered``, ``stochastic``, ``signs`` and ``crc32`` kernel modules whose jit
    functions were defined with ``TRITON_INTERPRET`` set to ``interpret``."""
    saved_env = os.environ.get("TRITON_INTERPRET")
    saved = {name: sys.modules.pop(name) for name in KERNEL_MODULES if name in sys.modules}
    os.environ["TRITON_INTERPRET"] = "1" if interpret else "0"
    try:
        fresh: dict[str, ModuleType] = {}
        for name in KERNEL_MODULES:  # the users import the fresh helpers: all in one mode
            fresh[name.rsplit("_", 1)[1]] = importlib.import_module(name)
    finally:
        for name in KERNEL_MODULES:
            sys.modules.pop(name, None)
        sys.modules.update(saved)
        if saved_env is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = saved_env
    return SimpleNamespace(**fresh)


class Counted:
    """A ``@triton.jit`` kernel whose launches (``kernel[grid](...)``) are counted under
    ``name`` in ``calls``; the grid must be host integers (sizes, never values read from a
    tensor)."""

    def __init__(self, kernel: Any, name: str, calls: Counter[str]) -> None:
        self.kernel, self.name, self.calls = kernel, name, calls

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        assert all(type(g) is int for g in grid), grid
        self.calls[self.name] += 1
        return self.kernel[grid]
