"""The CIFAR ResNets of He et al. (2016, section 4.2) that the QESGD paper trains: ResNet-20 and
ResNet-56 (``6n + 2`` layers, ``n = 3`` and ``9``).

A 3x3 convolution with 16 filters, then three stages of ``n`` basic blocks (two 3x3
convolutions, each followed by batch normalisation, ReLU after the first and after the sum) with
16, 32 and 64 filters, the second and third stages starting with stride 2, then global average
pooling and a 10-way linear layer. Shortcuts are "option A": the identity, and where the shape
changes a stride-2 subsampling padded with zero channels, so they add no parameters. Parameter
counts: ResNet-20 269,722 and ResNet-56 853,018 for 3-channel input (the paper's Table 2 says
0.85M for ResNet-56); ``in_channels=1`` (Fashion-MNIST, 28x28) takes 288 fewer.

Initialisation [CHOICE, the seed does not say; He et al.'s "MSRA" fill]: convolution weights
normal with sd ``sqrt(2 / fan_in)``, batch-norm scale 1 and shift 0, the linear layer uniform in
``+-1/sqrt(64)`` and bias 0, every draw from one ``torch.Generator`` (the global RNG is never
touched). Batch normalisation keeps running statistics (buffers); the QESGD algorithms never
quantize them (spec 2.2 [CHOICE]).

References: He, Zhang, Ren & Sun, "Deep Residual Learning for Image Recognition" (CVPR 2016),
section 4.2; the QESGD paper, section 5 and Table 2.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F  # noqa: N812 (the conventional alias)
from torch import nn

#: depth -> blocks per stage (``depth = 6n + 2``)
DEPTHS = {8: 1, 20: 3, 32: 5, 44: 7, 56: 9}


class BasicBlock(nn.Module):
    """conv-BN-ReLU-conv-BN plus the option-A shortcut, then ReLU."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.stride, self.pad = stride, cout - cin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x
        if self.stride != 1 or self.pad:
            shortcut = x[:, :, :: self.stride, :: self.stride]
            half = self.pad // 2
            shortcut = F.pad(shortcut, (0, 0, 0, 0, half, self.pad - half))
        return F.relu(out + shortcut)


class CifarResNet(nn.Module):
    """ResNet-``depth`` for 10 classes; ``in_channels`` 3 (CIFAR-10) or 1 (Fashion-MNIST)."""

    def __init__(self, depth: int = 20, in_channels: int = 3, num_classes: int = 10) -> None:
        super().__init__()
        if depth not in DEPTHS:
            raise ValueError(f"ResNet depth must be one of {sorted(DEPTHS)} (6n + 2), got {depth}")
        n = DEPTHS[depth]
        self.conv = nn.Conv2d(in_channels, 16, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        blocks: list[nn.Module] = []
        cin = 16
        for stage, cout in enumerate((16, 32, 64)):
            for i in range(n):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(BasicBlock(cin, cout, stride))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn(self.conv(x)))
        x = self.blocks(x)
        logits: torch.Tensor = self.fc(x.mean(dim=(2, 3)))
        return logits

    def reset_parameters(self, generator: torch.Generator) -> None:
        """He et al.'s initialisation, every draw from ``generator``."""
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Conv2d):
                    fan_in = module.in_channels * module.kernel_size[0] * module.kernel_size[1]
                    module.weight.normal_(0.0, math.sqrt(2.0 / fan_in), generator=generator)
                elif isinstance(module, nn.BatchNorm2d):
                    module.weight.fill_(1.0)
                    module.bias.zero_()
                    module.reset_running_stats()
                elif isinstance(module, nn.Linear):
                    bound = 1.0 / math.sqrt(module.in_features)
                    module.weight.uniform_(-bound, bound, generator=generator)
                    module.bias.zero_()


def resnet(depth: int, in_channels: int = 3, seed: int = 0) -> CifarResNet:
    """A freshly initialised ResNet-``depth`` (draws from ``torch.Generator().manual_seed(seed)``)."""
    model = CifarResNet(depth, in_channels)
    model.reset_parameters(torch.Generator().manual_seed(seed))
    return model
