"""Fit a data set's images to a model's input: the paper's CifarNet trains on 24x24 crops of
the 32x32 CIFAR-10 images (random crop and left-right flip per training image, the central
crop for the test images), as in the TensorFlow CIFAR-10 tutorial the DQSG authors built on.

The tutorial's per-image standardisation and brightness/contrast jitter are not applied
[CHOICE]: the images stay in ``[0, 1]`` like the MNIST ones.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

import torch

from gradzip.data.datasets import Dataset, center_crop, random_crop_flip
from gradzip.experiments.config import ConfigError


class InputFit:
    """How training batches and test images are cut to ``input_shape`` (``(C, H, W)``)."""

    def __init__(self, data: Dataset, input_shape: tuple[int, ...], model: str, seed: int) -> None:
        c, h, w = data.image_shape
        mc, mh, mw = input_shape
        if c != mc or h < mh or w < mw or mh != mw:
            raise ConfigError(
                f"model {model} takes {mc}x{mh}x{mw} inputs but {data.name} images are "
                f"{c}x{h}x{w}; choose a model for this dataset (`gradzip list models`)"
            )
        self.size = mh if (h, w) != (mh, mw) else None
        self.seed = seed

    def test_set(self, data: Dataset, limit: int | None = None) -> Dataset:
        """``data`` with its test set cut to the first ``limit`` images (all if None) and
        centre-cropped to the model's input (unchanged when neither applies)."""
        if self.size is None and limit is None:
            return data
        test_x, test_y = data.test_x[:limit], data.test_y[:limit]
        if self.size is not None:
            test_x = center_crop(test_x, self.size).contiguous()
        return replace(data, test_x=test_x, test_y=test_y)

    def train_batch(self, images: torch.Tensor, step: int) -> torch.Tensor:
        """A training batch ``(workers, B/P, C, H, W)`` cut to the model's input: random crops
        and flips drawn from ``(seed, step)`` alone, so every backend and every shard draws the
        same ones whatever the process layout."""
        if self.size is None:
            return images
        lead = images.shape[:2]
        digest = hashlib.sha256(f"crop:{self.seed}:{step}".encode()).digest()
        generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
        cropped = random_crop_flip(images.flatten(0, 1), generator, self.size)
        return cropped.reshape(*lead, *cropped.shape[1:])
