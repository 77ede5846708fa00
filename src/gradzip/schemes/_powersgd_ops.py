"""Where PowerSGD computes: the numba kernels on host tensors, torch twins on the device.

:class:`~gradzip.schemes.powersgd.PowerSGD` asks :func:`lowrank_ops` for the steps of a
reduction. Both sets give the same bits (:mod:`gradzip.kernels.lowrank` defines the order,
:mod:`gradzip.kernels.lowrank_torch` repeats it), so the choice is about speed and about
keeping gradient-sized data where the gradient lives, never about results.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from gradzip.compressors.base import empty_output
from gradzip.device.mode import device_path
from gradzip.kernels import lowrank, lowrank_torch


class LowRankOps(Protocol):
    """The steps of one power iteration (factors transposed: ``pt`` ``(r, n)``, ``qt``
    ``(r, m)``)."""

    def gradient(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` as float32 where the ops compute (no copy where it is already)."""
        ...

    def matrix_projected(
        self, gradient: torch.Tensor, residual: torch.Tensor | None, qt: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(M + e, P)``: ``gradient + residual`` (or a copy of ``gradient``; float32
        ``(n, m)``) in fresh room where the ops compute, and ``P = (M + e) Q``. The gradient
        and the residual are not touched (a failed step keeps the residual)."""
        ...

    def orthonormalized(self, pt: torch.Tensor) -> torch.Tensor: ...

    def back_project(self, matrix: torch.Tensor, pt: torch.Tensor) -> torch.Tensor: ...

    def reconstructed(
        self,
        pt: torch.Tensor,
        qt: torch.Tensor,
        matrix: torch.Tensor,
        subtract: bool,
        room: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``P Q^T`` (into ``room``, ``n m`` contiguous values, where given); with
        ``subtract`` also ``matrix -= P Q^T`` in place (the residual)."""
        ...


class HostOps:
    """The numba kernels on contiguous float32 CPU tensors; [CHOICE] ``M + e`` with ``P``, and
    ``P Q^T`` with the residual, each in one pass over the gradient-sized matrix (a row is
    finished while it is in cache; the same bits as the steps one by one)."""

    def gradient(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach().to("cpu", torch.float32)

    def matrix_projected(
        self, gradient: torch.Tensor, residual: torch.Tensor | None, qt: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # [CHOICE] a recycled array (gradzip.buffers): a fresh 64 MB tensor a step costs about
        # 20 ms of page faults
        matrix = empty_output(gradient.numel()).view(gradient.shape)
        pt = torch.empty(qt.shape[0], matrix.shape[0], dtype=torch.float32)
        lowrank.sum_and_project_into(
            gradient.contiguous(),
            None if residual is None else residual.contiguous(),
            matrix,
            qt.contiguous(),
            pt,
        )
        return matrix, pt

    def orthonormalized(self, pt: torch.Tensor) -> torch.Tensor:
        pt = pt.to(torch.float32).contiguous()
        lowrank.orthonormalize_(pt)
        return pt

    def back_project(self, matrix: torch.Tensor, pt: torch.Tensor) -> torch.Tensor:
        qt = torch.empty(pt.shape[0], matrix.shape[1], dtype=torch.float32)
        lowrank.back_project_into(matrix, pt, qt)
        return qt

    def reconstructed(
        self,
        pt: torch.Tensor,
        qt: torch.Tensor,
        matrix: torch.Tensor,
        subtract: bool,
        room: torch.Tensor | None = None,
    ) -> torch.Tensor:
        n, m = pt.shape[1], qt.shape[1]
        out = (empty_output(n * m) if room is None else room).view(n, m)
        lowrank.reconstruct_subtracting(pt, qt, out, matrix if subtract else None)
        return out


class DeviceOps:
    """The torch twins on the gradient's device: nothing read back, nothing moved to the host
    (the rules of :mod:`gradzip.device`)."""

    def gradient(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach().to(torch.float32)

    def matrix_projected(
        self, gradient: torch.Tensor, residual: torch.Tensor | None, qt: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            matrix = gradient.clone(memory_format=torch.contiguous_format)
        else:
            matrix = torch.add(gradient, residual)
        return matrix, lowrank_torch.project(matrix, qt)

    def orthonormalized(self, pt: torch.Tensor) -> torch.Tensor:
        return lowrank_torch.orthonormalized(pt.to(torch.float32))

    def back_project(self, matrix: torch.Tensor, pt: torch.Tensor) -> torch.Tensor:
        return lowrank_torch.back_project(matrix, pt)

    def reconstructed(
        self,
        pt: torch.Tensor,
        qt: torch.Tensor,
        matrix: torch.Tensor,
        subtract: bool,
        room: torch.Tensor | None = None,
    ) -> torch.Tensor:
        into = None if room is None else room.view(pt.shape[1], qt.shape[1])
        approximation = lowrank_torch.reconstruct(pt, qt, into)
        if subtract:
            matrix.sub_(approximation)
        return approximation


HOST_OPS = HostOps()
DEVICE_OPS = DeviceOps()


def lowrank_ops(tensors: Sequence[torch.Tensor]) -> LowRankOps:
    """The device ops when any of ``tensors`` takes the device path
    (:func:`~gradzip.device.mode.device_path`: not on the CPU, or forced), else the host
    kernels. [CHOICE] One choice per group: a bucket's tensors share a device in practice."""
    return DEVICE_OPS if any(device_path(t) for t in tensors) else HOST_OPS
