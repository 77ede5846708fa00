"""Where PowerSGD computes: the numba kernels on host tensors, torch twins on the device.

:class:`~gradzip.schemes.powersgd.PowerSGD` asks :func:`lowrank_ops` for the four products of a
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
    """The products of one power-iteration step (factors transposed: ``pt`` ``(r, n)``, ``qt``
    ``(r, m)``)."""

    def matrix(self, gradient: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        """``M + e`` (``gradient + residual``, or a copy of ``gradient``; float32 ``(n, m)``)
        in fresh room where the ops compute: the residual is not touched (a failed step keeps
        it)."""
        ...

    def gradient(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` as float32 where the ops compute (no copy where it is already)."""
        ...

    def project(self, matrix: torch.Tensor, qt: torch.Tensor) -> torch.Tensor: ...

    def matrix_projected(
        self, gradient: torch.Tensor, residual: torch.Tensor | None, qt: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(M + e, P)``: :meth:`matrix` and :meth:`project` of it (in one pass on the host)."""
        ...

    def orthonormalized(self, pt: torch.Tensor) -> torch.Tensor: ...

    def back_project(self, matrix: torch.Tensor, pt: torch.Tensor) -> torch.Tensor: ...

    def reconstruct(self, pt: torch.Tensor, qt: torch.Tensor) -> torch.Tensor: ...

    def reconstructed(
        self,
        pt: torch.Tensor,
        qt: torch.Tensor,
        matrix: torch.Tensor,
        subtract: bool,
        room: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """:meth:`reconstruct` (into ``room``, ``n m`` contiguous values, where given); with
        ``subtract`` also ``matrix -= P Q^T`` in place (the residual; in the same pass on the
        host)."""
        ...


class HostOps:
    """The numba kernels on contiguous float32 CPU tensors (the host path, as before)."""

    def matrix(self, gradient: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        # [CHOICE] a recycled array (gradzip.buffers): a fresh 64 MB tensor a step costs about
        # 20 ms of page faults
        matrix = empty_output(gradient.numel()).view(gradient.shape)
        if residual is None:
            return matrix.copy_(gradient)
        return torch.add(gradient, residual, out=matrix)

    def gradient(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach().to("cpu", torch.float32)

    def project(self, matrix: torch.Tensor, qt: torch.Tensor) -> torch.Tensor:
        pt = torch.empty(qt.shape[0], matrix.shape[0], dtype=torch.float32)
        lowrank.project_into(matrix, qt, pt)
        return pt

    def matrix_projected(
        self, gradient: torch.Tensor, residual: torch.Tensor | None, qt: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # [CHOICE] one pass: each row of M + e is projected while in cache (the sum and the
        # projection were two passes over the gradient-sized matrix; same bits)
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

    def reconstruct(self, pt: torch.Tensor, qt: torch.Tensor) -> torch.Tensor:
        out = empty_output(pt.shape[1] * qt.shape[1]).view(pt.shape[1], qt.shape[1])
        lowrank.reconstruct_into(pt, qt, out)
        return out

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

    def matrix(self, gradient: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        if residual is None:
            return gradient.clone(memory_format=torch.contiguous_format)
        return torch.add(gradient, residual)

    def gradient(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach().to(torch.float32)

    def project(self, matrix: torch.Tensor, qt: torch.Tensor) -> torch.Tensor:
        return lowrank_torch.project(matrix, qt)

    def matrix_projected(
        self, gradient: torch.Tensor, residual: torch.Tensor | None, qt: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        matrix = self.matrix(gradient, residual)
        return matrix, self.project(matrix, qt)

    def orthonormalized(self, pt: torch.Tensor) -> torch.Tensor:
        return lowrank_torch.orthonormalized(pt.to(torch.float32))

    def back_project(self, matrix: torch.Tensor, pt: torch.Tensor) -> torch.Tensor:
        return lowrank_torch.back_project(matrix, pt)

    def reconstruct(self, pt: torch.Tensor, qt: torch.Tensor) -> torch.Tensor:
        return lowrank_torch.reconstruct(pt, qt)

    def reconstructed(
        self,
        pt: torch.Tensor,
        qt: torch.Tensor,
        matrix: torch.Tensor,
        subtract: bool,
        room: torch.Tensor | None = None,
    ) -> torch.Tensor:
        approximation = self.reconstruct(pt, qt)
        if subtract:
            matrix.sub_(approximation)
        if room is not None:
            return room.view(approximation.shape).copy_(approximation)
        return approximation


HOST_OPS = HostOps()
DEVICE_OPS = DeviceOps()


def lowrank_ops(tensors: Sequence[torch.Tensor]) -> LowRankOps:
    """The device ops when any of ``tensors`` takes the device path
    (:func:`~gradzip.device.mode.device_path`: not on the CPU, or forced), else the host
    kernels. [CHOICE] One choice per group: a bucket's tensors share a device in practice."""
    return DEVICE_OPS if any(device_path(t) for t in tensors) else HOST_OPS
