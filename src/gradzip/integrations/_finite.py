"""The hook's own finite check of a bucket on the device path: one flag, read once.

On the host path the hook leaves the check to :func:`gradzip.stepping.reduce_all_finite`
(a sum per tensor, read back per tensor: cheap on the CPU). On the device path that would be
one read, and one stall of the device, per parameter.

[CHOICE] A bucket's gradients are one flat buffer, so the device path checks the whole buffer
in one reduction (``isfinite(...).all()``, on the device) and reads the one flag
(:func:`~gradzip.device.host_reads.host_read`, one byte). The flag covers the parameters the
scheme's first encoder would have checked itself (the host path skips scanning that one):
that encoder refuses the same NaN and Inf, so the agreed outcome is the same; it still
refuses an overflowing error-feedback sum the scan cannot see.
"""

from __future__ import annotations

import torch

from gradzip.device.host_reads import host_read


def bucket_finite(flat: torch.Tensor) -> bool:
    """Whether every value of the bucket's flat buffer is finite: one reduction on its
    device, one one-byte read."""
    if flat.numel() == 0:
        return True
    return bool(host_read(torch.isfinite(flat).all().reshape(1))[0])
