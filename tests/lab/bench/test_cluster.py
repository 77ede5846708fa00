"""``gradzip bench cluster``: refusal without root, argument checks, the report writers, and one
end-to-end run on a real emulated cluster (slow, root only)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gradzip.cli import main
from gradzip_lab.bench import cluster_netns
from gradzip_lab.bench.cluster import RANK_PROCESS_BYTES, chunks
from gradzip_lab.bench.cluster_netns import ClusterNetwork, parse_rate, tbf_arguments
from gradzip_lab.bench.cluster_report import fill_references, format_table, make_row, write_json
from gradzip_lab.bench.cluster_variants import VARIANT_TABLE, select


def test_refuses_without_root(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cluster_netns.os, "geteuid", lambda: 1000)
    calls: list[Any] = []
    monkeypatch.setattr(cluster_netns, "_run", lambda *a, **k: calls.append(a))
    # (the conftest also refuses any subprocess here: no `ip` can run)
    code = main(["bench", "cluster", "--model", "fc-300-100", "--world-sizes", "2"])
    assert code == 2
    assert calls == []
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs root" in err[0]


def test_refuses_without_iproute2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cluster_netns.os, "geteuid", lambda: 0)
    monkeypatch.setattr(cluster_netns.shutil, "which", lambda tool: None)
    assert main(["bench", "cluster", "--world-sizes", "2"]) == 2
    assert "needs the ip and tc command" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rates", "fast"], "bad rate 'fast'"),
        (["--rates", "100mbit,-1gbit"], "bad rate"),
        (["--world-sizes", "1"], "world sizes must be integers >= 2"),
        (["--model", "resnet"], "invalid choice"),
        (["--steps", "0"], "--steps must be >= 1"),
        (["--warmup", "1"], "--warmup >= 2"),
        (["--variants", "gradzip:nope:ring"], "unknown variant(s) gradzip:nope:ring"),
        (["--target-loss", "0.4", "--steps", "5"], "--window must be in [1, --steps]"),
        (["--target-loss", "-1", "--steps", "20"], "--target-loss > 0"),
        (["--lr", "0"], "--lr must be > 0"),
        (["--ring-gather-from", "-1"], "--ring-gather-from must be >= 0 bytes, got -1"),
        (["--segment-from", "0"], "--segment-from must be >= 1 byte, got 0"),
    ],
)
def test_bad_arguments(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(["bench", "cluster", *argv])
    except SystemExit as exit_:  # argparse's own refusals
        code = int(exit_.code or 0)
    assert code == 2
    assert message in capsys.readouterr().err


def test_rates_and_tbf() -> None:
    assert parse_rate("100mbit") == 100_000_000
    assert parse_rate("1GBIT") == 10**9
    assert parse_rate("none") is None
    with pytest.raises(ValueError, match="unit"):
        parse_rate("100")
    args = tbf_arguments("100mbit")
    assert args[:3] == ["tbf", "rate", "100mbit"]
    assert int(args[4]) == 64 * 1024  # 2 ms at 100 Mbit/s is 25 kB: the floor applies
    assert int(tbf_arguments("10gbit")[4]) == 2_500_000


def test_namespace_names_and_links() -> None:
    net = ClusterNetwork(3, run=7, pid=4242)
    assert [net.rank_namespace(r) for r in range(3)] == ["gzc4242n0", "gzc4242n1", "gzc4242n2"]
    assert net.bridge == "gzc4242b"
    assert net.address(2) == "10.213.7.3"
    # both ends of every link carry a qdisc
    assert net.links() == [
        ("gzc4242n0", "veth0"),
        ("gzc4242b", "n0"),
        ("gzc4242n1", "veth0"),
        ("gzc4242b", "n1"),
        ("gzc4242n2", "veth0"),
        ("gzc4242b", "n2"),
    ]


def test_sweep_removes_only_dead_launchers(monkeypatch: pytest.MonkeyPatch) -> None:
    # r<rank>: the names of launchers from before nodes, still swept
    listed = ["gzc1n0", "gzc1b", "gzc999999r0", "gzc999999n1", "gzc999999b", "other", "gzcx"]
    deleted: list[str] = []

    def fake_run(*argv: str, check: bool = True) -> Any:
        if argv[:3] == ("ip", "netns", "list"):
            return subprocess.CompletedProcess(argv, 0, "\n".join(listed) + "\n", "")
        assert argv[:3] == ("ip", "netns", "del")
        deleted.append(argv[3])
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(cluster_netns, "_run", fake_run)
    monkeypatch.setattr(cluster_netns, "_pid_alive", lambda pid: pid == 1)
    assert cluster_netns.sweep_stale() == ["gzc999999r0", "gzc999999n1", "gzc999999b"]
    assert deleted == ["gzc999999r0", "gzc999999n1", "gzc999999b"]


def test_variant_table() -> None:
    names = [v.name for v in VARIANT_TABLE]
    for required in ("none", "fp32", "fp16_hook", "powersgd_r1", "powersgd_r4"):
        assert required in names
    for prefix in (
        "gradzip:dqsg[M=2]:",
        "gradzip:ndqsg:",
        "gradzip:qsgd:",
        "gradzip:terngrad:",
        "gradzip:onebit+ef:",
        "gradzip:topk[ratio=0.01]+ef:",
    ):
        assert any(n.startswith(prefix) for n in names), prefix
    assert [v.name for v in select(["fp32", "none"])] == ["none", "fp32"]  # table order
    assert [v.name for v in select(None)] == [v.name for v in VARIANT_TABLE if v.default]
    assert "gradzip:qsgd:ring" in names
    assert "gradzip:qsgd:ring" not in [v.name for v in select(None)]
    # any other exchange spec runs when named; one written another way is the table's row
    extra = select(["gradzip:qsgd:ring", "gradzip:dqsg[M=4,packing=dense]+ef:ring"])
    assert [v.name for v in extra] == [
        "gradzip:qsgd:ring",
        "gradzip:dqsg[M=4,packing=dense]+ef:ring",
    ]
    reordered = "gradzip:topk[value_codec=qsgd,index_coding=rice,ratio=0.01]+ef:allgather"
    assert [v.name for v in select([reordered])] == [
        "gradzip:topk[ratio=0.01,index_coding=rice,value_codec=qsgd]+ef:allgather"
    ]


def test_chunks_fit_memory() -> None:
    names = [f"v{i}" for i in range(10)]
    per_variant = 4 * 4 * 36_818_954 * 2
    processes = 2 * RANK_PROCESS_BYTES  # the two rank processes' own memory comes first
    assert chunks(names, "mlp-4096", 2, 100 * per_variant) == [names]
    assert chunks(names, "mlp-4096", 2, 6 * per_variant + 2 * processes) == [
        names[i : i + 3] for i in (0, 3, 6)
    ] + [names[9:]]
    assert chunks(names, "mlp-4096", 2, 0) == [[n] for n in names]


def _rank(variants: dict[str, tuple[list[float], list[int], list[float]]]) -> dict[str, Any]:
    return {
        "variants": {
            name: {
                "seconds": s,
                "tx_bytes": tx,
                "rx_bytes": tx,
                "payload_bytes": None,
                "losses": loss,
            }
            for name, (s, tx, loss) in variants.items()
        }
    }


def _rows() -> list[dict[str, Any]]:
    ranks = [
        _rank(
            {
                "none": ([0.1, 0.3, 0.2], [0, 0, 0], [2.3, 2.2, 2.1]),
                "fp32": ([1.0, 3.0, 2.0], [100, 200, 300], [2.3, 2.0, 1.9]),
            }
        ),
        _rank(
            {
                "none": ([0.2, 0.1, 0.1], [0, 0, 0], [2.1, 2.0, 1.9]),
                "fp32": ([4.0, 1.0, 1.0], [300, 400, 500], [2.1, 2.0, 1.7]),
            }
        ),
    ]
    rows = [make_row("fc-300-100", 2, "100mbit", v, ranks) for v in ("none", "fp32")]
    rows.append({**rows[1], "rate": "none", "step_ms": 500.0})
    fill_references(rows)
    return rows


def test_rows_median_of_slowest_rank() -> None:
    none, fp32, fp32_free = _rows()
    # slowest rank per step: 4.0, 3.0, 2.0 s -> median 3.0 s
    assert fp32["step_ms"] == pytest.approx(3000.0)
    assert fp32["step_ms_per_step"] == pytest.approx([4000.0, 3000.0, 2000.0])
    assert none["step_ms"] == pytest.approx(200.0)  # 0.2, 0.3, 0.2
    assert fp32["compute_ms"] == pytest.approx(200.0)
    assert fp32["bytes_sent_per_rank"] == pytest.approx(300.0)  # means 200 and 400
    assert fp32["loss_first"] == pytest.approx(2.2) and fp32["loss_last"] == pytest.approx(1.8)
    assert none["speedup_vs_fp32"] == pytest.approx(15.0)
    assert fp32_free["compute_ms"] is None  # no `none` row at that rate
    assert fp32_free["speedup_vs_fp32"] == pytest.approx(1.0)
    assert fp32["step_ms_no_limit"] == fp32_free["step_ms_no_limit"] == pytest.approx(500.0)
    assert none["step_ms_no_limit"] is None


def test_table_json_and_png(tmp_path: Path) -> None:
    rows = _rows()
    lines = format_table(rows)
    assert lines[0] == "fc-300-100, P = 2"
    assert "100mbit" in lines[1] and "none" in lines[1]
    fp32 = next(line for line in lines if line.startswith("fp32"))
    assert "3,000" in fp32 and "1.00" in fp32 and "500" in fp32
    none = next(line for line in lines if line.startswith("none"))
    assert "15.00" in none and none.rstrip().endswith("-")  # not run without a limit
    write_json(tmp_path / "r.json", rows, {"steps": 3})
    loaded = json.loads((tmp_path / "r.json").read_text())
    assert loaded["steps"] == 3
    assert loaded["command"].startswith("gradzip")  # where the result came from
    assert {"cpu", "cpu_count", "torch", "date"} <= set(loaded["machine"])
    for key in (
        "model",
        "world_size",
        "rate",
        "variant",
        "step_ms",
        "compute_ms",
        "bytes_sent_per_rank",
        "loss_first",
        "loss_last",
    ):
        assert key in loaded["runs"][0]
    pytest.importorskip("matplotlib")
    from gradzip_lab.bench.cluster_report import write_png

    write_png(tmp_path / "r.png", rows)
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_time_to_target_rows_table_and_curves(tmp_path: Path) -> None:
    from gradzip_lab.bench.cluster_target import (
        format_targets,
        target_figures,
        window_means,
        window_reached,
        write_curves_png,
    )

    assert window_means([4.0, 2.0, 6.0, 0.0], 2) == [4.0, 3.0, 4.0, 3.0]
    # the ranks' stopping rule: a full window whose mean is at most the target
    assert window_reached([9.0, 1.0, 0.5], 2, 0.75)
    assert not window_reached([1.0, 0.6], 2, 0.75) and not window_reached([0.5], 2, 1.0)

    def figures(seconds: list[float], reached: int | None) -> dict[str, Any]:
        return {"seconds": seconds, "mean_losses": [2.0, 1.5, 1.2, 1.0], "reached": reached}

    # slowest rank per step 2, 3, 1, 4 s: 2, 5, 6, 10 s in all; the target met at the 3rd step
    fp32 = target_figures([figures([2, 1, 1, 4], 2), figures([1, 3, 0.5, 1], 2)])
    assert fp32["elapsed_s"] == [2, 5, 6, 10] and fp32["steps_to_target"] == 3
    assert fp32["time_to_target_s"] == 6
    fast = target_figures([figures([0.5] * 4, 1), figures([0.25] * 4, 1)])
    assert fast["time_to_target_s"] == 1.0
    never = target_figures([figures([1.0] * 4, None)] * 2)
    assert never["time_to_target_s"] is None and never["steps_to_target"] is None
    with pytest.raises(ValueError, match="disagree"):
        target_figures([figures([1.0] * 4, 1), figures([1.0] * 4, 2)])
    base = {"model": "fc-300-100", "world_size": 2, "rate": "100mbit"}
    rows = [
        {**base, "variant": "fp32", **fp32},
        {**base, "variant": "gradzip:x", **fast},
        {**base, "variant": "slow", **never},
    ]
    lines = format_targets(rows, 1.3, 2)
    assert any(line.startswith("gradzip:x") and line.rstrip().endswith("6.00") for line in lines)
    assert any(line.startswith("slow") and "not reached in 4 steps" in line for line in lines)
    pytest.importorskip("matplotlib")
    write_curves_png(tmp_path / "c.png", rows, 1.3, 2)
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _cannot_build() -> str | None:
    return cluster_netns.missing_privilege()


@pytest.mark.slow
@pytest.mark.distributed
def test_end_to_end_fc_300_100(tmp_path: Path) -> None:
    reason = _cannot_build()
    if reason:
        pytest.skip(reason)
    out = tmp_path / "cluster.json"
    variants = ["none", "fp32", "powersgd_r1", "gradzip:onebit+ef:ring"]
    code = main(
        [
            "bench",
            "cluster",
            "--model",
            "fc-300-100",
            "--world-sizes",
            "2",
            "--rates",
            "100mbit,none",
            "--steps",
            "3",
            "--timeout",
            "300",
            "--variants",
            *variants,
            "--json",
            str(out),
            "--png",
            str(tmp_path / "c.png"),
        ]
    )
    assert code == 0
    # all of ours are gone (other processes' namespaces may come and go meanwhile)
    mine = f"{cluster_netns.PREFIX}{os.getpid()}"
    assert not [n for n in cluster_netns.list_namespaces() if n.startswith(mine)]
    assert shutil.which("ip") is not None
    runs = json.loads(out.read_text())["runs"]
    assert {(r["rate"], r["variant"]) for r in runs} == {
        (rate, v) for rate in ("100mbit", "none") for v in variants
    }
    for r in runs:
        assert r["model"] == "fc-300-100" and r["world_size"] == 2
        assert r["step_ms"] > 0 and r["compute_ms"] is not None
        assert r["loss_first"] > 0 and r["loss_last"] > 0
    by = {(r["rate"], r["variant"]): r for r in runs}
    for rate in ("100mbit", "none"):
        fp32 = by[rate, "fp32"]["bytes_sent_per_rank"]
        onebit = by[rate, "gradzip:onebit+ef:ring"]["bytes_sent_per_rank"]
        # fp32 sends 4 bytes per coordinate (266,610 of them), onebit about 1 bit
        assert fp32 > 266_610 * 4 > 4 * onebit, (fp32, onebit)
        assert by[rate, "gradzip:onebit+ef:ring"]["payload_bytes_per_rank"] > 0
        assert by[rate, "none"]["bytes_sent_per_rank"] < 1000, by[rate, "none"]
    # the rate limit is in force: a rank cannot send its bytes faster than 100 Mbit/s allows
    # (less one tbf burst of at most 64 KiB), however loaded the machine; an unlimited veth
    # moves the 1.07 MB in about a millisecond
    limited = by["100mbit", "fp32"]
    wire_ms = (limited["bytes_sent_per_rank"] - 64 * 1024) * 8 / 100e6 * 1e3
    assert limited["step_ms"] >= wire_ms > 50, (limited["step_ms"], wire_ms)
    # every row carries its rate's link probe, timed on the same limited links: its 1 MiB
    # cannot cross them faster than 100 Mbit/s allows (plus one 64 KiB burst)
    for rate in ("100mbit", "none"):
        probes = [by[rate, v]["link_probe"] for v in variants]
        assert all(p == probes[0] for p in probes) and probes[0]["alltoall_efficiency"] > 0
    probe = by["100mbit", "fp32"]["link_probe"]
    assert 0 < probe["ring_mbit_per_s"] < 100 * (1 + 64 / 1024), probe
    assert 0 < probe["alltoall_mbit_per_s"] < 100 * (1 + 64 / 1024), probe
    assert probe["alltoall_latency_s"] > 0


@pytest.mark.slow
@pytest.mark.distributed
def test_end_to_end_time_to_target_with_gradzip_powersgd_in_the_hook(tmp_path: Path) -> None:
    """``--target-loss``: every variant stops once its windowed loss reaches the target (the
    ranks agree on the step), PowerSGD runs through gradzip's DDP hook on the real cluster, and
    the curves are drawn."""
    reason = _cannot_build()
    if reason:
        pytest.skip(reason)
    out, curves = tmp_path / "cluster.json", tmp_path / "curves.png"
    variants = ["fp32", "powersgd_r1", "gradzip:fp16+ef:powersgd[r1]"]
    code = main(
        ["bench", "cluster", "--model", "fc-300-100", "--world-sizes", "2", "--rates",
         "100mbit", "--steps", "80", "--window", "5", "--target-loss", "1.2", "--timeout",
         "300", "--variants", *variants, "--json", str(out), "--png", str(tmp_path / "b.png"),
         "--curves-png", str(curves)]
    )  # fmt: skip
    assert code == 0
    runs = {r["variant"]: r for r in json.loads(out.read_text())["runs"]}
    for name in variants:
        r = runs[name]
        steps = r["steps_to_target"]
        assert steps is not None and 5 <= steps < 80, (name, steps)
        # it stopped at the target: one timed step's figures per step run, no more
        assert len(r["mean_losses"]) == len(r["elapsed_s"]) == steps
        assert sum(r["mean_losses"][-5:]) / 5 <= 1.2 < r["mean_losses"][0]
        assert r["time_to_target_s"] == pytest.approx(r["elapsed_s"][-1])
    # gradzip's PowerSGD sent real fp16 factor payloads through the hook: half torch's bytes
    gradzip_bytes = runs["gradzip:fp16+ef:powersgd[r1]"]["payload_bytes_per_rank"]
    assert 0 < gradzip_bytes < 0.7 * runs["powersgd_r1"]["bytes_sent_per_rank"]
    assert curves.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
