"""The cached feature network of the Fréchet distance is a verified state file: an intact cache
is used as saved, a damaged one is refused (never silently used), and left as it was."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
import torch

from gradzip import state_file
from gradzip.data.datasets import Dataset
from gradzip.errors import CheckpointError
from gradzip_lab.reproduce.dqgan.mnist_features import FeatureNet, cached_feature_net

#: a cache hit never looks at the data
NO_DATA = cast(Dataset, None)


def cache(tmp_path: Path) -> tuple[Path, FeatureNet]:
    net = FeatureNet(torch.Generator().manual_seed(5))
    path = tmp_path / "mnist_featurenet_n100_e1.pt"
    state_file.write(path, {"weights": net.state_dict(), "test_acc": 0.25})
    return path, net


def test_an_intact_cache_is_used_as_saved(tmp_path: Path) -> None:
    _, saved = cache(tmp_path)
    net, acc = cached_feature_net(tmp_path, NO_DATA, train_images=100)
    assert acc == 0.25
    mine, theirs = net.state_dict(), saved.state_dict()
    assert mine.keys() == theirs.keys()
    for name in mine:
        assert torch.equal(mine[name], theirs[name]), name


def test_a_damaged_cache_is_refused_and_left_alone(tmp_path: Path) -> None:
    path, _ = cache(tmp_path)
    data = bytearray(path.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 16):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"digest does not match.*delete it") as refused:
        cached_feature_net(tmp_path, NO_DATA, train_images=100)
    assert str(path) in str(refused.value)
    assert path.read_bytes() == bytes(data)
