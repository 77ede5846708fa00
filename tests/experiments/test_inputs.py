"""Images cut to the model's input: CifarNet's 24x24 crops of CIFAR-10 (random crop and flip
for training, drawn from (seed, step) only; the centre for testing), and a clear error when a
model cannot take a data set's images."""

from __future__ import annotations

import pytest
import torch

from gradzip.data.datasets import Dataset
from gradzip.experiments.config import ConfigError
from gradzip.experiments.inputs import InputFit


def _cifar_like(n_train: int = 6, n_test: int = 4) -> Dataset:
    gen = torch.Generator().manual_seed(0)
    return Dataset(
        torch.rand(n_train, 3, 32, 32, generator=gen),
        torch.zeros(n_train, dtype=torch.int64),
        torch.rand(n_test, 3, 32, 32, generator=gen),
        torch.arange(n_test),
        "cifar10",
        10,
        "test",
    )


def test_test_images_are_central_crops_and_can_be_limited() -> None:
    data = _cifar_like()
    fit = InputFit(data, (3, 24, 24), "cifarnet", seed=0)
    cut = fit.test_set(data, limit=3)
    assert cut.test_x.shape == (3, 3, 24, 24) and cut.test_x.is_contiguous()
    assert torch.equal(cut.test_x, data.test_x[:3, :, 4:28, 4:28])
    assert torch.equal(cut.test_y, data.test_y[:3])
    assert cut.train_x is data.train_x  # training images are cropped per batch, not here


def test_training_crops_depend_on_seed_and_step_only() -> None:
    data = _cifar_like()
    batch = data.train_x.reshape(2, 3, 3, 32, 32)  # (workers, B/P, C, H, W)
    fit = InputFit(data, (3, 24, 24), "cifarnet", seed=7)
    first = fit.train_batch(batch, step=5)
    assert first.shape == (2, 3, 3, 24, 24)
    assert torch.equal(first, InputFit(data, (3, 24, 24), "cifarnet", seed=7).train_batch(batch, 5))
    assert not torch.equal(first, fit.train_batch(batch, step=6))
    # every crop is a window of its own image, possibly mirrored left-right
    for image, crop in zip(batch.flatten(0, 1), first.flatten(0, 1), strict=True):
        windows = image.unfold(1, 24, 1).unfold(2, 24, 1)  # (C, 9, 9, 24, 24)
        found = any(
            torch.equal(windows[:, i, j], crop) or torch.equal(windows[:, i, j].flip(-1), crop)
            for i in range(9)
            for j in range(9)
        )
        assert found


def test_matching_inputs_pass_through_unchanged() -> None:
    data = _cifar_like()
    fit = InputFit(data, (3, 32, 32), "any", seed=0)
    batch = data.train_x.reshape(2, 3, 3, 32, 32)
    assert fit.train_batch(batch, 0) is batch
    assert fit.test_set(data) is data


@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 40, 40)])
def test_a_model_that_cannot_take_the_images_is_a_config_error(
    shape: tuple[int, int, int],
) -> None:
    with pytest.raises(ConfigError, match="choose a model for this dataset"):
        InputFit(_cifar_like(), shape, "lenet", seed=0)
