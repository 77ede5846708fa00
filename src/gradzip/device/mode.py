"""When a codec takes its device path: for tensors not on the CPU, or forced (tests)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from gradzip.kernels.backend import forced_torch_ops

#: how many :func:`forced_device_payloads` blocks are open, in any thread: a count, not a saved
#: previous value, so that blocks opened and closed by several threads (simulated ranks) in any
#: order leave the mode off once all are closed
_forced = 0
_lock = threading.Lock()


def device_path(t: torch.Tensor) -> bool:
    """Whether ``t`` is encoded into (and a payload on its device decoded as) a device payload:
    when ``t`` is not on the CPU, or inside :func:`forced_device_payloads`."""
    return _forced > 0 or t.device.type != "cpu"


@contextmanager
def forced_device_payloads() -> Iterator[None]:
    """Run the device path on CPU tensors too: device payloads (``uint8`` tensors) built by
    torch operations, as on a GPU. This is how the tests check, on a machine without one, that
    the device path gives the host path's bytes and reads nothing back."""
    global _forced
    with _lock:
        _forced += 1
    try:
        with forced_torch_ops():
            yield
    finally:
        with _lock:
            _forced -= 1
