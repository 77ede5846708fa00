"""Where the reproductions find data sets that cannot ship with gradzip or be downloaded here.

Each is named by an environment variable, checked before anything is written, so that a missing
data set ends the experiment with one line saying how to supply it
(:class:`~gradzip.data.datasets.DatasetUnavailableError`, exit status 1) and no half-written
report directory.
"""

from __future__ import annotations

import os
from pathlib import Path

from gradzip.data import DatasetUnavailableError, datasets

#: The environment variable naming the user's CIFAR-10 directory.
CIFAR10_ENV = "GRADZIP_CIFAR10_DIR"
#: The files of the CIFAR-10 python version that must be present.
CIFAR10_FILES = (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch")
#: The environment variable naming a directory of Fashion-MNIST IDX files (optional: Debian's
#: ``dataset-fashion-mnist`` package is used without it).
FASHION_MNIST_ENV = "GRADZIP_FASHION_MNIST_DIR"


def cifar10_dir(experiment_id: str, alternative: str = "") -> str:
    """``$GRADZIP_CIFAR10_DIR``, checked to hold the batches (in it or in its
    ``cifar-10-batches-py`` folder); a one-line error saying how to supply it otherwise.
    ``alternative`` is appended to that line (an experiment that runs without CIFAR-10)."""
    how = (
        f"{experiment_id} needs CIFAR-10, which cannot be downloaded here: set "
        f"{CIFAR10_ENV}=DIR where DIR contains the extracted cifar-10-batches-py folder "
        "(data_batch_1..5, test_batch) of the CIFAR-10 python version"
    )
    if alternative:
        how = f"{how}; {alternative}"
    value = os.environ.get(CIFAR10_ENV, "").strip()
    if not value:
        raise DatasetUnavailableError(how)
    root = Path(value).expanduser()
    for folder in (root / "cifar-10-batches-py", root):
        if all((folder / name).is_file() for name in CIFAR10_FILES):
            return str(root)
    raise DatasetUnavailableError(f"{how}; none found under {root}")


def fashion_mnist_dir() -> str | None:
    """``$GRADZIP_FASHION_MNIST_DIR`` when set (a directory of the four IDX files), else None
    (Debian's package directory)."""
    value = os.environ.get(FASHION_MNIST_ENV, "").strip()
    return value or None


def fashion_mnist_hint(experiment_id: str) -> str:
    """The one line a reproduction prints when Fashion-MNIST is missing."""
    return (
        f"{experiment_id} needs Fashion-MNIST, which cannot be downloaded here: install "
        f"Debian's dataset-fashion-mnist (`make data`, or `apt-get install "
        f"dataset-fashion-mnist`; files in {datasets.DEBIAN_FASHION_MNIST_DIR}) or set "
        f"{FASHION_MNIST_ENV}=DIR where DIR holds the four IDX files "
        "(train-images-idx3-ubyte[.gz], ...)"
    )
