"""The integer-sum schemes' step on the gradient's device (:class:`~gradzip.schemes.
_grid_scheme.GridScheme` with a :class:`~gradzip.schemes._device_grid.DeviceGrid`).

The host path's steps in the same order, with the device twins of the grid and of the
messages, so every rank's result equals the host path's bit for bit:

1. ``x = prepare(v)`` and its finiteness flag; the statistic's MAX over ranks from device
   messages (:meth:`~gradzip.schemes._grid_scheme.GridScheme._agree_device`);
2. **host read 1**: the finiteness flag and the scale messages' flags together. [CHOICE] The
   host path refuses non-finite input before sending; here the scale message is sent first
   (a NaN scale, which every receiver refuses by name) and the refusal comes one collective
   later, so the read waits for data the step needs anyway. Read before the symbols, so error
   feedback keeps its residual when the step is refused, as on the host;
3. the symbols, their ring sum with device messages, the mean;
4. **host read 2**: the ring messages' flags, before the mean is returned.

Two host reads per call of a few bytes each (plus, only when a check fails, the failing
message, read back to raise the host parser's precise error).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from gradzip.comm.transport import Transport
from gradzip.device.ops import on_device
from gradzip.errors import NonFiniteInputError
from gradzip.feedback import working_dtype
from gradzip.schemes._device_grid import DeviceGrid, net_levels_device, values_device
from gradzip.schemes._device_messages import Checks

if TYPE_CHECKING:
    from gradzip.keys import StreamKey

#: as in gradzip.schemes._grid_scheme: float32 holds every integer up to this exactly
_FLOAT32_EXACT = 2**24


def decode_sum_device(
    scheme: Any,  # a GridScheme (not imported: it imports this module)
    grid: DeviceGrid,
    sums: torch.Tensor,
    scales: torch.Tensor,
    keys: list[StreamKey],
) -> torch.Tensor:
    """:meth:`~gradzip.schemes._grid_scheme.GridScheme._decode_sum` (for ``len(keys)`` ranks,
    or one rank's own contribution) on the device."""
    s = scheme.grid.grid_levels()
    wide = 2 * s * len(keys) > _FLOAT32_EXACT
    levels = net_levels_device(grid, sums, keys, s, wide)
    bucket_size = scheme.grid.grid_bucket_size(sums.numel())
    return values_device(grid, levels, scales, len(keys), bucket_size)


def reduce_on_device(
    scheme: Any,  # a GridScheme (not imported: it imports this module)
    grid: DeviceGrid,
    transport: Transport,
    tensor: torch.Tensor,
    step: int,
    tensor_index: int,
) -> torch.Tensor:
    """:meth:`~gradzip.schemes._grid_scheme.GridScheme.reduce` on ``tensor``'s device (see the
    module); returns the mean there."""
    device = tensor.device
    work = working_dtype(tensor.dtype)
    if tensor.numel() == 0:
        return torch.zeros(tensor.shape, dtype=work, device=device)
    own_key = scheme.key(transport.rank, step, tensor_index)
    feedback = scheme.feedback.get("worker")
    checks = Checks(device)

    def quantize(v: torch.Tensor) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        x = grid.prepare(on_device(v.detach().reshape(-1), device).to(torch.float32))
        finite = torch.isfinite(x).all()
        statistic = grid.statistic(x)
        scales = scheme._agree_device(transport, statistic, step, tensor_index, checks)
        if not checks.verify(finite):
            raise NonFiniteInputError(
                f"{scheme.compressor.name}: cannot encode a tensor holding NaN or Inf; nothing "
                "was updated"
            )
        symbols = grid.symbols(x, scales, own_key)
        own = torch.empty(0)
        if feedback is not None:
            own = decode_sum_device(scheme, grid, symbols, scales, [own_key])
            own = on_device(own.view(v.shape), v.device).to(v.dtype)
        return (symbols, scales), own

    if feedback is not None:
        symbols, scales = feedback.compensate(tensor, own_key, quantize)
    else:
        (symbols, scales), _ = quantize(tensor)
    mean: torch.Tensor = scheme._mean_device(
        grid, transport, symbols, scales, step, tensor_index, checks
    )
    checks.verify()
    return mean.view(tensor.shape).to(work)
