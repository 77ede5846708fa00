"""``gradzip reproduce dqsg-fig4`` and ``dqsg-table3``: the reports hold the paper's numbers
beside ours; table 3 without a user-supplied CIFAR-10 fails with one line and leaves nothing."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from gradzip.cli import main
from gradzip.data.datasets import DatasetUnavailableError
from gradzip_lab.reproduce.dqsg import fig4, table3
from gradzip_lab.reproduce.user_data import CIFAR10_ENV, CIFAR10_FILES


def _write_cifar(root: Path, per_file: int = 64) -> Path:
    """A tiny random CIFAR-10 python version under ``root/cifar-10-batches-py``; ``root``."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in CIFAR10_FILES:
        batch = {
            b"batch_label": name.encode(),
            b"data": rng.integers(0, 256, (per_file, 3072), dtype=np.uint8),
            b"labels": [int(v) for v in rng.integers(0, 10, per_file)],
        }
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
    return root


def _result(out: Path, experiment: str) -> tuple[str, dict[str, object]]:
    directory = out / experiment
    report = (directory / "report.md").read_text()
    result = json.loads((directory / "result.json").read_text())
    assert result["id"] == experiment and result["quick"] is True
    return report, result


def test_table3_without_cifar10_fails_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(CIFAR10_ENV, raising=False)
    out = tmp_path / "new" / "reports"
    assert main(["reproduce", "dqsg-table3", "--quick", "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("gradzip reproduce: ")
    assert "GRADZIP_CIFAR10_DIR=DIR" in err[0] and "cifar-10-batches-py" in err[0]
    assert not (tmp_path / "new").exists()  # every directory the call made is gone


def test_table3_with_empty_cifar10_dir_keeps_existing_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(CIFAR10_ENV, str(tmp_path / "nothing-here"))
    (tmp_path / "other.txt").write_text("kept")
    assert main(["reproduce", "dqsg-table3", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "none found under" in err and "GRADZIP_CIFAR10_DIR" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.txt"]


def test_cifar10_dir_accepts_the_folder_or_its_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _write_cifar(tmp_path, per_file=2)
    for where in (root, root / "cifar-10-batches-py"):
        monkeypatch.setenv(CIFAR10_ENV, str(where))
        assert table3.cifar10_dir() == str(where)
    monkeypatch.setenv(CIFAR10_ENV, "  ")
    with pytest.raises(DatasetUnavailableError, match="GRADZIP_CIFAR10_DIR"):
        table3.cifar10_dir()


def test_fig4_rows_check_the_claims(tmp_path: Path) -> None:
    panel = fig4.Panel("fc-sgd", "FC-300-100", "fc-300-100", "sgd", (87.5, 90), (1, 4), 10)
    acc = {label: {1: 90.0, 4: 89.0} for label, *_ in fig4.METHODS}
    acc["DQSG"] = {1: 89.5, 4: 87.0}
    acc["One-bit"] = {1: 80.0, 4: 85.0}
    rows = {r.quantity: r for r in fig4.panel_rows(panel, acc)}
    assert rows["FC-300-100, SGD: DQSG at 4 workers"].ours == 87.0
    gap = rows["FC-300-100, SGD: DQSG minus baseline, largest gap over worker counts"]
    assert gap.paper == 0.0 and gap.ours == pytest.approx(-2.0)
    assert rows[
        "FC-300-100, SGD: DQSG minus One-bit, smallest over worker counts (paper: far above)"
    ].ours == pytest.approx(2.0)
    low = rows["FC-300-100, SGD: lowest accuracy (paper: bottom of the axis)"]
    high = rows["FC-300-100, SGD: highest accuracy (paper: top of the axis)"]
    assert (low.paper, low.ours, high.paper, high.ours) == (87.5, 80.0, 90.0, 90.0)
    fig4.plot_panel(panel, acc, tmp_path / "panel.png")
    assert (tmp_path / "panel.png").read_bytes()[:4] == b"\x89PNG"


def test_fig4_full_mode_covers_the_four_panels() -> None:
    full = fig4.panels(quick=False)
    assert [p.key for p in full] == ["fc-adam", "fc-sgd", "lenet-adam", "lenet-sgd"]
    assert all(max(p.workers) == 64 for p in full)
    assert [p.key for p in fig4.panels(quick=True)] == ["fc-adam"]


@pytest.mark.slow
def test_table3_quick_with_synthetic_cifar10(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CIFAR10_ENV, str(_write_cifar(tmp_path / "data")))
    out = tmp_path / "out"
    assert main(["reproduce", "dqsg-table3", "--quick", "--out", str(out)]) == 0
    report, result = _result(out, "dqsg-table3")
    for paper in ("68.20", "65.60", "64.10", "64.70", "49.60", "47.80", "-18.60"):
        assert paper in report
    measured = result["measured"]
    assert isinstance(measured, dict) and len(measured) == 10
    for run in measured.values():
        # 320 synthetic training images: one total batch of 256 per epoch, so one iteration
        assert run["steps"] == 1 and 0.0 <= run["test_acc"] <= 1.0


@pytest.mark.slow
def test_fig4_quick(tmp_path: Path) -> None:
    assert main(["reproduce", "dqsg-fig4", "--quick", "--out", str(tmp_path)]) == 0
    report, result = _result(tmp_path, "dqsg-fig4")
    assert "84.00" in report and "98.00" in report
    assert "FC-300-100, Adam: DQSG minus baseline, largest gap over worker counts" in report
    assert result["plots"] == ["fig4-fc-adam.png"]
    assert (tmp_path / "dqsg-fig4" / "fig4-fc-adam.png").stat().st_size > 0
    accuracy = result["accuracy"]
    assert isinstance(accuracy, dict)
    assert set(accuracy["fc-adam"]) == {"Baseline", "DQSG", "QSG", "TernGrad", "One-bit"}
    for per_workers in accuracy["fc-adam"].values():
        assert set(per_workers) == {"1", "4"}
        assert all(10.0 < v <= 100.0 for v in per_workers.values())
