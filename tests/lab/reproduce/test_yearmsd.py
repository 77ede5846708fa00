"""The YearPredictionMSD driver of LPC-SVRG's Table 2 (the lab's): the UCI file, plain or
compressed, read and standardized; a missing or malformed file named in one line."""

from __future__ import annotations

import gzip
import zipfile
from pathlib import Path

import numpy as np
import pytest

from gradzip.data.files import DatasetFormatError, DatasetUnavailableError
from gradzip_lab.reproduce.lpc.yearmsd import YEARMSD_ENV, load_yearmsd, yearmsd_path


def write_yearmsd(path: Path, rows: int) -> np.ndarray:
    gen = np.random.default_rng(0)
    table = np.column_stack([gen.integers(1922, 2011, rows), gen.normal(0, 30, (rows, 90))])
    text = "\n".join(",".join(f"{v:.6f}" for v in row) for row in table) + "\n"
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode()))
    elif path.suffix == ".zip":
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("YearPredictionMSD.txt", text)
    else:
        path.write_text(text)
    return table


@pytest.mark.parametrize("name", ["YearPredictionMSD.txt", "y.txt.gz", "YearPredictionMSD.txt.zip"])
def test_yearmsd_reader(tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / name
    table = write_yearmsd(path, 40)
    monkeypatch.setenv(YEARMSD_ENV, str(path))
    problem = load_yearmsd(rows=30)
    assert (problem.n, problem.dim) == (30, 90)
    a = problem.A.numpy()
    assert np.allclose(a.mean(0), 0, atol=1e-12) and np.allclose(a.std(0), 1)
    years = table[:30, 0]
    assert np.allclose(problem.y.numpy(), years - years.mean(), atol=1e-6)


def test_yearmsd_missing_or_malformed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(YEARMSD_ENV, raising=False)
    with pytest.raises(DatasetUnavailableError, match=YEARMSD_ENV) as info:
        yearmsd_path()
    assert "\n" not in str(info.value)
    monkeypatch.setenv(YEARMSD_ENV, str(tmp_path / "nothing.txt"))
    with pytest.raises(DatasetUnavailableError, match="no file"):
        yearmsd_path()
    bad = tmp_path / "bad.txt"
    bad.write_text("2001,1.0,2.0\n")
    with pytest.raises(DatasetFormatError, match="91"):
        load_yearmsd(bad)
