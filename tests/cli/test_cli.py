"""The command line: list, bench codecs (tiny, for speed) and the Table 1 printout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gradzip.cli import main
from gradzip.compressors import names


def test_list_names_every_compressor(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "-v"]) == 0
    out = capsys.readouterr().out
    for name in names():
        assert f"\n{name} " in "\n" + out
    assert "codec id 10" in out


def test_list_experiments_models_and_schemes(capsys: pytest.CaptureFixture[str]) -> None:
    from gradzip.experiments.reproduce import EXPERIMENTS
    from gradzip.schemes import VARIANTS

    assert main(["list", "experiments"]) == 0
    out = capsys.readouterr().out
    assert all(f"\n{e} " in "\n" + out for e in EXPERIMENTS)
    assert main(["list", "models"]) == 0
    out = capsys.readouterr().out
    assert "fc-300-100  MNIST, input 1x28x28, 266,610 parameters" in out
    assert "1,663,370" in out and "1,068,298" in out
    assert main(["list", "schemes"]) == 0
    assert capsys.readouterr().out.split() == list(VARIANTS)
    with pytest.raises(SystemExit) as exit_info:
        main(["list", "tables"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'tables'" in capsys.readouterr().err


def test_bench_codecs_measures_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bench.json"
    args = ["bench", "codecs", "--numel", "4096", "--repeat", "1", "--only", "dqsg", "topk"]
    assert main([*args, "--json", str(path)]) == 0
    printed = capsys.readouterr().out
    assert "memcpy" in printed and "dqsg" in printed
    figures = json.loads(path.read_text())
    assert figures["numel"] == 4096 and figures["memcpy_gbps"] > 0
    rows = {row["name"]: row for row in figures["codecs"]}
    assert set(rows) == {"dqsg", "topk"}
    # 2 bits per coordinate plus the header, scale and CRC amortised over 4096 coordinates
    assert 2.0 < rows["dqsg"]["wire_bits_per_coord"] < 2.2
    # log2(3) bits per coordinate and one float32 scale per 512 coordinates
    assert rows["dqsg"]["paper_bits_per_coord"] == pytest.approx(1.585 + 32 / 512, abs=0.01)
    assert all(row["encode_gbps"] > 0 and row["decode_gbps"] > 0 for row in rows.values())
    assert all(row["decode_into_gbps"] > 0 for row in rows.values())
    # top-k among the codecs: its codings' table, bits measured on the same input
    sparse = {row["config"]: row for row in figures["sparse_codings"]}
    assert "sparse codings" in printed and len(sparse) == 13
    coded = sparse["topk(k=0, ratio=0.01, index_coding=rice, value_codec=qsgd, value_levels=1)"]
    plain = sparse["topk(k=0, ratio=0.01)"]
    assert coded["kept"] == plain["kept"] == 41
    assert coded["wire_bits_per_kept"] < plain["wire_bits_per_kept"]  # headers weigh at 41


def test_bench_rejects_unknown_names_and_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "codecs", "--only", "nope"]) == 2
    assert main(["bench", "codecs", "--numel", "0"]) == 2
    assert "unknown compressor" in capsys.readouterr().err


def test_an_unknown_compressor_parameter_lists_the_valid_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["train", "--param", "X=1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "has no parameter 'X'" in err and "L1, k, alpha, bucket_size, packing" in err
    assert "unexpected keyword" not in err
    assert main(["train", "--scheme-param", "bogus=1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--scheme-param" in err and "ratio" in err and "downlink" in err


def test_a_misspelled_option_shows_the_subcommands_usage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--wokers", "4"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: gradzip train ") and "unrecognized arguments: --wokers 4" in err
    with pytest.raises(SystemExit):
        main(["bench", "codecs", "--bogus"])
    assert capsys.readouterr().err.startswith("usage: gradzip bench codecs ")


def test_help_shows_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for shown in ("(default: 8)", "(default: adam)", "(default: 256)", "(default: 0.0)"):
        assert shown in out, shown


def test_every_codec_is_benchmarked_at_a_setting_where_it_compresses() -> None:
    """``gradzip bench codecs`` reports speed at each codec's benchmark setting: it must
    compress the benchmark's standard normal input (threshold at tau = 1e-3 kept every entry,
    31.97 bits a coordinate). Only the uncompressed identity codec is exempt."""
    from gradzip.bench.codecs import bench_params
    from gradzip.compressors import create, names
    from gradzip.keys import StreamKey

    x = torch.randn(1 << 14, generator=torch.Generator().manual_seed(1))
    for name in names():
        if name == "identity":
            continue
        enc = create(name, **bench_params(name)).encode(x, StreamKey())
        assert enc.wire_bits / x.numel() < 0.75 * 32, (name, enc.wire_bits / x.numel())
