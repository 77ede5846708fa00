"""One bucket handed from DDP's hook call (main thread) to the worker thread."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

from gradzip.integrations._layout import BucketLayout


@dataclass
class BucketJob:
    """A bucket to reduce: its position in this backward pass, whether it is the last one, its
    flat buffer (averaged in place), its layout (``None`` when the main thread refused the
    bucket, with ``error`` saying why), the future DDP waits on, and the intra-op thread count
    of the main thread (the worker uses the same, so results cannot depend on it)."""

    position: int
    last: bool
    buffer: torch.Tensor
    layout: BucketLayout | None
    future: torch.futures.Future[torch.Tensor]
    threads: int
    error: BaseException | None = None
    #: set by the worker once the job has run; ``failure`` is then the step's error, if any
    done: threading.Event = field(default_factory=threading.Event)
    failure: BaseException | None = None
    #: what the future completes with: the bucket's buffer, or the mean where the worker did not
    #: copy it into the buffer (same dtype and device: DDP copies the result into the gradients)
    result: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.result = self.buffer
