"""What the ranks of ``test_accelerate.py`` run: a tiny model trained through an
``Accelerator`` on the CPU, with gradzip's hook attached after ``prepare()`` or without it.

A module of its own, imported by the tests only when they run, so that collecting the suite
does not import Accelerate; without ``accelerate`` installed the tests fail here.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

import gradzip
from gradzip.comm.transport import Transport
from gradzip.integrations.accelerate import attach_gradzip_hook
from gradzip.schemes import make_scheme

STEPS = 3
RUN_SEED = 5


def model() -> torch.nn.Module:
    """Two linear layers with fixed weights (the same on every rank)."""
    gen = torch.Generator().manual_seed(2)
    net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return net


def flat(module: torch.nn.Module) -> bytes:
    return b"".join(p.detach().numpy().tobytes() for p in module.parameters())


def train(accelerator: Accelerator, hooked: bool) -> dict[str, Any]:
    """``STEPS`` SGD steps on 64 samples (``prepare`` gives each rank its own shard)."""
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(64, 6, generator=gen)
    loader = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True).sin()), batch_size=8)
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    prepared, opt, loader = accelerator.prepare(net, opt, loader)
    state = None
    if hooked:
        scheme = make_scheme("allgather", gradzip.create("dqsg", M=1), run_seed=RUN_SEED)
        state = attach_gradzip_hook(accelerator, prepared, scheme)
    batches = iter(loader)
    for _ in range(STEPS):
        x, y = next(batches)
        opt.zero_grad()
        accelerator.backward(torch.nn.functional.mse_loss(prepared(x), y))
        opt.step()
    out: dict[str, Any] = {"params": flat(net)}
    if state is not None:
        out["hook_steps"] = state.step
        out["bytes_sent_per_step"] = [state.transport.meter.total(s).sent for s in range(STEPS)]
        state.close()
    return out


def accelerate_rank(transport: Transport) -> dict[str, Any]:
    """Train with gradzip's hook, then a fresh model with DDP's own all-reduce."""
    # what `accelerate launch` / torchrun set; the Accelerator uses the existing process group
    os.environ.update(
        RANK=str(transport.rank),
        LOCAL_RANK=str(transport.rank),
        WORLD_SIZE=str(transport.world_size),
        LOCAL_WORLD_SIZE=str(transport.world_size),
        OMP_NUM_THREADS="1",
    )
    accelerator = Accelerator(cpu=True)
    return {
        "initial": flat(model()),
        "distributed_type": str(accelerator.distributed_type),
        "gradzip": train(accelerator, hooked=True),
        "plain": train(accelerator, hooked=False),
    }
