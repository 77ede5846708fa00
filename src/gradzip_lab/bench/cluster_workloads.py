"""The real workloads of ``gradzip bench cluster``: their models, training batches and held-out sets.

* ``resnet20``: ResNet-20 (:mod:`gradzip.models.resnet`) on Fashion-MNIST (one input channel,
  Debian's ``dataset-fashion-mnist`` files, or ``--data-dir``), or on CIFAR-10 (``--data cifar10``,
  three channels) from the extracted python batches in ``--data-dir``, which cannot be downloaded
  here (the command says so and exits 2 when they are absent). Held out: the test split.
* ``transformer-lm``: the character transformer of :mod:`gradzip.models.transformer` on the
  Python reference text the QESGD LSTM reads (:func:`gradzip.data.corpus.pydoc_corpus`), cut
  into non-overlapping 64-character windows; held out: the corpus's validation split (its last
  5%), never trained on. Metric per character: loss in nats, and top-1 accuracy of the next
  character.

Training batches [CHOICE]: a fixed permutation of the training examples (windows) drawn from
``DATA_SEED + seed``; at step ``s`` rank ``r`` takes items ``[(s P + r) B, (s P + r + 1) B)``
(repeated past the end), as the MLP workloads do, so every variant of one seed sees the same
batches. The held-out subset is the first ``heldout`` items of a permutation drawn from
:data:`HELDOUT_SEED` alone: the same for every variant and seed; rank ``r`` evaluates items
``r, r + P, ...`` (:mod:`.cluster_heldout` sums the ranks' figures).

Defaults [CHOICE, chosen so that one variant reaches the documented target in a few minutes at
P = 4 on two shared cores; docs/performance.md, "Real workloads"]: SGD with momentum 0.9;
ResNet-20 batch 32 per rank, lr 0.02 (at 0.05 its held-out accuracy rose faster at first and
then swung by several points between evaluations; at 0.02 it rose steadily to 80% at step 200);
the transformer 16 windows per rank, lr 0.1.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from gradzip.data.corpus import CharBatches, pydoc_corpus
from gradzip.data.datasets import load_dataset

#: the permutation of the held-out items, independent of the run's seed
HELDOUT_SEED = 29
CONTEXT = 64  # characters per transformer window

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class Workload:
    """A real workload's defaults (see the module docstring)."""

    name: str
    data: tuple[str, ...]  # the data it can train on, the default first
    batch: int
    lr: float
    momentum: float
    heldout: int  # items of the held-out subset evaluated
    numel: int  # parameters (for the memory plan), on the default data


WORKLOADS = {
    "resnet20": Workload("resnet20", ("fashion-mnist", "cifar10"), 32, 0.02, 0.9, 2000, 269_434),
    "transformer-lm": Workload("transformer-lm", ("pydoc",), 16, 0.1, 0.9, 256, 431_463),
}


def check_data(model: str, data: str) -> None:
    """``ValueError`` naming the data ``model`` can train on when ``data`` is not one of them."""
    if data not in WORKLOADS[model].data:
        raise ValueError(
            f"--model {model} trains on {' or '.join(WORKLOADS[model].data)}, not {data!r}"
        )


def build(model: str, data: str, seed: int) -> nn.Module:
    """The freshly initialised network of ``model`` for ``data``, its draws from ``seed``."""
    check_data(model, data)
    if model == "resnet20":
        from gradzip.models.resnet import resnet

        return resnet(20, in_channels=3 if data == "cifar10" else 1, seed=seed)
    from gradzip.models.transformer import char_transformer

    return char_transformer(len(pydoc_corpus().vocab), seed=seed, context=CONTEXT)


@functools.lru_cache(maxsize=2)  # a rank reads them twice: its batches, its held-out share
def _items(model: str, data: str, data_dir: str | None) -> tuple[Batch, Batch]:
    """(train inputs, targets), (held-out inputs, targets) of the whole data."""
    if model == "resnet20":
        images = load_dataset(data, data_dir)
        return (images.train_x, images.train_y), (images.test_x, images.test_y)
    corpus = pydoc_corpus()

    def windows(codes: torch.Tensor) -> Batch:
        stream = CharBatches(codes, 1, CONTEXT)
        return stream.x.reshape(-1, CONTEXT), stream.y.reshape(-1, CONTEXT)

    return windows(corpus.train), windows(corpus.val)


def train_batches(
    model: str,
    data: str,
    data_dir: str | None,
    seed: int,
    rank: int,
    world: int,
    batch: int,
    steps: int,
    data_seed: int,
) -> list[Batch]:
    """Rank ``rank``'s batch for each of ``steps`` steps (module docstring)."""
    (x, y), _ = _items(model, data, data_dir)
    needed = steps * world * batch
    gen = torch.Generator().manual_seed(data_seed + seed)
    order = torch.randperm(len(x), generator=gen).repeat(needed // len(x) + 1)[:needed]
    out = []
    for step in range(steps):
        start = (step * world + rank) * batch
        index = order[start : start + batch]
        out.append((x[index], y[index]))
    return out


def heldout_shard(
    model: str, data: str, data_dir: str | None, size: int, rank: int, world: int
) -> Batch:
    """Rank ``rank``'s share of the fixed held-out subset of ``size`` items (module docstring)."""
    _, (x, y) = _items(model, data, data_dir)
    if not 1 <= size <= len(x):
        raise ValueError(f"the held-out subset must hold 1..{len(x)} items, got {size}")
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(HELDOUT_SEED))
    mine = order[:size][rank::world]
    return x[mine], y[mine]
