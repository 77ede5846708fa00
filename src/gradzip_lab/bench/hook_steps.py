"""One variant of ``gradzip bench hook``: its DDP model on the device, its hook, its timed steps.

Every variant trains its own copy of the model from the same seed on the same batches, wrapped in
its own ``DistributedDataParallel`` over a process group of its own (``dist.new_group``), with
its own SGD optimizer: nothing of one variant's state (PowerSGD's warm start, error-feedback
residuals, DDP's buckets) reaches the next. A step is what a user's training step is: zero_grad,
forward, cross-entropy, backward (DDP's buckets through the variant's hook) and ``opt.step()``,
timed from a synchronized device to a synchronized device.
"""

# [CHOICE] no ``from __future__ import annotations``, as in cluster_variants: a hook's
# ``bucket`` annotation must be the class GradBucket itself, not a string.
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812 (the conventional alias)
from torch.nn.parallel import DistributedDataParallel

from gradzip_lab.bench.cluster_rank import MODEL_NAMES, MODEL_SEED
from gradzip_lab.bench.cluster_variants import RUN_SEED, Variant, attach
from gradzip_lab.bench.timing import synchronize

#: the synthetic data's seed (Gaussian inputs labelled by a random linear teacher, learnable)
DATA_SEED = 17

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass
class VariantTiming:
    """One variant's timed steps."""

    name: str
    seconds: list[float]
    first_loss: float
    last_loss: float

    @property
    def median_ms(self) -> float:
        return 1000 * statistics.median(self.seconds)


def synthetic_batches(count: int, batch: int, device: torch.device) -> list[Batch]:
    """``count`` MNIST-shaped batches of Gaussian inputs labelled by a fixed random linear
    teacher, on ``device`` (made on the CPU from one seed: every device sees the same data)."""
    gen = torch.Generator().manual_seed(DATA_SEED)
    teacher = torch.randn(784, 10, generator=gen)
    out = []
    for _ in range(count):
        x = torch.randn(batch, 1, 28, 28, generator=gen)
        y = (x.flatten(1) @ teacher).argmax(1)
        out.append((x.to(device), y.to(device)))
    return out


def _attach(
    variant: Variant, ddp: DistributedDataParallel, group: dist.ProcessGroup, timeout: float
) -> Callable[[], None]:
    """Register ``variant``'s hook as ``gradzip bench cluster`` does; returns what releases it
    (a gradzip hook's stage threads are stopped, so that a run in a test process leaves none)."""
    if variant.kind != "gradzip":
        attach(variant, ddp, group, timeout)
        return lambda: None
    from gradzip.comm.distributed import DistributedTransport
    from gradzip.integrations.ddp import register_gradzip_hook

    transport = DistributedTransport(group=group, timeout=timeout)
    state = register_gradzip_hook(ddp, variant.spec.build(RUN_SEED), transport=transport)
    return state.close


def time_variant(
    variant: Variant,
    model: str,
    device: torch.device,
    data: Sequence[Batch],
    warmup: int,
    lr: float,
    timeout: float,
) -> VariantTiming:
    """Train ``variant`` on ``data`` (its first ``warmup`` batches untimed); its step times."""
    from gradzip.models.paper import build_model

    group = dist.new_group()
    net = build_model(MODEL_NAMES[model], MODEL_SEED).to(device)
    ddp = DistributedDataParallel(
        net,
        device_ids=[device] if device.type == "cuda" else None,
        process_group=group,
        gradient_as_bucket_view=True,  # one copy of the gradients, as the cluster bench
    )
    release = _attach(variant, ddp, group, timeout)
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)
    seconds: list[float] = []
    losses: list[float] = []
    try:
        for step, (x, y) in enumerate(data):
            synchronize(device)
            start = time.perf_counter()
            opt.zero_grad(set_to_none=False)
            loss = F.cross_entropy(ddp(x), y)
            torch.autograd.backward(loss)  # typed, unlike Tensor.backward
            opt.step()
            synchronize(device)
            if step >= warmup:
                seconds.append(time.perf_counter() - start)
                losses.append(float(loss.detach()))
    finally:
        release()
        dist.destroy_process_group(group)
    return VariantTiming(variant.name, seconds, losses[0], losses[-1])
