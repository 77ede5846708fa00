"""``gradzip bench hook``: a DDP step per hook on one rank (gloo on the CPU here, two steps of
the small model) prints every variant with its ratios to torch's two hooks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from gradzip.cli import main
from gradzip_lab.bench.hook import DEFAULT_VARIANTS, REFERENCES

SMALL = ["--model", "fc-300-100", "--warmup", "2", "--steps", "2", "--threads", "1"]


def test_every_variant_steps_on_the_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "hook.json"
    assert main(["bench", "hook", "--device", "cpu", *SMALL, "--json", str(path)]) == 0
    out = capsys.readouterr().out
    table = out[out.index("\nvariant ") + 1 : out.index("\nwrote ")].splitlines()
    assert table[0].split()[:3] == ["variant", "ms/step", "fastest"]
    assert [line.split()[0] for line in table[1:]] == list(DEFAULT_VARIANTS)
    for line in table[1:]:
        ms, fastest, *ratios = (float(v) for v in line.split()[1:5])
        assert ms >= fastest > 0 and all(r > 0 for r in ratios)
    for column, reference in enumerate(REFERENCES, start=3):  # each reference's own ratio: 1
        assert table[1 + DEFAULT_VARIANTS.index(reference)].split()[column] == "1.000"
    figures = json.loads(path.read_text())
    assert [row["name"] for row in figures["variants"]] == list(DEFAULT_VARIANTS)
    assert all(len(row["seconds"]) == 2 for row in figures["variants"])
    assert not dist.is_initialized()  # the one-rank group is gone


def test_a_reference_not_run_leaves_its_ratio_out(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "hook", *SMALL, "--variants", "fp32", "fp16_hook"]) == 0
    last = capsys.readouterr().out.splitlines()[-1].split()
    assert last[0] == "fp16_hook" and last[3:5] == ["1.000", "-"]


def test_an_unknown_variant_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "hook", *SMALL, "--variants", "gzip"]) == 2
    assert "unknown variant(s) gzip" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_cuda_without_a_cuda_device_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "hook", "--device", "cuda", *SMALL]) == 2
    assert "--device cuda: no CUDA device" in capsys.readouterr().err
