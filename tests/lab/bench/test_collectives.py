"""``gradzip bench collectives``: the bytes it reports are the bytes the schemes really move."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

import gradzip
from gradzip.cli import build_parser, main
from gradzip.comm.local import run_local
from gradzip.comm.transport import LENGTH_PREFIX_BYTES, Transport
from gradzip.keys import StreamKey
from gradzip.schemes import SCHEMES
from gradzip_lab.bench.collective_figures import RankFigures
from gradzip_lab.bench.collective_ranks import RUN_SEED, Case, bench_gradient
from gradzip_lab.bench.collective_report import format_growth, growth, make_row
from gradzip_lab.bench.collectives import plan, run

NUMEL = 1000


def direct_bytes(case: Case, world_size: int) -> list[tuple[int, int]]:
    """(sent, received) per rank at step 1, as the scheme's own meter counts a plain run."""

    def body(transport: Transport) -> tuple[int, int]:
        scheme = case.build()
        for step in (0, 1):
            scheme.reduce(transport, bench_gradient(transport.rank, step, NUMEL), step, 0)
        total = transport.meter.total(step=1)
        return total.sent, total.received

    return run_local(world_size, body)


@pytest.mark.distributed
def test_reported_bytes_are_the_real_ones(tmp_path: Path) -> None:
    schemes = [s for s in ("allgather", "ps") if s in SCHEMES]
    path = tmp_path / "collectives.json"
    result = run(
        world_sizes=[2],
        numel=NUMEL,
        steps=1,
        schemes=schemes,
        compressors=["dqsg"],
        json_path=str(path),
    )
    rows = {(r["scheme"], r["compressor"]): r for r in result["rows"]}

    # all-gather at P = 2: each rank sends its own payload and receives the other's, each with
    # an 8-byte length prefix; the payloads come from a real encode of the bench's gradients
    sizes = [
        len(
            gradzip.create("dqsg")
            .encode(bench_gradient(rank, 1, NUMEL), StreamKey(RUN_SEED, rank, 1, 0))
            .payload
        )
        + LENGTH_PREFIX_BYTES
        for rank in range(2)
    ]
    row = rows["allgather", "dqsg"]
    assert row["sent_mean"] == row["received_mean"] == statistics.fmean(sizes)
    assert row["sent_max"] == row["received_max"] == max(sizes)
    assert row["bits_per_element"] == pytest.approx(8 * statistics.fmean(sizes) / NUMEL)
    assert row["bytes_source"] == "measured" and row["ms_per_step"] > 0

    # every scheme row equals what its meter counts in a direct run of the same case
    cases, _ = plan(schemes, ["dqsg"])
    assert {(c.label, c.compressor) for c in cases} <= set(rows)
    for case in cases:
        direct = direct_bytes(case, 2)
        row = rows[case.label, case.compressor]
        assert row["sent_mean"] == statistics.fmean(s for s, _ in direct), case
        assert row["sent_max"] == max(s for s, _ in direct), case
        assert row["received_mean"] == statistics.fmean(r for _, r in direct), case
        assert row["received_max"] == max(r for _, r in direct), case

    # the baselines: timed, bytes by the ring formula 2 (P-1)/P * bytes per element * n
    fp32, fp16 = rows["allreduce_fp32", "-"], rows["ddp_fp16_hook", "fp16"]
    assert fp32["bytes_source"] == fp16["bytes_source"] == "formula"
    assert fp32["sent_mean"] == 4 * NUMEL and fp16["sent_mean"] == 2 * NUMEL
    assert fp32["ms_per_step"] > 0 and fp16["ms_per_step"] > 0
    assert set(fp16["extra_ms"]) == {"ddp_backward", "plain_backward"}

    written = json.loads(path.read_text())
    assert written["rows"] == result["rows"]
    assert written["numel"] == NUMEL and written["world_sizes"] == [2]


def test_plan_pairs_schemes_with_compatible_compressors() -> None:
    cases, skipped = plan(["allgather"], ["dqsg", "ndqsg", "onebit"])
    assert [(c.label, c.compressor, c.error_feedback) for c in cases] == [
        ("allgather", "dqsg", False),
        ("allgather", "onebit", True),  # biased: run under error feedback
    ]
    assert skipped == ["allgather x ndqsg (incompatible)"]
    if "ps" in SCHEMES:
        labels = [c.label for c in plan(["ps"], ["dqsg"])[0]]
        assert labels == ["ps[fp32]", "ps[requantize]"]


def test_rows_take_the_slowest_rank_and_growth_compares_world_sizes() -> None:
    def figures(sent: int, seconds: list[float]) -> RankFigures:
        return RankFigures(sent=[sent], received=[sent], seconds=seconds)

    ranks = [figures(10, [1.0, 3.0, 2.0]), figures(30, [2.0, 1.0, 1.0])]
    small = make_row("s", "c", ranks, 8, timed="")
    assert small.sent_mean == 20 and small.sent_max == 30 and small.busiest_rank_bytes == 60
    assert small.ms_per_step == 2000.0  # per step max over ranks (2, 3, 2), then the median
    large = make_row("s", "c", [figures(70, [1.0])] * 4, 8, timed="")
    (item,) = growth([small, large])
    assert (item.from_p, item.to_p, item.sent_mean_ratio) == (2, 4, 3.5)
    assert "3.50x" in "\n".join(format_growth([item]))


def test_cli_parses_collectives_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    argv = "bench collectives --world-sizes 2,4 --numel 64 --steps 2 --schemes allgather"
    args = build_parser().parse_args(
        [*argv.split(), "--compressors", "dqsg", "qsgd", "--json", "out.json"]
    )
    assert args.world_sizes == [2, 4] and args.numel == 64 and args.steps == 2
    assert args.schemes == ["allgather"] and args.compressors == ["dqsg", "qsgd"]
    assert args.json == "out.json" and not args.no_baselines
    defaults = build_parser().parse_args(["bench", "collectives"])
    assert defaults.world_sizes == [2, 4, 8] and defaults.numel == 1 << 20
    assert defaults.steps == 3 and defaults.schemes is None and defaults.compressors is None
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "collectives", "--world-sizes", "1,x"])
    assert main(["bench", "collectives", "--schemes", "nope"]) == 2
    assert "nope" in capsys.readouterr().err
