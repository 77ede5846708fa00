"""``gradzip bench codecs --device``: the device table (run here on the CPU, the same code as on
a GPU) has a row per codec against the device's clone() bandwidth, and ``--device cuda``
without a CUDA device is refused, naming the problem."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gradzip.cli import main
from gradzip.compressors import names
from gradzip_lab.bench import codecs_device

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")


def test_the_device_codecs_are_registry_names() -> None:
    assert set(codecs_device.DEVICE_CODECS) <= set(names())


def test_the_device_table_has_a_row_per_codec(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "device.json"
    figures = codecs_device.run(torch.device("cpu"), numel=4096, repeat=1, json_path=str(path))
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("clone() on the device:")
    assert lines[2].split()[:2] == ["compressor", "encode"]
    rows = [line.split() for line in lines[3 : 3 + len(codecs_device.DEVICE_CODECS)]]
    assert [row[0] for row in rows] == list(codecs_device.DEVICE_CODECS)
    assert all(float(row[4]) > 0 and row[6] == "host" for row in rows)  # rt / clone, payload on
    assert json.loads(path.read_text()) == json.loads(json.dumps(figures))
    by_name = {row["name"]: row for row in figures["codecs"]}
    # 32 bits a coordinate plus the header and CRC amortised over 4096 coordinates
    assert 32.0 < by_name["identity"]["payload_bits_per_coord"] < 32.1
    assert by_name["dqsg"]["round_trip_vs_clone"] == pytest.approx(
        by_name["dqsg"]["round_trip_gbps"] / figures["clone_gbps"]
    )


@no_cuda
def test_cuda_without_a_cuda_device_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "codecs", "--device", "cuda", "--numel", "4096"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gradzip bench codecs: --device cuda: no CUDA device")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_table_on_the_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "codecs", "--device", "cuda", "--numel", "65536", "--repeat", "1"]) == 0
    assert "clone() on the device" in capsys.readouterr().out
