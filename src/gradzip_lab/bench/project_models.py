"""The models the scaling model and ``gradzip tune`` know by name: their parameters' shapes
and a sample batch (MNIST-sized or CIFAR-sized inputs, batch 32 as ``gradzip bench cluster``)."""

from __future__ import annotations

import torch

from gradzip.models.paper import build_model
from gradzip.models.resnet import resnet

MODEL_NAMES = ("mlp-4096", "fc-300-100", "resnet20")
BATCH = 32


def named_model(name: str, seed: int = 13) -> tuple[torch.nn.Module, torch.Tensor]:
    """The model ``name`` (one of :data:`MODEL_NAMES`) and a fixed sample batch of its inputs;
    ``ValueError`` naming the choices."""
    generator = torch.Generator().manual_seed(seed)
    if name in ("mlp-4096", "fc-300-100"):
        model = build_model("dryden-mlp" if name == "mlp-4096" else name, seed)
        return model, torch.randn(BATCH, 1, 28, 28, generator=generator)
    if name == "resnet20":
        return resnet(20, in_channels=3, seed=seed), torch.randn(
            BATCH, 3, 32, 32, generator=generator
        )
    raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODEL_NAMES)}")


def parameter_shapes(model: torch.nn.Module) -> list[torch.Size]:
    """The shapes of the parameters DDP would reduce (those that need a gradient), model order."""
    return [p.shape for p in model.parameters() if p.requires_grad]
