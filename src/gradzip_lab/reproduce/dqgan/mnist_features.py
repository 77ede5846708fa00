"""A small MNIST classifier whose penultimate layer gives the features of the experiments'
Fréchet distance (the FID's Inception-v3 needs weights that cannot be fetched here).

Trained once with plain torch (Adam, one epoch) and cached as a state file with a digest
(:mod:`gradzip.state_file`) in a directory the caller names (the run's output directory, never
the repository). A cached file that fails its digest is refused, not used: a corrupted feature
network would silently change every Fréchet distance.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.nn import functional

from gradzip import state_file
from gradzip.algorithms.dqgan.init import init_uniform_
from gradzip.data.datasets import Dataset
from gradzip.errors import CheckpointError

FEATURES = 64


class FeatureNet(nn.Module):
    """``Conv5(16) - pool - Conv5(32) - pool - Linear(512, 64) - Linear(64, 10)`` with ReLU;
    :meth:`features` is the 64-d ReLU layer. Inputs: ``N x 1 x 28 x 28`` in ``[0, 1]``."""

    def __init__(self, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5)
        self.conv2 = nn.Conv2d(16, 32, 5)
        self.fc1 = nn.Linear(512, FEATURES)
        self.fc2 = nn.Linear(FEATURES, 10)
        init_uniform_(self, generator or torch.Generator().manual_seed(0))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = functional.max_pool2d(functional.relu(self.conv1(x)), 2)
        x = functional.max_pool2d(functional.relu(self.conv2(x)), 2)
        return functional.relu(self.fc1(x.flatten(1)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc2(self.features(x))
        return out


def accuracy(net: FeatureNet, images: torch.Tensor, labels: torch.Tensor) -> float:
    """Classification accuracy on ``images`` (in ``[0, 1]``)."""
    _, logits = extract(net, images)
    return int((logits.argmax(1) == labels).sum()) / max(1, len(images))


def extract(net: FeatureNet, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 64-d features and the class logits of ``images`` (``N x 1 x 28 x 28`` in
    ``[0, 1]``), from one pass in chunks of 1000."""
    net.eval()
    features, logits = [], []
    with torch.no_grad():
        for i in range(0, len(images), 1000):
            f = net.features(images[i : i + 1000])
            features.append(f)
            logits.append(net.fc2(f))
    return torch.cat(features), torch.cat(logits)


def train_feature_net(
    data: Dataset, *, train_images: int | None = None, epochs: int = 1, seed: int = 0
) -> tuple[FeatureNet, float]:
    """Train a :class:`FeatureNet` on the first ``train_images`` training images (all if
    ``None``) with Adam (lr 1e-3, batch 128); the net and its test accuracy."""
    gen = torch.Generator().manual_seed(seed)
    net = FeatureNet(gen)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    x, y = data.train_x, data.train_y
    if train_images is not None:
        x, y = x[:train_images], y[:train_images]
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=gen)
        for i in range(0, len(x), 128):
            idx = order[i : i + 128]
            opt.zero_grad()
            torch.autograd.backward(functional.cross_entropy(net(x[idx]), y[idx]))
            opt.step()
    net.eval()
    return net, accuracy(net, data.test_x, data.test_y)


def cached_feature_net(
    cache_dir: Path, data: Dataset, *, train_images: int | None = None, epochs: int = 1
) -> tuple[FeatureNet, float]:
    """:func:`train_feature_net`, or the copy cached under ``cache_dir`` by an earlier call
    with the same settings, verified against its digest (:class:`CheckpointError` if it fails:
    delete the file to train the network again)."""
    path = Path(cache_dir) / f"mnist_featurenet_n{train_images or 'all'}_e{epochs}.pt"
    if path.is_file():
        try:
            state = state_file.read(path)
        except CheckpointError as err:
            raise CheckpointError(f"{err}; delete it to train the feature network again") from err
        net = FeatureNet()
        net.load_state_dict(state["weights"])
        net.eval()
        return net, float(state["test_acc"])
    net, acc = train_feature_net(data, train_images=train_images, epochs=epochs)
    path.parent.mkdir(parents=True, exist_ok=True)
    state_file.write(path, {"weights": net.state_dict(), "test_acc": acc})
    return net, acc
