"""The shared report code: a derived paper value is marked and explained, never shown bare."""

from __future__ import annotations

import json
from pathlib import Path

from gradzip_lab.reproduce.outcome import Outcome, Row, format_rows, write_outcome


def test_a_stated_paper_value_is_printed_plain() -> None:
    table = format_rows([Row("bits", 619.2, 619.24, "Kbit")])
    assert "| 619.20 |" in table and "derived" not in table


def test_a_derived_paper_value_is_marked_and_footnoted_once() -> None:
    why = "mean of the paper's 619.2 and 422.8 Kbit"
    table = format_rows(
        [
            Row("mean", 521.0, 521.0, "Kbit", paper_derived=why),
            Row("stated", 422.8, 422.76, "Kbit"),
            Row("same source", 1.0, 1.0, paper_derived=why),
            Row("other", 0.0, -1.5, paper_derived="a claim in the prose"),
        ]
    )
    assert "| 521.00 (derived [1]) |" in table
    assert "| 1.00 (derived [1]) |" in table
    assert "| 0.00 (derived [2]) |" in table
    assert "| 422.80 |" in table
    assert table.count(f"- [1] {why}") == 1 and "- [2] a claim in the prose" in table


def test_no_paper_value_means_no_mark() -> None:
    assert "derived" not in format_rows([Row("ours only", None, 3.0, paper_derived="x")])


def test_the_result_file_keeps_the_explanation(tmp_path: Path) -> None:
    rows = [Row("mean", 521.0, 521.0, "Kbit", paper_derived="a mean")]
    write_outcome(Outcome("x-y", "t", True, rows, ["nothing"]), tmp_path)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["rows"][0]["paper_derived"] == "a mean"
    assert "(derived [1])" in (tmp_path / "report.md").read_text()


def test_a_norm_in_a_quantity_does_not_split_its_table_row() -> None:
    table = format_rows([Row("||w_T|| / ||w_0||", None, 0.5, "")])
    row = table.splitlines()[2]
    assert row.startswith("| \\|\\|w_T\\|\\| / \\|\\|w_0\\|\\| |")
    # the six cells of the header, counted by the unescaped separators
    assert row.replace("\\|", "").count("|") == table.splitlines()[0].count("|")
