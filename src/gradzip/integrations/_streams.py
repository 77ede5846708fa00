"""Which CUDA stream a bucket's work runs on in the hook's stage threads.

[CHOICE] The stage threads stay for device tensors: they no longer hide the codec's CPU time,
but they still take the host-side work off the backward pass (Python dispatch of the kernels,
the header and flag reads, which wait for the device, and the transport's waits), so the
backward pass keeps launching kernels while a bucket is encoded and on the wire. What changes
is ordering: a thread's kernels go to *its* current stream, while the bucket was written on
the stream backward ran on when DDP called the hook. So the hook records that stream with the
bucket (:func:`capture`) and every stage runs the bucket's work on it (:func:`running_on`):
the encode kernels then follow the kernels that wrote the gradients, and the mean is written
before the future completes (the future, built with the bucket's device, records its event on
that same stream). One stream per bucket in order also keeps the encode, transfer and decode
of consecutive buckets in submission order on the device, as the threads keep them on the
host. CPU buckets (the host path, and the forced device path of the tests) have no stream:
nothing changes there.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch


def capture(buffer: torch.Tensor) -> Any:
    """The current CUDA stream of ``buffer``'s device (on the calling thread), or None for a
    buffer that is not on a CUDA device."""
    if buffer.device.type != "cuda":
        return None
    return torch.cuda.current_stream(buffer.device)


def running_on(stream: Any) -> AbstractContextManager[Any]:
    """Make ``stream`` (from :func:`capture`) the current stream of the calling thread; no-op
    for None."""
    if stream is None:
        return nullcontext()
    return torch.cuda.stream(stream)
