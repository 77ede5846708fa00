"""``dqsg-table2`` trains with the DQSG authors' setting and their TernGrad (no clipping)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gradzip_lab.reproduce.dqsg import table2
from gradzip_lab.reproduce.runs import Run


def test_the_faithful_setting_is_the_authors() -> None:
    # the authors' compare_algorithms_fc.py / _lenet.py: plain gradient descent, lr 0.01 decayed
    # x0.9 per epoch, total batch 200 split over the workers (6 each at 32 workers; 192 here);
    # that run() trains with it is test_run_trains_every_cell_with_the_setting's business
    assert table2.FAITHFUL == {"optimizer": "sgd", "lr": 0.01, "lr_decay": 0.9, "batch_size": 192}


def test_terngrad_is_the_authors_unclipped_quantizer() -> None:
    columns = {label: (codec, params) for label, codec, params, _ in table2.METHODS}
    assert columns["TernGrad"] == ("terngrad", {"clip_sigma": None})


def test_run_trains_every_cell_with_the_setting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[dict[str, Any]] = []

    def fake_training(label: str, out: Path, **options: Any) -> Run:
        calls.append(options)
        rows = [{"step": 1, "entropy_bits": 1000.0, "wire_bits": 1100.0}]
        return Run(label, {"steps": 1, "test_acc": 0.1}, rows)

    monkeypatch.setattr(table2, "run_training", fake_training)
    outcome = table2.run(tmp_path, quick=True)
    assert len(calls) == len(table2.METHODS)
    for options in calls:
        assert options["workers"] == 32 and options["entropy"] is True
        assert {k: options[k] for k in table2.FAITHFUL} == table2.FAITHFUL
    assert outcome.rows[0].ours == pytest.approx(1.0)


def test_the_stored_full_run_fits_the_cells_the_docs_say() -> None:
    """docs/reproduction.md (DQSG, Table 2) says which entropy cells the full run reproduces
    within 15%: with each worker's own scale, One-Bit on both models and LeNet's DQSGD and
    QSGD; FC-300-100's ternary cells come out far above the paper (+50% or more) and LeNet's
    TernGrad below it (the paper's TernGrad exceeds its QSGD; the authors' unclipped TernGrad
    equals QSGD). A rerun that changes this must change the docs too."""
    root = Path(__file__).resolve().parents[3]
    result = json.loads((root / "docs" / "results" / "dqsg-table2-full.json").read_text())
    entropy = {
        r["quantity"].removesuffix(": entropy"): r["ours"] / r["paper"] - 1
        for r in result["rows"]
        if r["quantity"].endswith(": entropy")
    }
    fits = {cell for cell, dev in entropy.items() if abs(dev) <= 0.15}
    assert fits == {"FC-300-100 One-Bit", "LeNet DQSGD", "LeNet QSGD", "LeNet One-Bit"}
    assert all(entropy[f"FC-300-100 {m}"] > 0.5 for m in ("DQSGD", "QSGD", "TernGrad"))
    assert entropy["LeNet TernGrad"] < -0.15
    assert result["measured"]["FC-300-100 TernGrad"]["entropy_kbit"] == pytest.approx(
        result["measured"]["FC-300-100 QSGD"]["entropy_kbit"]
    )
