"""The generated tables of docs/reproduction.md: rewritten between markers from stored results,
prose untouched, idempotent, and the committed page matches the committed results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gradzip_lab.reproduce.docs import (
    collect,
    generate,
    main,
    portable,
    render_result,
    result_name,
)

ROOT = Path(__file__).resolve().parents[3]


def _result(ours: float, quick: bool = True) -> dict[str, object]:
    return {
        "id": "dqsg-fig5",
        "quick": quick,
        "seconds": 21.9,
        "rows": [
            {"quantity": "bits", "paper": 619.2, "ours": ours, "unit": "Kbit"},
            {
                "quantity": "mean",
                "paper": 521.0,
                "ours": 521.0,
                "unit": "Kbit",
                "paper_derived": "a mean of two paper values",
            },
        ],
    }


PAGE = (
    "# Title\n\nProse before.\n\n<!-- generated:dqsg-fig5:quick -->\nstale table\n"
    "<!-- /generated -->\n\nProse after.\n"
)


def _store(folder: Path, result: dict[str, object]) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / result_name(result)
    path.write_text(json.dumps(result))
    return folder


def test_the_block_between_markers_is_rewritten_and_the_prose_kept(tmp_path: Path) -> None:
    results = _store(tmp_path / "results", _result(619.24))
    page = generate(PAGE, results)
    assert page.startswith("# Title\n\nProse before.\n\n<!-- generated:dqsg-fig5:quick -->\n")
    assert page.endswith("<!-- /generated -->\n\nProse after.\n")
    assert "stale table" not in page
    assert "| 619.24 |" in page and "521.00 (derived [1])" in page
    assert "results/dqsg-fig5-quick.json" in page


def test_generating_twice_changes_nothing(tmp_path: Path) -> None:
    results = _store(tmp_path / "results", _result(619.24))
    once = generate(PAGE, results)
    assert generate(once, results) == once


def test_a_changed_result_changes_the_page(tmp_path: Path) -> None:
    results = _store(tmp_path / "results", _result(619.24))
    before = generate(PAGE, results)
    _store(results, _result(600.0))
    after = generate(before, results)
    assert after != before and "| 600.00 |" in after and "| 619.24 |" not in after


def test_a_marker_without_its_result_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"dqsg-fig5-quick\.json"):
        generate(PAGE, tmp_path)


def test_collect_names_results_by_id_and_mode(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "dqsg-fig5").mkdir(parents=True)
    (out / "dqsg-fig5" / "result.json").write_text(json.dumps(_result(1.0, quick=False)))
    assert collect(out, tmp_path / "results") == [tmp_path / "results" / "dqsg-fig5-full.json"]


def test_check_and_write(tmp_path: Path) -> None:
    results = _store(tmp_path / "results", _result(619.24))
    doc = tmp_path / "page.md"
    doc.write_text(PAGE)
    args = ["--doc", str(doc), "--results", str(results)]
    assert main([*args, "--check"]) == 1
    assert main(args) == 0
    assert main([*args, "--check"]) == 0
    assert render_result(_result(619.24), "results/dqsg-fig5-quick.json") in doc.read_text()


def test_the_reproduction_page_matches_the_stored_results() -> None:
    doc = ROOT / "docs" / "reproduction.md"
    text = doc.read_text()
    assert "<!-- generated:dqsg-fig5:quick -->" in text
    assert generate(text, ROOT / "docs" / "results") == text, (
        "docs/reproduction.md is stale: run `make reproduction-docs`"
    )


def test_a_missing_result_is_one_line_and_status_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = tmp_path / "page.md"
    doc.write_text(PAGE)
    assert main(["--doc", str(doc), "--results", str(tmp_path / "none")]) == 1
    assert "dqsg-fig5-quick.json" in capsys.readouterr().err
    assert doc.read_text() == PAGE


def test_an_entry_marker_renders_a_nested_mapping_as_tables(tmp_path: Path) -> None:
    result = {"id": "dqsg-fig4", "quick": True, "seconds": 1.0, "rows": []}
    result["accuracy"] = {"fc-adam": {"DQSG": {"16": 70.0, "4": 69.5}, "Baseline": {"4": 81.2}}}
    results = _store(tmp_path / "results", result)
    page = generate("<!-- generated:dqsg-fig4:quick:accuracy -->\n<!-- /generated -->\n", results)
    assert "| fc-adam | 4 | 16 |" in page  # worker counts in numeric order
    assert "| DQSG | 69.50 | 70.00 |" in page and "| Baseline | 81.20 | - |" in page


def test_collected_results_hold_no_machine_paths(tmp_path: Path) -> None:
    result = _result(1.0)
    result["summaries"] = {
        "run": {"run_dir": "/somewhere/runs/dqsg", "data_source": "package x 1.0 (/a/b/x.gz)"}
    }
    (tmp_path / "out" / "dqsg-fig5").mkdir(parents=True)
    (tmp_path / "out" / "dqsg-fig5" / "result.json").write_text(json.dumps(result))
    (stored,) = collect(tmp_path / "out", tmp_path / "results")
    assert json.loads(stored.read_text())["summaries"] == {"run": {"data_source": "package x 1.0"}}


def test_a_bare_absolute_path_in_a_note_is_replaced() -> None:
    note = "Data: from IDX files in /srv/data/fmnist. Rate 1/4, ratio n / P, ||w||/||v||."
    assert portable(note) == (
        "Data: from IDX files in <local directory>. Rate 1/4, ratio n / P, ||w||/||v||."
    )
    assert portable("read /a/b.gz, then /c/d") == "read <local directory>, then <local directory>"
