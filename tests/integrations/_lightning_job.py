"""What the ranks of ``test_lightning.py`` run: a tiny LightningModule fitted by a Trainer on
the CPU, with ``GradzipDDPStrategy`` or Lightning's own ``DDPStrategy``.

A module of its own, imported by the tests only when they run, so that collecting the suite
does not import Lightning (seconds); without ``lightning`` installed the tests fail here.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset

import gradzip
from gradzip.comm.transport import Transport
from gradzip.integrations.lightning import GradzipDDPStrategy
from gradzip.schemes import make_scheme
from gradzip.schemes.base import Scheme

STEPS = 3
RUN_SEED = 5


def lossy_scheme() -> Scheme:
    """Coarse DQSG: its averages differ visibly from an exact all-reduce's."""
    return make_scheme("allgather", gradzip.create("dqsg", M=1), run_seed=RUN_SEED)


class TinyRegression(pl.LightningModule):
    """Two linear layers (so DDP has several parameters), SGD, MSE."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(2)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)
        )
        with torch.no_grad():
            for p in self.net.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def data() -> DataLoader[tuple[torch.Tensor, ...]]:
    """64 samples; Lightning's distributed sampler gives each rank its own half."""
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(64, 6, generator=gen)
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True).sin()), batch_size=8)


def flat(module: torch.nn.Module) -> bytes:
    return b"".join(p.detach().numpy().tobytes() for p in module.parameters())


def fit(strategy: DDPStrategy, world_size: int) -> tuple[TinyRegression, pl.Trainer]:
    """``STEPS`` optimizer steps of a fresh module on the CPU, nothing written to disk."""
    module = TinyRegression()
    with tempfile.TemporaryDirectory() as root:
        trainer = pl.Trainer(
            accelerator="cpu",
            devices=world_size,
            strategy=strategy,
            max_steps=STEPS,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=root,
        )
        trainer.fit(module, data())
    return module, trainer


def lightning_rank(transport: Transport) -> dict[str, Any]:
    """Fit with ``GradzipDDPStrategy``, then a fresh module with Lightning's ``DDPStrategy``
    (DDP's own all-reduce); the parameters, steps and the hook's counters."""
    # an externally launched job (torchrun's variables): Lightning uses the existing group
    os.environ.update(
        LOCAL_RANK=str(transport.rank),
        NODE_RANK="0",
        WORLD_SIZE=str(transport.world_size),
        OMP_NUM_THREADS="1",
    )
    out: dict[str, Any] = {"initial": flat(TinyRegression())}
    strategy = GradzipDDPStrategy(lossy_scheme(), process_group_backend="gloo")
    module, trainer = fit(strategy, transport.world_size)
    state = strategy.hook_state
    out["gradzip"] = {"params": flat(module), "optimizer_steps": trainer.global_step}
    out["hook_steps"] = state.step
    out["bytes_sent_per_step"] = [state.transport.meter.total(s).sent for s in range(STEPS)]
    state.close()
    module, trainer = fit(DDPStrategy(process_group_backend="gloo"), transport.world_size)
    out["plain"] = {"params": flat(module), "optimizer_steps": trainer.global_step}
    return out
