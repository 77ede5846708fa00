"""docs/performance.md and the README's summary equal what tools/performance_page.py generates
from the stored results in benchmarks/results/, and each stored result says where it came from."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "performance_page", ROOT / "tools" / "performance_page.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("page", ["docs/performance.md", "README.md"])
def test_the_committed_page_is_what_the_stored_results_give(page: str) -> None:
    text = (ROOT / page).read_text()
    assert "<!-- performance:summary -->" in text
    assert generator().render_page(text, RESULTS) == text, "stale: run `make performance-docs`"


def test_every_stored_result_is_on_the_page_and_says_where_it_came_from() -> None:
    page = (ROOT / "docs" / "performance.md").read_text()
    shown = set(re.findall(r"<!-- performance:([a-z0-9-]+)", page))
    manifest = json.loads((RESULTS / "manifest.json").read_text())
    for path in sorted(RESULTS.glob("cluster-*.json")):
        assert path.stem in shown, f"{path.name} is stored but not on docs/performance.md"
        result = json.loads(path.read_text())
        entry = manifest["files"].get(path.name, {})
        assert "command" in result or entry.get("command", "").startswith("gradzip bench cluster")
        assert "machine" in result or entry.get("machine") in manifest["machines"]


def test_headline_figures_come_from_isolated_rows_and_are_derived_from_them() -> None:
    page = generator()
    result = {
        "runs": [
            {"model": "mlp-4096", "world_size": 2, "rate": "100mbit", "variant": v, "mode": m,
             "step_ms": t, "bytes_sent_per_rank": b, "loss_last": 1.0}
            for v, m, t, b in [
                ("powersgd_r1", "isolated", 500.0, 200.0), ("gradzip:fp16+ef:powersgd[r1]", "isolated", 400.0, 100.0),
                ("powersgd_r1", "interleaved", 900.0, 200.0), ("gradzip:fp16+ef:powersgd[r1]", "interleaved", 300.0, 100.0),
            ]
        ]
    }  # fmt: skip
    gz = page.find(result, "gradzip:fp16+ef:powersgd[r1]", "100mbit")
    assert gz["step_ms"] == 400.0  # the isolated row, not the interleaved one
    table = page.render_both({**result, "baseline": "powersgd_r1"})
    assert "| 400 | 1.25 | 300 | 3.00 |" in table  # isolated 500/400, interleaved labelled beside


def test_the_model_size_behind_nanoseconds_per_coordinate() -> None:
    from gradzip.models.paper import build_model

    model = build_model("dryden-mlp", 0)
    assert sum(p.numel() for p in model.parameters()) == generator().MODEL_NUMEL["mlp-4096"]


def test_a_new_stored_result_appears_on_the_page_without_editing_it(tmp_path: Path) -> None:
    # a later run only adds its file (which records its own command and machine)
    (tmp_path / "manifest.json").write_text(json.dumps({"machines": {}, "files": {}}))
    result = json.loads((RESULTS / "cluster-powersgd-p4.json").read_text())
    result["command"] = "gradzip bench cluster --world-sizes 4 --rates 100mbit"
    result["machine"] = {"cpu": "Some CPU", "cpu_count": 8, "torch": "2.13.0", "date": "2027-01-01"}
    (tmp_path / "cluster-new-p4.json").write_text(json.dumps(result))
    page = "intro\n<!-- performance:others -->\n<!-- /performance -->\n"
    text = generator().render_page(page, tmp_path)
    assert "### `cluster-new-p4`" in text and "| 1,006 / 0.27 | 1.00 |" in text
    assert "`gradzip bench cluster --world-sizes 4 --rates 100mbit`" in text
    assert "8 CPUs, Some CPU, torch 2.13.0; 2027-01-01" in text


def test_a_world_size_view_shows_only_that_world_sizes_rows(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps({"machines": {}, "files": {}}))
    runs = [
        {"model": "mlp-4096", "world_size": p, "rate": "100mbit", "variant": v, "mode": "isolated",
         "step_ms": t, "bytes_sent_per_rank": 1e5, "loss_last": 1.0}
        for p, v, t in [(2, "powersgd_r1", 600.0), (2, "gradzip:bf16+ef:powersgd[r1,start2]", 400.0),
                        (4, "powersgd_r1", 1200.0), (4, "gradzip:bf16+ef:powersgd[r1,start2]", 1000.0)]
    ]  # fmt: skip
    result = {"runs": runs, "baseline": "powersgd_r1", "command": "gradzip bench cluster"}
    (tmp_path / "cluster-both.json").write_text(json.dumps(result))
    page = generator()
    p4 = page.render_block("cluster-both", "p4", tmp_path)
    assert "| 1,000 / 0.1 | 1.20 |" in p4 and "400" not in p4 and "(P = 4;" in p4
    assert "| 400 / 0.1 | 1.50 |" in page.render_block("cluster-both", "p2", tmp_path)
    with pytest.raises(SystemExit, match="no rows at p8"):
        page.render_block("cluster-both", "p8", tmp_path)


def test_a_file_of_several_world_sizes_gets_a_table_each(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps({"machines": {}, "files": {}}))
    runs = [
        {"model": "mlp-4096", "world_size": p, "rate": "1gbit", "variant": "none",
         "mode": "isolated", "step_ms": t, "bytes_sent_per_rank": 0.0, "loss_last": 1.0}
        for p, t in [(2, 396.0), (8, 1286.0)]
    ]  # fmt: skip
    (tmp_path / "cluster-compute.json").write_text(json.dumps({"runs": runs}))
    text = generator().render_block("cluster-compute", None, tmp_path)
    assert text.index("P = 2:") < text.index("| 396 / 0 |") < text.index("P = 8:")
    assert text.index("P = 8:") < text.index("| 1,286 / 0 |")


def test_a_file_that_ran_only_interleaved_shows_those_rows(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps({"machines": {}, "files": {}}))
    runs = [
        {"model": "mlp-4096", "world_size": 2, "rate": "100mbit", "variant": v,
         "mode": "interleaved", "step_ms": t, "bytes_sent_per_rank": 1e5, "loss_last": 1.0}
        for v, t in [("powersgd_r1", 600.0), ("gradzip:bf16+ef:powersgd[r1,start2]", 400.0)]
    ]  # fmt: skip
    result = {"runs": runs, "baseline": "powersgd_r1", "mode": "interleaved",
              "command": "gradzip bench cluster --mode interleaved"}  # fmt: skip
    (tmp_path / "cluster-mixed.json").write_text(json.dumps(result))
    block = generator().render_block("cluster-mixed", None, tmp_path)
    assert "| 400 / 0.1 | 1.50 |" in block  # not an empty table: the file has no isolated rows
