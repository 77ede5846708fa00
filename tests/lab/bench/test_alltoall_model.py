"""The scaling model's all-to-alls: the bytes gloo sends as one all-to-all (the integer sums'
reduce-scatter, the transport's gathers unless ``ring_gather_from`` sends them round the ring)
move at the link's measured ``alltoall_efficiency``; the cluster's link probe measures it; the
validation reads it, and the gather form, from each row."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from gradzip.comm.spawn import run_processes
from gradzip.comm.transport import Transport
from gradzip_lab.bench.cluster_probe import probe_link, probe_summary
from gradzip_lab.bench.project_links import Link, Traffic
from gradzip_lab.bench.project_validate import gather_form, newest, read_rows
from gradzip_lab.bench.project_variants import Network, Workload, predict


def test_alltoall_bytes_move_at_the_links_alltoall_efficiency() -> None:
    link = Link(1e-3, 8.0, efficiency=1.0, alltoall_efficiency=0.5)  # 1 GB/s
    assert link.seconds(2, 1e9) == pytest.approx(2e-3 + 1.0)
    assert link.seconds(2, 1e9, alltoall_bytes=4e8) == pytest.approx(2e-3 + 0.6 + 0.8)
    both = Traffic(1, 10, alltoall_bytes=10) + Traffic(2, 5)
    assert both == Traffic(3, 15, alltoall_bytes=10)
    assert both.times(2) == Traffic(6, 30, alltoall_bytes=20)
    assert link.traffic_seconds(both) == pytest.approx(3e-3 + 5e-9 + 10 / 5e8)


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5, float("nan")])
def test_an_impossible_alltoall_efficiency_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="all-to-all efficiency must be in"):
        Link(0.0, 1.0, alltoall_efficiency=bad)


def _comm(variant: str, p: int, efficiency: float, ring_from: int | None) -> float:
    from gradzip_lab.bench.project_models import named_model, parameter_shapes

    work = Workload(shapes=parameter_shapes(named_model("fc-300-100")[0]), compute_s=0.1)
    link = Link(0.0, 0.1, alltoall_efficiency=efficiency)
    return predict(variant, work, p, Network(link, link, ring_gather_from=ring_from)).comm_s


def test_the_integer_all_reduce_pays_the_alltoall_on_its_scatter_and_on_gathers_it_sends_so() -> (
    None
):
    v = "gradzip:qsgd:allreduce[chunk_values=null]"
    base = _comm(v, 8, 1.0, None)
    assert _comm(v, 8, 1.0, 0) == pytest.approx(base)  # the efficiency 1: the forms cost alike
    both = _comm(v, 8, 0.5, None)  # scatter and gather as all-to-alls: every byte twice as slow
    assert both == pytest.approx(2 * base)
    scatter_only = _comm(v, 8, 0.5, 0)  # the sums round the ring: only the scatter slows
    assert base < scatter_only < both
    # the sums' slots are far under 1 GB: a threshold that high leaves them all-to-alls
    assert _comm(v, 8, 0.5, 10**9) == pytest.approx(both)


def test_the_all_gather_scheme_and_torchs_rings_follow_the_gather_form() -> None:
    v = "gradzip:qsgd:allgather"
    assert _comm(v, 4, 0.5, None) == pytest.approx(2 * _comm(v, 4, 1.0, None))
    assert _comm(v, 4, 0.5, 0) == pytest.approx(_comm(v, 4, 1.0, None))
    # DDP's own ring all-reduce has no all-to-all
    assert _comm("fp32", 4, 0.5, None) == pytest.approx(_comm("fp32", 4, 1.0, None))


def _cluster_file(path: Path, ring_from: int | None, probe: dict[str, float] | None) -> Path:
    run = {"world_size": 8, "rate": "100mbit", "variant": "gradzip:qsgd:allreduce",
           "step_ms": 4000.0, "link_probe": probe}  # fmt: skip
    torch_run = dict(run, variant="fp32", step_ms=23000.0)
    data = {"runs": [run, torch_run], "cpu_count": 2, "ring_gather_from": ring_from,
            "machine": {"date": "2026-12-07T20:00:00+00:00", "cpu": "x"}}  # fmt: skip
    path.write_text(json.dumps(data))
    return path


def test_rows_carry_their_probe_and_gather_form_and_the_forms_are_kept_apart(
    tmp_path: Path,
) -> None:
    probe = {"alltoall_efficiency": 0.8, "alltoall_latency_s": 0.007}
    ring = read_rows(_cluster_file(tmp_path / "ring.json", 0, probe))
    a2a = read_rows(_cluster_file(tmp_path / "a2a.json", None, None))
    assert ring[0].alltoall_efficiency == 0.8 and ring[0].gathers == 0
    # the model counts P - 1 messages an all-to-all: alpha is the latency over them
    assert ring[0].probed_alpha_s == pytest.approx(0.001)
    assert a2a[0].alltoall_efficiency is None and a2a[0].gathers is None
    assert a2a[0].probed_alpha_s is None
    assert ring[1].gathers is None  # fp32 is DDP's ring whatever the file set
    kept, superseded = newest(ring + a2a)
    # both gradzip rows are scored (two configurations); the two fp32 rows are one
    # configuration measured at the same time, so both are kept too
    assert sorted(r.source for r in kept if r.variant != "fp32") == ["a2a.json", "ring.json"]
    assert len(kept) == 4 and superseded == []
    later = read_rows(_cluster_file(tmp_path / "later.json", 0, probe))
    later = [replace(r, measured_at="2026-12-08T00:00:00+00:00") for r in later]
    kept, superseded = newest(ring + a2a + later)
    # a later ring measurement supersedes the ring row and both fp32 rows, not the a2a row
    assert sorted((r.source, r.variant) for r in kept) == [
        ("a2a.json", "gradzip:qsgd:allreduce"), ("later.json", "fp32"),
        ("later.json", "gradzip:qsgd:allreduce"),
    ]  # fmt: skip
    assert len(superseded) == 3
    assert [gather_form(x) for x in (None, 0, 65536)] == ["a2a", "ring", "ring>=65536"]


def test_a_probe_that_is_not_a_number_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="alltoall_efficiency"):
        read_rows(_cluster_file(tmp_path / "bad.json", None, {"alltoall_efficiency": -1.0}))
    bad_latency = {"alltoall_efficiency": 0.9, "alltoall_latency_s": float("inf")}
    with pytest.raises(ValueError, match="alltoall_latency_s"):
        read_rows(_cluster_file(tmp_path / "worse.json", None, bad_latency))


def _probe_rank(transport: Transport) -> dict[str, float]:
    return probe_link(bytes_per_peer=4096, repeat=2)


@pytest.mark.distributed
def test_the_probe_times_both_forms_on_gloo_ranks_and_every_rank_agrees() -> None:
    results = run_processes(3, _probe_rank, timeout=60.0)
    first = results[0]
    # the times are the slowest rank's (an all-reduce of the max): every rank reports the same
    assert all(r == first for r in results)
    assert first["bytes_per_peer"] == 4096 and first["repeat"] == 2
    assert 0 < first["ring_s"] < 60 and 0 < first["alltoall_s"] < 60
    sent_bits = 8 * 2 * 4096
    assert first["ring_mbit_per_s"] == pytest.approx(sent_bits / first["ring_s"] / 1e6)
    assert first["alltoall_efficiency"] == pytest.approx(first["ring_s"] / first["alltoall_s"])
    assert "all-to-all efficiency" in probe_summary(first)
    with pytest.raises(ValueError, match="bytes_per_peer >= 1"):
        probe_link(bytes_per_peer=0)


def test_the_integer_all_reduces_cpu_is_timed_by_running_the_scheme() -> None:
    from gradzip_lab.bench.project_models import named_model, parameter_shapes
    from gradzip_lab.bench.project_scheme_cpu import MAX_RANKS, scheme_cpu_s_per_coord

    spec = "gradzip:qsgd:allreduce[chunk_values=null]"
    seconds = scheme_cpu_s_per_coord(spec, 3, numel=1 << 14, repeat=1)
    assert 0 < seconds < 1e-5  # a coordinate costs nanoseconds, not tens of microseconds
    with pytest.raises(ValueError, match="world_size >= 2"):
        scheme_cpu_s_per_coord(spec, 1)
    # the model prices the scheme's codec with the figure it timed at min(P, 8) ranks
    work = Workload(shapes=parameter_shapes(named_model("fc-300-100")[0]), compute_s=0.1)
    key = f"scheme-cpu:{MAX_RANKS}:{spec}"
    work._timed[key] = 1e-6  # a given figure (as a speeds file gives it) is not re-timed
    link = Link(0.0, 1.0)
    p16 = predict(spec, work, 16, Network(link, link))
    assert p16.codec_s == pytest.approx(work.numel * 1e-6)
    work._timed[key] = 2e-6
    assert predict(spec, work, 16, Network(link, link)).codec_s == pytest.approx(2 * p16.codec_s)


def test_the_projection_takes_an_alltoall_efficiency_and_refuses_an_impossible_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from gradzip.cli import main

    assert main(["bench", "project", "--alltoall-efficiency", "1.5"]) == 2
    assert "--alltoall-efficiency must be in (0, 1]" in capsys.readouterr().err


def test_a_row_without_a_probe_borrows_the_newest_probe_of_the_same_links(tmp_path: Path) -> None:
    from gradzip_lab.bench.project_borrowed_probes import lend_probes
    from gradzip_lab.bench.project_validate import Checked, validation_table

    probe = {"alltoall_efficiency": 0.8, "alltoall_latency_s": 0.007}
    probed = read_rows(_cluster_file(tmp_path / "probed.json", None, probe))
    older = read_rows(_cluster_file(tmp_path / "older.json", None, None))
    older = [replace(r, measured_at="2026-11-01T00:00:00+00:00") for r in older]
    other_p = [replace(r, world_size=4) for r in older]
    efficiency_only = [replace(r, alltoall_efficiency=0.5) for r in older]
    lent = lend_probes(probed + older + other_p + efficiency_only)
    own, borrowed, unprobed, half = lent[0:2], lent[2:4], lent[4:6], lent[6:8]
    assert not any(r.probe_borrowed for r in own)  # its own probe, untouched
    assert all(r.probe_borrowed for r in borrowed)
    assert [r.alltoall_efficiency for r in borrowed] == [0.8, 0.8]
    assert borrowed[0].probed_alpha_s == pytest.approx(0.001)
    # P = 4 was never probed: the defaults stay
    assert [(r.alltoall_efficiency, r.probed_alpha_s, r.probe_borrowed) for r in unprobed] == [
        (None, None, False), (None, None, False)
    ]  # fmt: skip
    # its own efficiency kept, the missing latency lent
    assert half[0].alltoall_efficiency == 0.5 and half[0].probed_alpha_s == pytest.approx(0.001)
    # a newer probe of the same links is the one lent
    newer = [
        replace(r, measured_at="2026-12-31T00:00:00+00:00", alltoall_efficiency=0.6) for r in probed
    ]
    assert lend_probes(newer + probed + older)[-1].alltoall_efficiency == 0.6
    table = validation_table([Checked(borrowed[0], 4000.0, 30.0), Checked(own[0], 4000.0, 30.0)])
    assert "0.80*" in table.splitlines()[1] and "1000*" in table.splitlines()[1]
    assert "*" not in table.splitlines()[2]


def test_the_all_gathers_codec_is_a_run_of_the_scheme_plus_a_decode_a_rank_past_eight() -> None:
    from gradzip_lab.bench.project_models import named_model, parameter_shapes
    from gradzip_lab.bench.project_scheme_cpu import MAX_RANKS

    spec = "gradzip:qsgd:allgather"
    work = Workload(shapes=parameter_shapes(named_model("fc-300-100")[0]), compute_s=0.1)
    work.given_speeds["qsgd"] = (1e-9, 2e-9)
    work._timed[f"scheme-cpu:4:{spec}"] = 5e-9
    work._timed[f"scheme-cpu:{MAX_RANKS}:{spec}"] = 9e-9
    link = Link(0.0, 1.0)
    assert predict(spec, work, 4, Network(link, link)).codec_s == pytest.approx(work.numel * 5e-9)
    at_8 = predict(spec, work, 8, Network(link, link)).codec_s
    assert at_8 == pytest.approx(work.numel * 9e-9)
    # each rank past eight adds one decode of every coordinate
    at_24 = predict(spec, work, 24, Network(link, link)).codec_s
    assert at_24 == pytest.approx(work.numel * (9e-9 + 16 * 2e-9))


def test_segmented_runs_are_a_configuration_of_their_own(tmp_path: Path) -> None:
    from gradzip_lab.bench.project_validate import Checked, validation_table

    plain = read_rows(_cluster_file(tmp_path / "plain.json", None, None))
    path = _cluster_file(tmp_path / "seg.json", None, None)
    data = json.loads(path.read_text())
    path.write_text(json.dumps(dict(data, segment_from=1 << 20)))
    segmented = read_rows(path)
    assert segmented[0].segment_from == 1 << 20 and plain[0].segment_from is None
    later = [replace(r, measured_at="2026-12-31T00:00:00+00:00") for r in segmented]
    kept, _ = newest(plain + later)
    # the gradzip rows measure two transports: both kept; fp32 is DDP's either way: the later
    assert sorted((r.source, r.variant) for r in kept) == [
        ("plain.json", "gradzip:qsgd:allreduce"), ("seg.json", "fp32"),
        ("seg.json", "gradzip:qsgd:allreduce"),
    ]  # fmt: skip
    table = validation_table([Checked(segmented[0], 4000.0, 30.0)])
    assert "a2a,seg>=1048576" in table
