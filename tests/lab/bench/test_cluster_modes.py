"""``gradzip bench cluster --mode isolated|interleaved|both --rounds N``: the launch plan, the
rows pooled over launches, the side-by-side report, and a real run on the emulated cluster
(root only) where each isolated variant trains in processes of its own and ends with the same
losses and parameters as when interleaved."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

import pytest

from gradzip.cli import main
from gradzip_lab.bench import cluster, cluster_netns
from gradzip_lab.bench.cluster_compare import default_baseline, format_comparison
from gradzip_lab.bench.cluster_merge import combined_targets
from gradzip_lab.bench.cluster_plan import Launch, modes_of, plan_launches, rotated
from gradzip_lab.bench.cluster_rank import RankConfig
from gradzip_lab.bench.cluster_variants import attach, select


def _pairs(chunk_size: int) -> Any:
    return lambda names: [names[i : i + chunk_size] for i in range(0, len(names), chunk_size)]


def test_isolated_plan_gives_each_variant_its_own_launch_in_rotated_order() -> None:
    plan = plan_launches(["a", "b", "c"], "isolated", 3, _pairs(10))
    assert [launch.names for launch in plan] == [[n] for n in "abc" + "bca" + "cab"]
    assert {launch.mode for launch in plan} == {"isolated"}
    assert [launch.round for launch in plan] == [0] * 3 + [1] * 3 + [2] * 3
    # over as many rounds as variants, each variant ran once in each position
    for name in "abc":
        positions = [plan[3 * r : 3 * r + 3].index(Launch("isolated", r, ((name,),)))
                     for r in range(3)]  # fmt: skip
        assert sorted(positions) == [0, 1, 2]
    assert rotated(["a", "b"], 1) == ["b", "a"] and rotated(["a", "b"], 2) == ["a", "b"]


def test_interleaved_and_both_plans() -> None:
    (only,) = plan_launches(["a", "b", "c"], "interleaved", 1, _pairs(2))
    assert only.chunks == (("a", "b"), ("c",)) and only.names == ["a", "b", "c"]
    both = plan_launches(["a", "b"], "both", 2, _pairs(10))
    # the modes swap places every round, the variant order rotates
    assert [(launch.mode, launch.names) for launch in both] == [
        ("interleaved", ["a", "b"]),
        ("isolated", ["a"]),
        ("isolated", ["b"]),
        ("isolated", ["b"]),
        ("isolated", ["a"]),
        ("interleaved", ["b", "a"]),
    ]
    assert modes_of("both") == ["interleaved", "isolated"]
    with pytest.raises(ValueError, match="unknown mode"):
        plan_launches(["a"], "crowded", 1, _pairs(1))
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        plan_launches(["a"], "isolated", 0, _pairs(1))


class _FakeNet:
    def set_rate(self, rate: str) -> None:
        self.rate = rate

    def address(self, rank: int) -> str:
        return f"10.0.0.{rank + 1}"


#: step seconds the fake ranks report, per variant and mode: torch's PowerSGD slowed down by
#: the crowd of an interleaved launch, gradzip's not
_SECONDS = {
    ("fp32", "isolated"): 1.0,
    ("fp32", "interleaved"): 1.0,
    ("powersgd_r1", "isolated"): 0.4,
    ("powersgd_r1", "interleaved"): 0.5,
    ("gradzip:fp16+ef:powersgd[r1,start2]", "isolated"): 0.4,
    ("gradzip:fp16+ef:powersgd[r1,start2]", "interleaved"): 0.2,
}


def _fake_cluster(monkeypatch: pytest.MonkeyPatch) -> list[list[RankConfig]]:
    """Replace the namespaces and the rank processes: every launch gets fresh pids and reports
    the step times of :data:`_SECONDS`, a little slower each round (drift)."""
    launched: list[list[RankConfig]] = []
    pids = itertools.count(1000)

    class _Built:
        def __enter__(self) -> _FakeNet:
            return _FakeNet()

        def __exit__(self, *exc: object) -> None:
            return None

    def fake_launch(
        net: Any,
        configs: list[RankConfig],
        timeout: float,
        workdir: Path,
        env: dict[str, str],
        memory: Any = None,
    ) -> list[dict[str, Any]]:
        # numba's kernels get the ranks' thread budget, as torch does
        assert env == {"NUMBA_NUM_THREADS": str(configs[0].threads)}
        launched.append(configs)
        chunks = configs[0].variants
        mode = "isolated" if len(chunks) == 1 and len(chunks[0]) == 1 else "interleaved"
        drift = 1.0 + 0.1 * (len(launched) - 1)
        out = []
        for config in configs:
            variants = {}
            for chunk in config.variants:
                for name in chunk:
                    seconds = _SECONDS[name, mode] * drift
                    variants[name] = {
                        "seconds": [seconds] * config.steps,
                        "tx_bytes": [100] * config.steps,
                        "rx_bytes": [100] * config.steps,
                        "payload_bytes": None,
                        "losses": [2.0 - 0.1 * s for s in range(config.steps)],
                        "mean_losses": [],
                        "reached": None,
                        "param_digest": f"digest-of-{name}",
                        "co_resident": list(chunk),
                    }
            out.append({"rank": config.rank, "pid": next(pids), "variants": variants})
        return out

    monkeypatch.setattr(cluster, "built_cluster", lambda world, run=0, ranks_per_node=1: _Built())
    monkeypatch.setattr(cluster, "launch", fake_launch)
    monkeypatch.setattr(cluster, "sweep_stale", list)
    return launched


def test_both_modes_pool_their_launches_into_rows_and_report_the_ratios_side_by_side(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    launched = _fake_cluster(monkeypatch)
    names = ["powersgd_r1", "gradzip:fp16+ef:powersgd[r1,start2]"]
    out = tmp_path / "c.json"
    rows = cluster.run([2], ["100mbit"], "fc-300-100", 3, 2, select(names), 60.0,
                       json_path=str(out), mode="both", rounds=2)  # fmt: skip
    # per round one interleaved launch and one per variant; ports never reused
    assert len(launched) == 2 * (1 + len(names))
    assert len({configs[0].master_port for configs in launched}) == len(launched)
    by = {(r["mode"], r["variant"]): r for r in rows}
    assert set(by) == {(m, n) for m in ("isolated", "interleaved") for n in names}
    all_pids = [pid for r in rows for launch_pids in r["pids"] for pid in launch_pids]
    for name in names:
        isolated, interleaved = by["isolated", name], by["interleaved", name]
        assert isolated["launches"] == interleaved["launches"] == 2
        assert isolated["co_resident"] == [[name], [name]]
        assert [sorted(c) for c in interleaved["co_resident"]] == [sorted(names)] * 2
        # an isolated variant's processes trained nothing else
        mine = [pid for launch_pids in isolated["pids"] for pid in launch_pids]
        assert len(mine) == 4 and all(all_pids.count(pid) == 1 for pid in mine)
        assert len(isolated["step_ms_per_step"]) == 2 * 3  # the rounds' timed steps pooled
        assert isolated["step_ms_rounds"][0] < isolated["step_ms_rounds"][1]  # the drift shows
        assert isolated["param_digests"] == [[f"digest-of-{name}"] * 2] * 2
    # launch order: round 1 interleaved (drift 1.0), psgd (1.1), gradzip (1.2); round 2 gradzip
    # (1.3), psgd (1.4), interleaved (1.5); the pooled median of two rounds' equal steps lies
    # between them
    psgd = by["isolated", "powersgd_r1"]
    assert psgd["step_ms"] == pytest.approx(400 * (1.1 + 1.4) / 2)
    assert psgd["baseline"] == "powersgd_r1" and psgd["speedup_vs_baseline"] == 1.0
    gz = by["isolated", "gradzip:fp16+ef:powersgd[r1,start2]"]
    assert gz["speedup_vs_baseline"] == pytest.approx((1.1 + 1.4) / (1.2 + 1.3))
    gz_crowded = by["interleaved", "gradzip:fp16+ef:powersgd[r1,start2]"]
    assert gz_crowded["speedup_vs_baseline"] == pytest.approx(2.5)
    text = capsys.readouterr().out
    assert "launch 6/6 (round 2, interleaved: all interleaved)" in text
    # the side-by-side line: isolated 480 and 520 ms in its rounds, interleaved 200 and 300
    (line,) = [x for x in text.splitlines() if "[480-520]" in x]
    assert line.split() == ["gradzip:fp16+ef:powersgd[r1,start2]", "500", "[480-520]", "1.00",
                            "250", "[200-300]", "2.50", "0.50"]  # fmt: skip
    loaded = json.loads(out.read_text())
    assert loaded["mode"] == "both" and loaded["rounds"] == 2
    assert loaded["baseline"] == "powersgd_r1"
    assert {r["mode"] for r in loaded["runs"]} == {"isolated", "interleaved"}


def test_isolated_is_the_default_and_one_round_one_launch_per_variant(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    launched = _fake_cluster(monkeypatch)
    names = ["fp32", "powersgd_r1", "gradzip:fp16+ef:powersgd[r1,start2]"]
    rows = cluster.run([2], ["100mbit", "none"], "fc-300-100", 2, 2, select(names), 60.0)
    assert [configs[0].variants for configs in launched] == [[[n]] for n in names] * 2
    assert {r["mode"] for r in rows} == {"isolated"} and len(rows) == 2 * len(names)
    assert all(r["launches"] == 1 and r["baseline"] == "fp32" for r in rows)
    fp32 = next(r for r in rows if r["variant"] == "fp32" and r["rate"] == "100mbit")
    assert fp32["speedup_vs_fp32"] == fp32["speedup_vs_baseline"] == 1.0


def test_comparison_table_format() -> None:
    base = {"model": "mlp-4096", "world_size": 2, "rate": "100mbit"}
    rows = [
        {**base, "mode": "isolated", "variant": "powersgd_r1", "step_ms": 400.0,
         "step_ms_rounds": [390.0, 410.0], "time_to_target_s": 80.0},
        {**base, "mode": "isolated", "variant": "gz", "step_ms": 380.0,
         "step_ms_rounds": [370.0, 385.0], "time_to_target_s": None},
        {**base, "mode": "interleaved", "variant": "powersgd_r1", "step_ms": 500.0,
         "step_ms_rounds": [500.0], "time_to_target_s": 100.0},
        {**base, "mode": "interleaved", "variant": "gz", "step_ms": 250.0,
         "step_ms_rounds": [250.0], "time_to_target_s": 50.0},
    ]  # fmt: skip
    lines = format_comparison(rows, "powersgd_r1")
    assert lines[1] == "mlp-4096, P = 2, rate 100mbit"
    assert lines[2].split() == ["variant", "isolated", "ms/step", "x", "base", "interleaved",
                                "ms/step", "x", "base", "interl/isol"]  # fmt: skip
    assert lines[3].split() == ["powersgd_r1", "400", "[390-410]", "1.00", "500", "1.00", "1.25"]
    assert lines[4].split() == ["gz", "380", "[370-385]", "1.05", "250", "2.00", "0.66"]
    target = format_comparison(rows, "powersgd_r1", "time_to_target_s", "s to target")
    assert target[4].split() == ["gz", "-", "-", "50.0", "2.00", "-"]
    only = format_comparison([r for r in rows if r["mode"] == "isolated"], "powersgd_r1")
    assert "interl/isol" not in only[2] and only[4].split()[-1] == "1.05"
    assert default_baseline(["none", "powersgd_r1", "gz"]) == "powersgd_r1"
    assert default_baseline(["none"]) == "none"


def test_time_to_target_over_rounds() -> None:
    def launch(seconds: float | None, steps: int | None) -> dict[str, Any]:
        return {"time_to_target_s": seconds, "steps_to_target": steps,
                "mean_losses": [float(steps or 0)], "elapsed_s": [seconds or 0.0]}  # fmt: skip

    got = combined_targets([launch(60.0, 150), launch(50.0, 150), launch(55.0, 150)])
    assert got["time_to_target_s"] == 55.0 and got["steps_to_target"] == 150
    assert got["time_to_target_s_rounds"] == [60.0, 50.0, 55.0]
    assert got["elapsed_s"] == [55.0]  # the curves of the median launch
    missed = combined_targets([launch(60.0, 150), launch(None, None)])
    assert missed["time_to_target_s"] is None and missed["steps_to_target"] is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rounds", "0"], "--rounds >= 1"),
        (["--mode", "crowded"], "invalid choice"),
        (["--variants", "none", "fp32", "--baseline", "powersgd_r1"], "is not among the variants"),
    ],
)
def test_bad_mode_arguments(
    argv: list[str],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(cluster, "missing_privilege", lambda: None)
    monkeypatch.setattr(cluster, "run", lambda *a, **k: pytest.fail("must not run"))
    try:
        code = main(["bench", "cluster", *argv])
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    assert code == 2
    assert message in capsys.readouterr().err


@pytest.mark.distributed
def test_isolated_launches_train_like_interleaved_on_a_real_cluster(tmp_path: Path) -> None:
    """Both modes, two variants on the emulated cluster (one round: three launches; the rounds'
    plan is the unit tests' part): each isolated variant runs in processes of its own, and its
    losses and final parameters are the same in its own processes as interleaved with the other
    variant (the same seeds and batches, each variant its own model, optimizer and process
    group; deterministic kernels at the same thread count)."""
    reason = cluster_netns.missing_privilege()
    if reason:
        pytest.skip(reason)
    out = tmp_path / "c.json"
    names = ["fp32", "gradzip:fp16+ef:powersgd[r1,start2]"]
    code = main(["bench", "cluster", "--model", "fc-300-100", "--data", "synthetic",
                 "--world-sizes", "2", "--rates", "none", "--steps", "2", "--threads", "1",
                 "--timeout", "300", "--mode", "both", "--variants", *names,
                 "--json", str(out), "--png", str(tmp_path / "c.png")])  # fmt: skip
    assert code == 0
    mine = f"{cluster_netns.PREFIX}{os.getpid()}"
    assert not [n for n in cluster_netns.list_namespaces() if n.startswith(mine)]
    runs = {(r["mode"], r["variant"]): r for r in json.loads(out.read_text())["runs"]}
    (first,), (second,) = (runs["isolated", n]["pids"] for n in names)
    (crowd,), (crowd_again,) = (runs["interleaved", n]["pids"] for n in names)
    # three launches, three pairs of processes: the interleaved pair trained both variants
    assert crowd == crowd_again
    assert len(set(first) | set(second) | set(crowd)) == 6
    for name in names:
        iso, mixed = runs["isolated", name], runs["interleaved", name]
        assert iso["co_resident"] == [[name]] and mixed["co_resident"] == [names]
        assert iso["launches"] == mixed["launches"] == 1
        (digest,) = {d for launch in iso["param_digests"] + mixed["param_digests"] for d in launch}
        assert len(digest) == 64
        assert iso["loss_first"] == mixed["loss_first"] and iso["loss_last"] == mixed["loss_last"]
        assert iso["payload_bytes_per_rank"] == mixed["payload_bytes_per_rank"]
    # the digests tell models apart: the two variants trained differently
    assert (
        runs["isolated", names[0]]["param_digests"] != runs["isolated", names[1]]["param_digests"]
    )


def test_the_ring_gather_threshold_reaches_every_rank_and_the_record(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    launched = _fake_cluster(monkeypatch)
    out = tmp_path / "c.json"
    names = ["gradzip:fp16+ef:powersgd[r1,start2]"]
    cluster.run([2], ["100mbit"], "fc-300-100", 3, 2, select(names), 60.0,
                json_path=str(out), ring_gather_from=65536, segment_from=1 << 20)  # fmt: skip
    assert [c.ring_gather_from for configs in launched for c in configs] == [65536, 65536]
    assert [c.segment_from for configs in launched for c in configs] == [1 << 20, 1 << 20]
    record = json.loads(out.read_text())
    assert record["ring_gather_from"] == 65536 and record["segment_from"] == 1 << 20


def test_a_gradzip_variant_builds_its_transport_with_the_threshold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gradzip.comm import distributed

    built: list[dict[str, Any]] = []

    class RefusedError(Exception):
        pass

    def recording(**kwargs: Any) -> None:
        built.append(kwargs)
        raise RefusedError

    monkeypatch.setattr(distributed, "DistributedTransport", recording)
    variant = select(["gradzip:qsgd:allreduce"])[0]
    with pytest.raises(RefusedError):
        attach(variant, None, "group", 9.0, 4096, 1 << 20)  # type: ignore[arg-type]
    assert built == [
        {"group": "group", "timeout": 9.0, "ring_gather_from": 4096, "segment_from": 1 << 20}
    ]
