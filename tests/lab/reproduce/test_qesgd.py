"""``gradzip reproduce qesgd-*``: every id runs with --quick and writes the paper's numbers beside
ours; qesgd-table1 without a user-supplied CIFAR-10 fails in one line and leaves nothing;
qesgd-fmnist needs Debian's Fashion-MNIST (skipped without it)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from gradzip.cli import main
from gradzip.data import DEBIAN_FASHION_MNIST_DIR
from gradzip_lab.reproduce import EXPERIMENTS
from gradzip_lab.reproduce.user_data import CIFAR10_ENV, FASHION_MNIST_ENV

IDS = ("qesgd-table1", "qesgd-fmnist", "qesgd-lstm", "qesgd-table2")
HAS_FASHION_MNIST = (DEBIAN_FASHION_MNIST_DIR / "train-images-idx3-ubyte.gz").is_file()


def result(out: Path, experiment: str) -> tuple[str, dict[str, object]]:
    assert main(["reproduce", experiment, "--quick", "--out", str(out)]) == 0
    report = (out / experiment / "report.md").read_text()
    data = json.loads((out / experiment / "result.json").read_text())
    assert data["id"] == experiment and data["quick"] is True
    assert "What was scaled down" in report
    return report, data


def rows(data: dict[str, object]) -> dict[str, dict[str, object]]:
    return {r["quantity"]: r for r in data["rows"]}  # type: ignore[attr-defined,index]


def test_the_ids_are_registered() -> None:
    for experiment in IDS:
        assert experiment in EXPERIMENTS
        assert EXPERIMENTS[experiment].quick_seconds <= 60


def test_table1_without_cifar10_fails_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(CIFAR10_ENV, raising=False)
    out = tmp_path / "new"
    assert main(["reproduce", "qesgd-table1", "--quick", "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "GRADZIP_CIFAR10_DIR=DIR" in err[0] and "qesgd-fmnist" in err[0]
    assert not out.exists()
    monkeypatch.setenv(CIFAR10_ENV, str(tmp_path / "nothing"))
    assert main(["reproduce", "qesgd-table1", "--out", str(out)]) == 1
    assert "none found under" in capsys.readouterr().err and not out.exists()


def test_fmnist_without_the_debian_package_fails_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from gradzip.data import datasets

    monkeypatch.setattr(datasets, "DEBIAN_FASHION_MNIST_DIR", tmp_path / "missing")
    out = tmp_path / "new"
    assert main(["reproduce", "qesgd-fmnist", "--quick", "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "dataset-fashion-mnist" in err[0], err
    assert f"{FASHION_MNIST_ENV}=DIR" in err[0] and "missing" in err[0]
    assert not out.exists()


def test_fmnist_reads_the_directory_named_by_its_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from gradzip.data import datasets

    monkeypatch.setattr(datasets, "DEBIAN_FASHION_MNIST_DIR", tmp_path / "missing")
    monkeypatch.setenv(FASHION_MNIST_ENV, str(tmp_path / "mine"))
    out = tmp_path / "new"
    assert main(["reproduce", "qesgd-fmnist", "--quick", "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"none found in {tmp_path / 'mine'}" in err[0], err
    assert not out.exists()


def test_table2_traffic_is_measured_and_near_the_ideal_ratio(tmp_path: Path) -> None:
    report, data = result(tmp_path, "qesgd-table2")
    for paper in ("1.12", "1.31", "1.49", "1.38", "1.60"):
        assert paper in report
    measured = data["measured"]
    assert isinstance(measured, dict)
    for m in measured.values():
        d, k = m["d"], m["steps"]
        # per iteration 32d + 32d for SGD; 32d + 8d for QESGD plus 32d once per epoch; headers
        # and prefixes add well under 1%
        assert m["sgd_bits"] == pytest.approx(64 * d * k, rel=0.01)
        assert m["qesgd_bits"] == pytest.approx(40 * d * k + 32 * d, rel=0.01)
        assert m["qesgd_uplink_bits"] == pytest.approx(32 * d * k, rel=0.01)


def _tiny_cifar(root: Path, per_file: int = 24) -> Path:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"):
        batch = {
            b"data": rng.integers(0, 256, (per_file, 3072), dtype=np.uint8),
            b"labels": [int(v) for v in rng.integers(0, 10, per_file)],
        }
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
    return root


@pytest.mark.slow
def test_table1_quick_on_a_tiny_cifar10(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CIFAR10_ENV, str(_tiny_cifar(tmp_path / "data")))
    report, data = result(tmp_path / "out", "qesgd-table1")
    for paper in ("90.87", "92.61", "89.91", "91.15", "80.29", "90.64", "87.72"):
        assert paper in report
    table = rows(data)
    bits = {q: r["ours"] for q, r in table.items() if "Kbit" in q}
    d = 269_722  # ResNet-20
    assert bits["SGD (wd 0): measured Kbit per iteration"] == pytest.approx(32 * d / 1000, rel=0.01)
    assert bits["QESGD (wd 0.0001, 4 bits): measured Kbit per iteration"] == pytest.approx(
        4 * d / 1000, rel=0.01
    )


@pytest.mark.slow
@pytest.mark.skipif(not HAS_FASHION_MNIST, reason="Fashion-MNIST (Debian's package) not installed")
def test_fmnist_quick(tmp_path: Path) -> None:
    report, data = result(tmp_path, "qesgd-fmnist")
    assert "ResNet-20" in report and "92.61" in report
    assert (tmp_path / "qesgd-fmnist" / "accuracy.png").stat().st_size > 0
    table = rows(data)
    assert table["QSGD (wd 0.0001, 8 bits): measured Kbit per iteration"]["ours"] == pytest.approx(
        8 * 269_434 / 1000, rel=0.01
    )


@pytest.mark.slow
def test_lstm_quick(tmp_path: Path) -> None:
    report, data = result(tmp_path, "qesgd-lstm")
    assert "pydoc_data" in report and "TinyShakespeare" in report
    table = rows(data)
    methods = (
        "SGD (wd 0)",
        "QSGD (wd 0, 8 bits)",
        "QESGD (wd 0, 8 bits)",
        "QESGD (wd 0, 8 bits, c 10)",
    )
    for method in methods:
        value = table[f"{method}: validation bits per character"]["ours"]
        assert isinstance(value, float) and 0 < value < 8  # below log2(103) + a margin
    # the c = 10 grid spans a tenth of the c = 1 range: it clips more (fails if c is ignored)
    clipped = [table[f"{m}: coordinates clipped by the grid"]["ours"] for m in methods[2:]]
    assert clipped[1] > clipped[0]
