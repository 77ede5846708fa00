"""``gradzip bench project``: the alpha-beta formulas on hand-computed cases, the winner map's
sanity at its two ends, and the validation of a stored cluster file.

Codec speeds are given (``Workload.given_speeds``), never timed here, so every figure is
deterministic; payload sizes are real encodes (deterministic too)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from gradzip_lab.bench.project_links import Link, Traffic, allgather, ring_allreduce
from gradzip_lab.bench.project_report import winner_map, winners
from gradzip_lab.bench.project_validate import compute_lookup, read_rows, validate
from gradzip_lab.bench.project_variants import Network, Workload, predict

RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results"
EXACT = 1.0  # a link without framing overhead: beta = rate / 8


def test_ring_allreduce_bytes_and_rounds_by_hand() -> None:
    # 1000 float32 values over 4 ranks: 6 rounds of 250 values, 2 * 3/4 * 4000 = 6000 bytes
    assert ring_allreduce(4000, 4) == Traffic(6, 6000)
    assert ring_allreduce(4000, 2) == Traffic(2, 4000)
    assert allgather(100, 5) == Traffic(4, 400)


def test_fp32_step_is_compute_plus_rounds_alpha_plus_bytes_over_beta() -> None:
    link = Link(alpha_s=1e-3, gbit_per_s=8.0, efficiency=EXACT)  # beta = 1e9 bytes a second
    assert link.bytes_per_s == 1e9
    work = Workload([torch.Size([1000])], compute_s=0.1)  # one bucket of 4000 bytes
    pred = predict("fp32", work, 4, Network(link, link))
    assert pred.bytes_per_rank == 6000
    assert pred.step_s == pytest.approx(0.1 + 6 * 1e-3 + 6000 / 1e9, rel=1e-12)


def test_overlap_hides_at_most_backwards_share() -> None:
    link = Link(alpha_s=0.0, gbit_per_s=8.0, efficiency=EXACT)
    work = Workload([torch.Size([250_000])], compute_s=0.3)  # 1 MB: comm 1 ms at P = 2
    hidden = predict("fp32", work, 2, Network(link, link, overlap=1.0))
    assert hidden.step_s == pytest.approx(0.3)  # 1 ms hides behind 200 ms of backward


def _workload(codec_s_per_coord: float) -> Workload:
    work = Workload([torch.Size([512, 1024]), torch.Size([512])], compute_s=0.05)
    work.given_speeds["qsgd"] = (codec_s_per_coord, codec_s_per_coord)
    return work


def test_a_fast_quantizer_wins_on_a_slow_link_and_fp32_on_a_fast_one() -> None:
    variants = ["fp32", "gradzip:qsgd:allgather"]
    fast = _workload(1e-10)  # 40 GB/s
    slow = _workload(1e-7)  # 40 MB/s
    rows = []
    for work, rate in ((fast, 1.0), (slow, 400.0)):
        link = Link(30e-6, rate)
        rows += [predict(v, work, 2, Network(link, link)) for v in variants]
    best = winners(rows)
    assert best[(1.0, 2)].variant == "gradzip:qsgd:allgather"
    assert best[(400.0, 2)].variant == "fp32"
    assert "#1: fp32" in winner_map(rows)


def test_the_all_gathers_bytes_grow_like_p_minus_one_and_the_rings_do_not() -> None:
    work = _workload(1e-9)
    link = Link(30e-6, 10.0)
    net = Network(link, link)
    gather = [predict("gradzip:qsgd:allgather", work, p, net).bytes_per_rank for p in (2, 16)]
    ring = [predict("gradzip:qsgd:ring", work, p, net).bytes_per_rank for p in (2, 16)]
    assert gather[1] == pytest.approx(15 * gather[0])  # the same payload, 15 times
    assert ring[1] < 2 * ring[0]  # 2(P-1)/P of the payload, with chunk framing


def test_hierarchical_within_one_node_is_a_fp32_ring_on_the_intra_link() -> None:
    work = Workload([torch.Size([1000])], compute_s=0.0)
    inter = Link(0.0, 1.0, efficiency=EXACT)
    intra = Link(0.0, 8.0, efficiency=EXACT)
    pred = predict("hier[4]:gradzip:qsgd:allgather", work, 4, Network(inter, intra))
    assert pred.step_s == pytest.approx(6000 / 1e9)


def test_bad_input_is_refused_naming_the_problem() -> None:
    with pytest.raises(ValueError, match="alpha"):
        Link(-1.0, 1.0)
    with pytest.raises(ValueError, match="rate"):
        Link(0.0, 0.0)
    work = Workload([torch.Size([10])], compute_s=0.0)
    link = Link(0.0, 1.0)
    with pytest.raises(ValueError, match="unknown variant"):
        predict("fp64", work, 2, Network(link, link))
    with pytest.raises(ValueError, match="world size"):
        predict("fp32", work, 1, Network(link, link))


def test_a_stored_cluster_file_parses_and_its_fp32_rows_are_predicted_within_20_percent() -> None:
    rows = read_rows(RESULTS / "cluster-default-p2.json")
    fp32 = [r for r in rows if r.variant == "fp32"]
    assert {(r.world_size, r.rate, r.bits_per_s) for r in fp32} == {
        (2, "100mbit", 100_000_000),
        (2, "1gbit", 1_000_000_000),
    }
    assert compute_lookup(rows)[("mlp-4096", 2)] == pytest.approx(
        (215.63448249980866 + 212.0) / 2, abs=1.0
    )
    from gradzip_lab.bench.project_models import named_model, parameter_shapes

    model, _ = named_model("mlp-4096")
    work = Workload(parameter_shapes(model), compute_s=0.0)
    checked, skipped = validate(fp32, {"mlp-4096": work})
    assert len(checked) == 2 and not skipped
    for c in checked:  # fp32 has no codec: bytes and the link alone
        assert abs(c.relative_error) < 0.2, c
        assert c.predicted_mb == pytest.approx(4 * 36_818_954 / 1e6)


def test_a_file_that_is_not_a_cluster_file_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "codecs.json"
    bad.write_text(json.dumps({"codecs": []}))
    with pytest.raises(ValueError, match=r"codecs\.json: not a `gradzip bench cluster"):
        read_rows(bad)


def test_alpha_beta_fit_recovers_exact_points() -> None:
    from gradzip_lab.tune_link import fit_alpha_beta

    alpha, beta = fit_alpha_beta([(b, 5e-5 + b / 1.25e8) for b in (1e6, 4e6, 16e6)])
    assert alpha == pytest.approx(5e-5, rel=1e-6)
    assert beta == pytest.approx(1.25e8, rel=1e-9)
    with pytest.raises(ValueError, match="two message sizes"):
        fit_alpha_beta([(1e6, 0.01)])
    assert math.isfinite(beta)


def test_the_figure_is_a_png_with_a_panel_a_rate(tmp_path: Path) -> None:
    from gradzip_lab.bench.project_report import speedup_figure

    work = Workload([torch.Size([1000])], compute_s=0.01)
    rows = []
    for rate in (1.0, 100.0):
        link = Link(30e-6, rate)
        rows += [predict("fp32", work, p, Network(link, link)) for p in (2, 4)]
    path = tmp_path / "speedup.png"
    speedup_figure(rows, path, "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_options_are_refused_before_anything_is_measured(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from gradzip.cli import main

    assert main(["bench", "project", "--overlap", "2"]) == 2
    assert "--overlap in [0, 1]" in capsys.readouterr().err
    assert main(["bench", "project", "--world-sizes", "1,4"]) == 2


def test_rows_of_nodes_model_the_node_links_at_the_intra_rate() -> None:
    """A P = 8 file of 4 ranks a node: its rows carry K = 4, and a hierarchical row's float32
    traffic inside a node goes over ``intra_gbit``, not the node's 100 Mbit/s link: a faster
    intra link must shorten the prediction, and fp32 (one flat ring) must not change."""
    rows = read_rows(RESULTS / "cluster-scaling-p8-nodes4.json")
    assert {r.ranks_per_node for r in rows} == {4}
    from gradzip_lab.bench.project_models import named_model, parameter_shapes

    model, _ = named_model("mlp-4096")
    work = Workload(parameter_shapes(model), compute_s=0.0)
    picked = [
        r for r in rows if r.variant in ("fp32", "gradzip:qsgd:hierarchical[ranks_per_node=4]")
    ]
    picked = [replace(r, compute_ms=1000.0) for r in picked]
    slow, _ = validate(picked, {"mlp-4096": work}, intra_gbit=0.1)
    fast, _ = validate(picked, {"mlp-4096": work}, intra_gbit=800.0)
    by_variant = {c.row.variant: c.predicted_ms for c in slow}
    for c in fast:
        if c.row.variant == "fp32":
            assert c.predicted_ms == pytest.approx(by_variant["fp32"])
        else:
            assert c.predicted_ms < by_variant[c.row.variant] / 5


def test_times_that_do_not_grow_with_bytes_give_a_lower_bound_not_an_error() -> None:
    from gradzip_lab.tune_link import fit_alpha_beta, fit_or_bound

    noisy = [(2.5e5, 4e-4), (1e6, 3e-4)]  # a loaded localhost: the larger size was faster
    with pytest.raises(ValueError, match="do not grow with bytes"):
        fit_alpha_beta(noisy)
    alpha, beta, bound = fit_or_bound(noisy)
    assert (alpha, bound) == (0.0, True)
    assert beta == pytest.approx(1e6 / 3e-4)
    exact = [(b, 5e-5 + b / 1.25e8) for b in (1e6, 4e6)]
    assert fit_or_bound(exact)[2] is False
    with pytest.raises(ValueError, match="two message sizes"):
        fit_or_bound([(1e6, 0.01)])


def test_only_each_configurations_newest_measurement_is_scored() -> None:
    """Rows of the same model, P, rate, variant and nodes measured twice: the older is listed
    as superseded, not scored (the model predicts today's code); other configurations and
    both rows of one file stay; ``newest_only=False`` scores every row."""
    from gradzip_lab.bench.project_validate import MeasuredRow, newest

    def row(source: str, variant: str, when: str, step: float) -> MeasuredRow:
        return MeasuredRow(source, "mlp-4096", 2, "1gbit", 10**9, variant, step, 200.0, 1.0, 2,
                           measured_at=when)  # fmt: skip

    old = row("a.json", "gradzip:qsgd:allgather", "2026-11-28", 900.0)
    new = row("b.json", "gradzip:qsgd:allgather", "2026-11-29T08:00:00+00:00", 400.0)
    alone = row("a.json", "fp32", "2026-11-28", 1400.0)
    twin = row("b.json", "gradzip:qsgd:allgather", "2026-11-29T08:00:00+00:00", 410.0)
    kept, superseded = newest([old, new, alone, twin])
    assert kept == [new, alone, twin]
    assert superseded == [
        "a.json: P=2 1gbit gradzip:qsgd:allgather: superseded by the measurement of "
        "2026-11-29T08:00"
    ]
    from gradzip_lab.bench.project_models import named_model, parameter_shapes

    work = Workload(parameter_shapes(named_model("mlp-4096")[0]), compute_s=0.0)
    work.given_speeds["qsgd"] = (1e-9, 1e-9)
    checked, skipped = validate([old, new, alone, twin], {"mlp-4096": work})
    assert [c.row for c in checked] == [new, alone, twin] and skipped == superseded
    every, _ = validate([old, new, alone, twin], {"mlp-4096": work}, newest_only=False)
    assert len(every) == 4


def test_a_files_date_and_cpu_come_from_its_record_or_the_manifest() -> None:
    recorded = read_rows(RESULTS / "cluster-scaling-p8-1gbit-rounds.json")
    assert recorded[0].measured_at.startswith("2026-11-29T") and recorded[0].cpu == "AMD EPYC"
    listed = read_rows(RESULTS / "cluster-powersgd-p2.json")  # written before the record
    assert listed[0].measured_at == "2026-11-28" and "Intel" in listed[0].cpu


def test_a_rows_compute_comes_from_its_own_cpu_where_measured() -> None:
    from gradzip_lab.bench.project_validate import MeasuredRow, compute_of

    def row(variant: str, p: int, cpu: str, step: float) -> MeasuredRow:
        return MeasuredRow("f.json", "mlp-4096", p, "1gbit", 10**9, variant, step, None, 1.0, 2,
                           cpu=cpu)  # fmt: skip

    rows = [
        row("none", 2, "Intel", 210.0),
        row("none", 2, "AMD", 320.0),
        row("none", 4, "Intel", 400.0),
    ]
    computes = {cpu: compute_lookup(rows, cpu) for cpu in (None, "Intel", "AMD")}
    assert compute_of(row("fp32", 2, "AMD", 1.0), computes) == 320.0
    assert compute_of(row("fp32", 2, "Intel", 1.0), computes) == 210.0
    assert compute_of(row("fp32", 4, "AMD", 1.0), computes) == 400.0  # none on AMD at P = 4
    assert compute_of(row("fp32", 8, "AMD", 1.0), computes) is None
    assert compute_of(replace(row("fp32", 2, "AMD", 1.0), compute_ms=99.0), computes) == 99.0
