"""Small torch-operation helpers that also run on fake CUDA tensors (see :mod:`gradzip.device`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def on_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device``, unmoved when it is there already."""
    return t if t.device == device else t.to(device)


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t`` (any dtype, any shape) as a 1-D ``uint8`` tensor on its device, in
    the little-endian layout every device torch runs on has (a view where ``t`` is
    contiguous)."""
    flat = t.reshape(-1)
    return flat if flat.dtype == torch.uint8 else flat.view(torch.uint8)


def bytes_tensor(data: bytes | bytearray | Sequence[int], device: torch.device) -> torch.Tensor:
    """Host bytes as a ``uint8`` tensor on ``device`` (a host-to-device copy; never a read).

    On the CPU one buffer copy (a gloo message's inlined head can be tens of KiB); elsewhere
    built from a list, since under fake CUDA tensors a host tensor cannot be moved to the device
    (the bytes there are a header: a few dozen)."""
    if device.type == "cpu":
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return torch.tensor(list(data), dtype=torch.uint8, device=device)


def host_array(values: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host NumPy array as a tensor on ``device`` (one host-to-device copy; never a read).

    A buffer copy wherever this torch build reaches ``device``; built from a list only where it
    cannot (the tests' fake CUDA tensors on a CPU build, where a host tensor cannot be moved to
    the device). [CHOICE] The list path was rand-k's device encode before: about 90 ms for 2^20
    indices on the host, and rand-k ran at 0.3 GB/s on an H200."""
    t = torch.from_numpy(np.ascontiguousarray(values))
    if device.type == "cpu":
        return t
    if device.type == "cuda" and not torch.cuda.is_available():
        return torch.tensor(values.tolist(), dtype=t.dtype, device=device)
    return t.to(device)
