"""Deterministic weight initialisation from an explicit generator, so every rank builds the
same ``w_0`` without touching the global RNG (DQGAN checks that all ranks start equal)."""

from __future__ import annotations

import math

import torch
from torch import nn


def init_uniform_(module: nn.Module, generator: torch.Generator) -> nn.Module:
    """PyTorch's default ``Linear``/``Conv`` ranges, drawn from ``generator``: every weight and
    bias uniform in ``+-1/sqrt(fan_in)``, in ``parameters()`` order; returns ``module``."""
    with torch.no_grad():
        for layer in module.modules():
            weight = getattr(layer, "weight", None)
            if not isinstance(weight, torch.Tensor) or weight.dim() < 2:
                continue
            # weight[0].numel() is the fan-in PyTorch's own default uses for Linear, Conv and
            # ConvTranspose alike (it reads dimension 1 as the input side)
            bound = 1.0 / math.sqrt(weight[0].numel())
            for p in (weight, getattr(layer, "bias", None)):
                if isinstance(p, torch.Tensor):
                    p.copy_((torch.rand(p.shape, generator=generator) * 2 - 1) * bound)
    return module


def init_normal_(module: nn.Module, generator: torch.Generator, std: float = 0.02) -> nn.Module:
    """DCGAN's initialisation (Radford et al.): weights ``N(0, std^2)``, biases 0."""
    with torch.no_grad():
        for layer in module.modules():
            weight = getattr(layer, "weight", None)
            if not isinstance(weight, torch.Tensor) or weight.dim() < 2:
                continue
            weight.copy_(torch.randn(weight.shape, generator=generator) * std)
            bias = getattr(layer, "bias", None)
            if isinstance(bias, torch.Tensor):
                bias.zero_()
    return module
