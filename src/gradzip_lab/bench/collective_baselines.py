"""The uncompressed yardsticks of ``gradzip bench collectives``, run with PyTorch's own
collectives: plain float32 all-reduce and DDP's ``fp16_compress_hook``.

Their bytes cannot be read from gradzip payloads (gloo moves them), so the benchmark reports
the ring all-reduce formula :func:`ring_allreduce_bytes` for them, labelled as a formula.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from gradzip.comm.transport import Transport
from gradzip_lab.bench.collective_figures import RankFigures, barrier

FP32_TIMED = "torch.distributed.all_reduce of the float32 tensor, then division by P"
FP16_TIMED = (
    "fp16_compress_hook on the GradBucket that DDP hands it during backward of a one-parameter "
    "model of n elements (cast to fp16 and divide by P, gloo all_reduce of fp16, copy back), "
    "from the hook call until its future completes"
)


def ring_allreduce_bytes(world_size: int, numel: int, element_bytes: int) -> float:
    """Bytes each rank sends (and receives) in a ring all-reduce: ``2 (P-1)/P * b * n``."""
    return 2 * (world_size - 1) / world_size * element_bytes * numel


def fp32_allreduce(transport: Transport, grads: list[torch.Tensor]) -> RankFigures:
    """Time ``all_reduce`` of each float32 gradient (the first is the warm-up)."""
    # torch.distributed is imported here only: these baselines are PyTorch's own collectives;
    # everywhere else gradzip reaches it through its transport layer alone.
    import torch.distributed as dist

    figures = RankFigures()
    for step, grad in enumerate(grads):
        tensor = grad.clone()
        barrier(transport)
        start = time.perf_counter()
        dist.all_reduce(tensor)
        tensor.div_(transport.world_size)
        if step:
            figures.seconds.append(time.perf_counter() - start)
    return figures


class _OneParameter(torch.nn.Module):
    """``loss = sum(w * g)``: its gradient with respect to ``w`` is ``g``, one bucket in DDP."""

    def __init__(self, numel: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(numel))

    def forward(self, grad: torch.Tensor) -> torch.Tensor:
        return (self.weight * grad).sum()


def ddp_fp16_hook(transport: Transport, grads: list[torch.Tensor]) -> RankFigures:
    """Time ``fp16_compress_hook`` inside a real DDP backward; also record, as extras, the whole
    DDP backward with the hook and the same backward without DDP."""
    # torch.distributed is imported here only: these baselines are PyTorch's own collectives;
    # everywhere else gradzip reaches it through its transport layer alone.
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook
    from torch.nn.parallel import DistributedDataParallel

    numel = grads[0].numel()
    model = _OneParameter(numel)
    ddp = DistributedDataParallel(model)
    in_hook = [0.0]

    def timed_hook(state: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:
        start = time.perf_counter()
        future = fp16_compress_hook(state, bucket)
        future.wait()
        in_hook[0] += time.perf_counter() - start
        return future

    # a lambda: DDP refuses hooks whose annotations are not its own classes, and under
    # postponed annotations a def's annotations are strings
    ddp.register_comm_hook(None, lambda state, bucket: timed_hook(state, bucket))
    plain = _OneParameter(numel)
    figures = RankFigures(extra_seconds={"ddp_backward": [], "plain_backward": []})
    for step, grad in enumerate(grads):
        for module, name in ((ddp, "ddp_backward"), (plain, "plain_backward")):
            model.weight.grad = plain.weight.grad = None
            in_hook[0] = 0.0
            loss = module(grad)
            barrier(transport)
            start = time.perf_counter()
            loss.backward()
            elapsed = time.perf_counter() - start
            if step:
                figures.extra_seconds[name].append(elapsed)
            if module is ddp:
                if in_hook[0] == 0.0:
                    raise RuntimeError("DDP's backward did not call the fp16 hook")
                if step:
                    figures.seconds.append(in_hook[0])
    return figures
