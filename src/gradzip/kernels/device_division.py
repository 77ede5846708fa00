"""Division by a constant on a tensor's own device: the device path's division rule.

CUDA computes ``tensor / python_scalar`` as a product with the scalar's rounded reciprocal (two
roundings), so a step like ``f32(f64(scale) / per)`` would differ from the numba kernels' true
division for ``per`` not a power of two. Every division by a constant on the device path
therefore divides by a 0-d tensor on the dividend's device (:func:`device_scalar`): a true
IEEE division, the same bits on the CPU and on a GPU, and no host-to-device read.
"""

from __future__ import annotations

import torch


def device_scalar(value: float, like: torch.Tensor) -> torch.Tensor:
    """``value`` as a 0-d tensor of ``like``'s dtype on ``like``'s device."""
    return torch.full((), value, dtype=like.dtype, device=like.device)


def divided(t: torch.Tensor, k: float) -> torch.Tensor:
    """``t / k`` by a true division on ``t``'s device (``k`` as a 0-d tensor there, never a
    product with a rounded reciprocal)."""
    return t / device_scalar(k, t)
