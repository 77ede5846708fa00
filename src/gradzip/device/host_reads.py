"""The device path's reads back to the host, and an instrument that counts them.

Every value the device path reads on the host goes through :func:`host_read`: the header of a
payload, one flag per bucket. :func:`count_host_reads` counts those and every other way a value
can reach the host while it is active, so a test can bound them:

* torch operations that return a Python value (``.item()``, ``bool(t)``, ``int(t)``,
  ``float(t)``, ``torch.equal``, ``t.tolist()``), seen by a ``TorchDispatchMode``;
* a copy of a non-CPU tensor to the CPU (``.cpu()``, ``.to("cpu")``), seen by the same mode;
* ``Tensor.numpy``, ``Tensor.__array__`` and ``Tensor.tolist``, patched while the instrument is active, which is
  how a CPU tensor reaches NumPy or numba: on CPU tensors run through the device path
  (:func:`gradzip.device.mode.forced_device_payloads`) that is the only way a "host read"
  shows, since ``.cpu()`` is then a no-op.

The sanctioned reads and the patched methods are counted from every thread (simulated ranks
run in threads); the dispatch mode sees the thread that opened the instrument only (torch's
dispatch modes are per thread), so a test of threaded ranks routes every read through
:func:`host_read` or opens the instrument in each rank's thread.

[CHOICE] The instrument is a test and benchmark tool, not a guard: the library does not consult
it. Its records say what was read and how many bytes, so a failing bound names the culprit.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

_local = threading.local()


@dataclass
class HostReads:
    """What :func:`count_host_reads` saw: one ``(what, bytes, where)`` per read."""

    records: list[tuple[str, int, str]] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.records)

    @property
    def total_bytes(self) -> int:
        return sum(size for _, size, _ in self.records)

    @property
    def largest(self) -> int:
        return max((size for _, size, _ in self.records), default=0)

    def describe(self) -> str:
        return "\n".join(f"{what}: {size} B at {where}" for what, size, where in self.records)


#: the open instruments, seen from every thread (simulated ranks run in threads)
_open: list[HostReads] = []
_lock = threading.Lock()


def _active() -> list[HostReads]:
    return _open


def _suppressed() -> bool:
    return bool(getattr(_local, "inside_read", 0))


def _record(what: str, nbytes: int) -> None:
    # [CHOICE] nothing to record while no instrument is open (every training step outside a
    # test): the stack walk below cost a measurable share of a small model's hook step
    if not _open or _suppressed():
        return
    frames = traceback.extract_stack(limit=24)
    where = next(
        (
            f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno}"
            for f in reversed(frames)
            if not any(s in f.filename for s in ("host_reads", "/torch/", "_pytest", "pluggy"))
        ),
        "?",
    )
    with _lock:
        for reads in _active():
            reads.records.append((what, nbytes, where))


def host_read(t: torch.Tensor) -> np.ndarray:
    """The values of ``t`` as a host NumPy array: the device path's one sanctioned read
    (counted once, by its size, by :func:`count_host_reads`)."""
    _record("host_read", t.numel() * t.element_size())
    _local.inside_read = getattr(_local, "inside_read", 0) + 1
    try:
        values: np.ndarray = t.detach().cpu().numpy()
        return values
    finally:
        _local.inside_read -= 1


_SCALAR_OPS = {
    torch.ops.aten._local_scalar_dense.default,
    torch.ops.aten.equal.default,
    torch.ops.aten.is_nonzero.default,
    torch.ops.aten.allclose.default,
}


class _Counter(TorchDispatchMode):  # type: ignore[no-untyped-call]
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _SCALAR_OPS:
            first = args[0] if args else None
            size = first.element_size() if isinstance(first, torch.Tensor) else 8
            _record(f"scalar {func}", size)
        elif func in (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default):
            src = args[1] if func is torch.ops.aten.copy_.default else args[0]
            dst_device = (
                args[0].device if func is torch.ops.aten.copy_.default else kwargs.get("device")
            )
            if (
                isinstance(src, torch.Tensor)
                and src.device.type != "cpu"
                and dst_device is not None
                and torch.device(dst_device).type == "cpu"
            ):
                _record("device-to-host copy", src.numel() * src.element_size())
        return func(*args, **kwargs)


@contextmanager
def count_host_reads() -> Iterator[HostReads]:
    """Count every read of a tensor's values on the host inside the block (see the module)."""
    reads = HostReads()
    stack = _active()
    stack.append(reads)
    numpy_before, array_before = torch.Tensor.numpy, torch.Tensor.__array__
    tolist_before = torch.Tensor.tolist

    def tolist(self: torch.Tensor) -> Any:
        _record("Tensor.tolist", self.numel() * self.element_size())
        return tolist_before(self)

    def numpy(self: torch.Tensor, *args: Any, **kwargs: Any) -> np.ndarray:
        _record("Tensor.numpy", self.numel() * self.element_size())
        values: np.ndarray = numpy_before(self, *args, **kwargs)
        return values

    def array(self: torch.Tensor, *args: Any, **kwargs: Any) -> np.ndarray:
        _record("Tensor.__array__", self.numel() * self.element_size())
        _local.inside_read = getattr(_local, "inside_read", 0) + 1
        try:
            values: np.ndarray = array_before(self, *args, **kwargs)  # type: ignore[no-untyped-call]
            return values
        finally:
            _local.inside_read -= 1

    torch.Tensor.numpy = numpy  # type: ignore[method-assign,assignment]
    torch.Tensor.__array__ = array  # type: ignore[method-assign]
    torch.Tensor.tolist = tolist  # type: ignore[method-assign,assignment]
    try:
        with _Counter():  # type: ignore[no-untyped-call]
            yield reads
    finally:
        torch.Tensor.numpy = numpy_before  # type: ignore[method-assign]
        torch.Tensor.__array__ = array_before  # type: ignore[method-assign]
        torch.Tensor.tolist = tolist_before  # type: ignore[method-assign]
        stack.remove(reads)
