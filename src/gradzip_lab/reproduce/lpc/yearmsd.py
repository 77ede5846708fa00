"""YearPredictionMSD (the paper's Table 2 regression data set) from a file the user supplies.

The data set cannot be downloaded here. Point the environment variable ``GRADZIP_YEARMSD_FILE``
at the UCI file ``YearPredictionMSD.txt`` (comma-separated, 515,345 rows: the year, then 90
timbre features), plain or compressed as ``.gz``, ``.bz2`` or ``.zip`` (the UCI download).
UCI's split is kept: the first 463,715 rows are the training set, and Table 2 reports training
loss, so only those are read.

Preprocessing [CHOICE; the paper does not say]: features standardized to zero mean and unit
variance per column, targets centred (years minus their mean), both over the rows read. The
loss ``(a_i^T x - y_i)^2 / 2`` is then in squared years / 2 (the paper's 5.5-6.0 must come from
another scaling).
"""

from __future__ import annotations

import bz2
import gzip
import io
import os
import zipfile
from pathlib import Path
from typing import IO

import numpy as np
import torch

from gradzip.algorithms.svrg.problems import LeastSquares
from gradzip.data.files import DatasetFormatError, DatasetUnavailableError

YEARMSD_ENV = "GRADZIP_YEARMSD_FILE"
TRAIN_ROWS = 463_715
FEATURES = 90


def yearmsd_path() -> Path:
    """The file named by ``GRADZIP_YEARMSD_FILE``; :class:`DatasetUnavailableError` (one line:
    how to supply it) when unset or missing."""
    how = (
        "YearPredictionMSD cannot be downloaded here: set "
        f"{YEARMSD_ENV}=FILE where FILE is the UCI YearPredictionMSD.txt (or its .zip/.gz/.bz2; "
        "comma-separated: the year, then 90 features)"
    )
    value = os.environ.get(YEARMSD_ENV, "").strip()
    if not value:
        raise DatasetUnavailableError(how)
    path = Path(value).expanduser()
    if not path.is_file():
        raise DatasetUnavailableError(f"{how}; no file at {path}")
    return path


def _open_text(path: Path) -> IO[str]:
    suffix = path.suffix.lower()
    if suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="ascii")
    if suffix == ".bz2":
        return io.TextIOWrapper(bz2.open(path, "rb"), encoding="ascii")
    if suffix == ".zip":
        archive = zipfile.ZipFile(path)
        members = [m for m in archive.namelist() if not m.endswith("/")]
        if len(members) != 1:
            raise DatasetFormatError(f"{path}: expected one file in the archive, found {members}")
        return io.TextIOWrapper(archive.open(members[0]), encoding="ascii")
    return path.open(encoding="ascii")


def read_yearmsd(path: Path, rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The first ``rows`` training rows (all 463,715 when None) as float64 ``(features, years)``."""
    limit = TRAIN_ROWS if rows is None else min(rows, TRAIN_ROWS)
    if limit < 1:
        raise ValueError(f"rows must be positive, got {rows}")
    try:
        with _open_text(path) as f:
            table = np.loadtxt(f, delimiter=",", dtype=np.float64, max_rows=limit, ndmin=2)
    except (ValueError, UnicodeDecodeError, OSError, EOFError, zipfile.BadZipFile) as err:
        raise DatasetFormatError(f"{path}: not a YearPredictionMSD text file ({err})") from err
    if table.shape[0] == 0 or table.shape[1] != FEATURES + 1:
        raise DatasetFormatError(
            f"{path}: expected rows of {FEATURES + 1} comma-separated numbers (the year, then "
            f"{FEATURES} features), got shape {table.shape}"
        )
    if not np.isfinite(table).all():
        raise DatasetFormatError(f"{path}: the file holds NaN or Inf")
    return table[:, 1:], table[:, 0]


def load_yearmsd(
    path: Path | None = None, rows: int | None = None, dtype: torch.dtype = torch.float64
) -> LeastSquares:
    """The least-squares problem on YearPredictionMSD's training rows (standardized features,
    centred years); ``path`` defaults to ``$GRADZIP_YEARMSD_FILE``."""
    features, years = read_yearmsd(path if path is not None else yearmsd_path(), rows)
    std = features.std(axis=0)
    std[std == 0] = 1.0  # a constant column stays zero instead of dividing by zero
    a = (features - features.mean(axis=0)) / std
    y = years - years.mean()
    return LeastSquares(torch.from_numpy(a).to(dtype), torch.from_numpy(y).to(dtype))
