"""``gradzip bench codecs`` (tiny, for speed): its figures, its JSON, its refusals, and the
setting each codec is benchmarked at."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gradzip.cli import main


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


def test_every_codec_is_benchmarked_at_a_setting_where_it_compresses() -> None:
    """``gradzip bench codecs`` reports speed at each codec's benchmark setting: it must
    compress the benchmark's standard normal input (threshold at tau = 1e-3 kept every entry,
    31.97 bits a coordinate). Only the uncompressed identity codec is exempt."""
    from gradzip.compressors import create, names
    from gradzip.keys import StreamKey
    from gradzip_lab.bench.codecs import bench_params

    x = torch.randn(1 << 14, generator=torch.Generator().manual_seed(1))
    for name in names():
        if name == "identity":
            continue
        enc = create(name, **bench_params(name)).encode(x, StreamKey())
        assert enc.wire_bits / x.numel() < 0.75 * 32, (name, enc.wire_bits / x.numel())
