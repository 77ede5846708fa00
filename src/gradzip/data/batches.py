"""Mini-batch schedules for data-parallel training, and the CifarNet crops.

:class:`EpochBatches` shuffles the training set once per epoch and splits each step's total
batch ``B`` evenly among ``P`` workers (``B / P`` samples each, so ``B`` must be divisible by
``P``): every worker sees a disjoint slice, and together the workers take exactly the samples a
single machine with batch ``B`` would. The shuffle uses its own ``torch.Generator`` seeded from
``(seed, epoch)``, never a global RNG, so any process can rebuild any epoch's schedule.

:func:`random_crop_flip` and :func:`center_crop` give the 24x24 inputs of the paper's CifarNet
(the TensorFlow CIFAR-10 tutorial model): a random crop and a random horizontal flip of each
training image, the central crop of each test image. The tutorial's random brightness, contrast
and per-image standardisation are left out on purpose, to keep the input pipeline simple.
"""

from __future__ import annotations

import torch

from gradzip.rng import text_generator

#: Side of the square crops the paper's CifarNet takes from the 32x32 CIFAR-10 images.
CIFARNET_CROP = 24


def _generator(seed: int, epoch: int) -> torch.Generator:
    return text_generator(f"epoch-batches:{seed}:{epoch}")


class EpochBatches:
    """Per-epoch shuffled index batches of ``n_samples``, each split among ``workers``.

    ``indices(e, s)`` gives step ``s`` of epoch ``e`` and ``epoch(e)`` all of them, an int64
    tensor of shape ``(steps_per_epoch, workers, total_batch // workers)`` whose row ``[s, w]``
    holds the sample indices worker ``w`` uses at step ``s``.
    ``steps_per_epoch = n_samples // total_batch``; the ``n_samples % total_batch`` samples left
    at the end of each epoch's permutation are skipped for that epoch (different ones each epoch).
    """

    def __init__(self, n_samples: int, total_batch: int, workers: int, seed: int) -> None:
        if workers < 1 or total_batch < 1:
            raise ValueError(
                f"need workers >= 1 and total_batch >= 1, got {workers}, {total_batch}"
            )
        if total_batch % workers:
            raise ValueError(
                f"the total batch {total_batch} must be divisible by the {workers} workers "
                f"(each takes total_batch / workers samples per step)"
            )
        if total_batch > n_samples:
            raise ValueError(f"total batch {total_batch} exceeds the {n_samples} samples")
        self.n_samples = n_samples
        self.total_batch = total_batch
        self.workers = workers
        self.seed = seed
        self._cached: tuple[int, torch.Tensor] | None = None

    @property
    def per_worker(self) -> int:
        """Samples each worker takes per step (``total_batch // workers``)."""
        return self.total_batch // self.workers

    @property
    def steps_per_epoch(self) -> int:
        """Full steps in one pass over the data."""
        return self.n_samples // self.total_batch

    def __len__(self) -> int:
        return self.steps_per_epoch

    def permutation(self, epoch: int) -> torch.Tensor:
        """The epoch's shuffled order of all ``n_samples`` indices (int64)."""
        return torch.randperm(self.n_samples, generator=_generator(self.seed, epoch))

    def epoch(self, epoch: int) -> torch.Tensor:
        """Indices ``(steps_per_epoch, workers, per_worker)`` for epoch ``epoch``."""
        used = self.steps_per_epoch * self.total_batch
        order = self.permutation(epoch)[:used]
        return order.view(self.steps_per_epoch, self.workers, self.per_worker)

    def indices(self, epoch: int, step: int) -> torch.Tensor:
        """Indices ``(workers, per_worker)`` for step ``step`` (``0 <= step < steps_per_epoch``)
        of epoch ``epoch``; the last epoch's schedule is kept, so a training loop pays for one
        shuffle per epoch."""
        if not 0 <= step < self.steps_per_epoch:
            raise IndexError(f"step {step} outside 0..{self.steps_per_epoch - 1}")
        if self._cached is None or self._cached[0] != epoch:
            self._cached = (epoch, self.epoch(epoch))
        return self._cached[1][step]


def random_crop_flip(
    images: torch.Tensor, generator: torch.Generator, size: int = CIFARNET_CROP
) -> torch.Tensor:
    """A random ``size`` x ``size`` crop of each image of ``(N, C, H, W)``, each mirrored
    left-right with probability 1/2; offsets and flips come from ``generator`` (on the CPU)."""
    n, c, h, w = images.shape
    if not (0 < size <= h and size <= w):
        raise ValueError(f"cannot crop {size}x{size} from {h}x{w} images")
    top = torch.randint(0, h - size + 1, (n,), generator=generator)
    left = torch.randint(0, w - size + 1, (n,), generator=generator)
    flip = torch.rand(n, generator=generator) < 0.5
    step = torch.arange(size)
    rows = top[:, None] + step  # (n, size)
    cols = torch.where(flip[:, None], left[:, None] + size - 1 - step, left[:, None] + step)
    device = images.device
    return images[
        torch.arange(n, device=device)[:, None, None, None],
        torch.arange(c, device=device)[None, :, None, None],
        rows.to(device)[:, None, :, None],
        cols.to(device)[:, None, None, :],
    ]


def center_crop(images: torch.Tensor, size: int = CIFARNET_CROP) -> torch.Tensor:
    """The central ``size`` x ``size`` crop of each image of ``(N, C, H, W)``."""
    h, w = images.shape[-2:]
    if not (0 < size <= h and size <= w):
        raise ValueError(f"cannot crop {size}x{size} from {h}x{w} images")
    top, left = (h - size) // 2, (w - size) // 2
    return images[..., top : top + size, left : left + size]
