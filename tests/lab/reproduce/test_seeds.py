"""``gradzip reproduce --seeds``: one run per seed, every row's mean ± sd and the paired tests
of the designated comparisons, written so that the tables can be rebuilt from result.json."""

from __future__ import annotations

import json
import sys
import types
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import gradzip_lab.reproduce as reproduce_package
from gradzip.cli import main
from gradzip_lab.reproduce import (
    EXPERIMENTS,
    Experiment,
    reproduce,
    summarize_seeds,
)
from gradzip_lab.reproduce.docs import generate, result_name
from gradzip_lab.reproduce.outcome import Outcome, Row
from gradzip_lab.reproduce.seeds import (
    Comparison,
    SeededOutcome,
    aggregate,
    format_seeded_report,
    seeded_result,
)

FAKE = "fake-seeded"


def _fake_run(out: Path, quick: bool, seed: int = 0) -> Outcome:
    """Method B is 1.0 better than A plus a little noise; C differs from A by noise only."""
    g = torch.Generator().manual_seed(1000 + seed)
    a = 10.0 + float(torch.randn((), generator=g))
    b = a + 1.0 + 0.05 * float(torch.randn((), generator=g))
    c = a + float(torch.randn((), generator=g))
    rows = [
        Row("A: accuracy at step 5", 12.0, a, "%"),
        Row("B: accuracy at step 5", None, b, "%"),
        Row("C: accuracy at step 5", None, c, "%"),
        Row("bits per step", 32.0, 8.0, "Kbit", paper_derived="four times fewer"),
    ]
    return Outcome(FAKE, "a fake experiment", quick, rows, ["nothing"], notes=[f"seed {seed}"])


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("fake_seeded")
    module.run = _fake_run  # type: ignore[attr-defined]
    module.COMPARISONS = (  # type: ignore[attr-defined]
        Comparison("B - A", "B: accuracy", "A: accuracy", "points"),
        Comparison("C - A", "C: accuracy", "A: accuracy", "points"),
    )
    unseeded = types.ModuleType("fake_unseeded")
    unseeded.run = lambda out, quick: _fake_run(out, quick)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, f"{reproduce_package.__name__}.fake.seeded", module)
    monkeypatch.setitem(sys.modules, f"{reproduce_package.__name__}.fake.unseeded", unseeded)
    monkeypatch.setitem(EXPERIMENTS, FAKE, Experiment(FAKE, "fake", 1))
    monkeypatch.setitem(EXPERIMENTS, "fake-unseeded", Experiment("fake-unseeded", "fake", 1))


@pytest.mark.usefixtures("fake")
def test_each_seed_runs_into_its_own_directory_and_the_summary_holds_every_value(
    tmp_path: Path,
) -> None:
    seeded = reproduce(FAKE, tmp_path, quick=True, seeds=[0, 1, 2, 3, 4])
    assert isinstance(seeded, SeededOutcome)
    directory = tmp_path / FAKE
    per_seed = [json.loads((directory / f"seed-{s}" / "result.json").read_text()) for s in range(5)]
    result = json.loads((directory / "result.json").read_text())
    assert result["seeds"] == [0, 1, 2, 3, 4]
    a_row = result["rows"][0]
    assert a_row["values"] == [r["rows"][0]["ours"] for r in per_seed]
    assert len(set(a_row["values"])) == 5  # different seeds, different runs
    assert a_row["n"] == 5 and a_row["mean"] == pytest.approx(sum(a_row["values"]) / 5)
    assert result["rows"][3]["sd"] == 0.0  # a deterministic figure
    b_minus_a, c_minus_a = result["comparisons"]
    assert b_minus_a["significant"] is True and b_minus_a["p"] < 1e-4
    assert b_minus_a["ci95"][0] < 1.0 < b_minus_a["ci95"][1]
    assert c_minus_a["significant"] is False and c_minus_a["verdict"].startswith("NOT")
    assert c_minus_a["df"] == 4 and c_minus_a["test"].startswith("paired t-test")


@pytest.mark.usefixtures("fake")
def test_the_same_seed_gives_the_same_run_and_no_seeds_is_seed_0(tmp_path: Path) -> None:
    single = reproduce(FAKE, tmp_path / "single", quick=True)
    assert isinstance(single, Outcome)
    seeded = reproduce(FAKE, tmp_path / "seeded", quick=True, seeds=[0, 7])
    again = reproduce(FAKE, tmp_path / "again", quick=True, seeds=[7])
    assert isinstance(seeded, SeededOutcome) and isinstance(again, SeededOutcome)
    assert [r.ours for r in single.rows] == [r.values[0] for r in seeded.rows]
    assert [r.values[1] for r in seeded.rows] == [r.values[0] for r in again.rows]
    # the single-seed report keeps its format: no seeds, no comparisons, no seed directories
    single_result = json.loads((tmp_path / "single" / FAKE / "result.json").read_text())
    assert "seeds" not in single_result and "comparisons" not in single_result
    assert not list((tmp_path / "single" / FAKE).glob("seed-*"))


@pytest.mark.usefixtures("fake")
def test_seeds_are_refused_by_an_experiment_without_a_seed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ValueError, match="takes no seed"):
        reproduce("fake-unseeded", tmp_path, seeds=[0, 1])
    with pytest.raises(ValueError, match="distinct"):
        reproduce(FAKE, tmp_path, seeds=[1, 1])
    assert main(["reproduce", "fake-unseeded", "--seeds", "2", "--out", str(tmp_path)]) == 2
    assert "takes no seed" in capsys.readouterr().err
    assert not (tmp_path / "fake-unseeded").exists()


@pytest.mark.usefixtures("fake")
def test_cli_seeds_n_runs_seeds_0_to_n_minus_1(tmp_path: Path) -> None:
    assert main(["reproduce", FAKE, "--quick", "--seeds", "3", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / FAKE / "result.json").read_text())
    assert result["seeds"] == [0, 1, 2]
    with pytest.raises(SystemExit):
        main(["reproduce", FAKE, "--seeds", "0", "--out", str(tmp_path)])


@pytest.mark.usefixtures("fake")
def test_the_report_shows_mean_sd_n_and_the_verdicts(tmp_path: Path) -> None:
    reproduce(FAKE, tmp_path, quick=True, seeds=[0, 1, 2])
    report = (tmp_path / FAKE / "report.md").read_text()
    assert "| quantity | unit | paper | ours: mean ± sd | n | per seed |" in report
    assert "| bits per step | Kbit | 32.00 (derived [1]) | 8.00 ± 0.00 | 3 |" in report
    assert "- [1] four times fewer" in report
    assert "## Method comparisons" in report and "paired t-test" in report
    assert "| B - A | points |" in report and "NOT significant" in report
    assert "Seeds: 0, 1, 2 (n = 3)" in report and "(seed-0/" not in report  # no plots


@pytest.mark.usefixtures("fake")
def test_stored_seed_runs_are_summarized_again(tmp_path: Path) -> None:
    first = reproduce(FAKE, tmp_path, quick=True, seeds=[0, 1, 2])
    directory = tmp_path / FAKE
    (directory / "result.json").unlink()
    again = summarize_seeds(FAKE, directory)
    assert isinstance(first, SeededOutcome)
    assert seeded_result(again)["rows"] == seeded_result(first)["rows"]
    assert seeded_result(again)["comparisons"] == seeded_result(first)["comparisons"]


def test_aggregate_rejects_outcomes_with_different_rows() -> None:
    one = _fake_run(Path("."), True, 0)
    other = replace(one, rows=one.rows[:2])
    with pytest.raises(ValueError, match="rows differ"):
        aggregate([one, other], [0, 1], ())
    with pytest.raises(KeyError, match="0 rows start with"):
        aggregate([one], [0], [Comparison("x", "nothing", "A: accuracy")])


def test_the_docs_render_a_multi_seed_result(tmp_path: Path) -> None:
    outcomes = [_fake_run(Path("."), True, s) for s in (0, 1, 2)]
    comparisons = [Comparison("B - A", "B: accuracy", "A: accuracy", "points")]
    result = seeded_result(aggregate(outcomes, [0, 1, 2], comparisons))
    assert result_name(result) == f"{FAKE}-quick-seeds.json"
    (tmp_path / result_name(result)).write_text(json.dumps(result))
    page = f"text\n<!-- generated:{FAKE}:quick-seeds -->\nold\n<!-- /generated -->\n"
    fresh = generate(page, tmp_path)
    assert "ours: mean ± sd" in fresh and "| B - A | points |" in fresh
    assert f"`gradzip reproduce {FAKE} --quick --seeds 3`" in fresh and "old" not in fresh
    assert generate(fresh, tmp_path) == fresh
    assert format_seeded_report(result).startswith(f"# {FAKE}: a fake experiment")


@pytest.mark.parametrize(
    "experiment_id", ["dqsg-fig5", "qesgd-fmnist", "qesgd-lstm", "dqgan-mnist"]
)
def test_every_designated_comparison_names_rows_the_experiment_reports(
    experiment_id: str,
) -> None:
    # the stored multi-seed results hold the experiments' real rows (docs/results)
    stored = Path(__file__).parents[3] / "docs" / "results" / f"{experiment_id}-quick-seeds.json"
    result = json.loads(stored.read_text())
    experiment = EXPERIMENTS[experiment_id]
    assert experiment.takes_seed() and experiment.comparisons()
    outcome = Outcome(
        experiment_id,
        "",
        True,
        [Row(r["quantity"], r["paper"], r["values"][0], r["unit"]) for r in result["rows"]],
        [],
    )
    seeded = aggregate([outcome], [0], experiment.comparisons())
    assert len(seeded.comparisons) == len(experiment.comparisons())
    assert [c["label"] for c in result["comparisons"]] == [
        c.label for c in experiment.comparisons()
    ]


def test_fig5_s_seed_reaches_its_measurements() -> None:
    # the failure rates replay Algorithm 2 on gradients of the model initialised from the seed
    from gradzip_lab.reproduce.dqsg.nested_costs import nested_failure_rate

    seed_0 = nested_failure_rate(workers=4, batch=8, seed=0)
    assert nested_failure_rate(workers=4, batch=8, seed=0) == seed_0
    assert nested_failure_rate(workers=4, batch=8, seed=1) != seed_0


@pytest.mark.usefixtures("fake")
def test_a_comparison_naming_no_row_fails_after_the_first_seed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = sys.modules[f"{reproduce_package.__name__}.fake.seeded"]
    monkeypatch.setattr(module, "COMPARISONS", (Comparison("x", "D: accuracy", "A: accuracy"),))
    with pytest.raises(KeyError, match="0 rows start with 'D: accuracy'"):
        reproduce(FAKE, tmp_path, seeds=[0, 1, 2])
    assert (tmp_path / FAKE / "seed-0").is_dir() and not (tmp_path / FAKE / "seed-1").exists()
