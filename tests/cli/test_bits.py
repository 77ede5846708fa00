"""``gradzip bits --model M --compressor C``: Table 1 from one real gradient, without training."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from gradzip.cli import main
from gradzip.cli.params import ParamError, compressor_params
from gradzip.compressors import create
from gradzip.experiments.gradient_bits import measure_bits, model_gradient
from gradzip.keys import StreamKey
from gradzip.models.shapes import MODEL_SHAPES

FC_N = 266_610


def run_bits(tmp_path: Path, *args: str) -> dict[str, Any]:
    """Run ``gradzip bits`` with ``--json`` and return the figures it wrote."""
    path = tmp_path / "bits.json"
    assert main(["bits", *args, "--json", str(path)]) == 0
    figures: dict[str, Any] = json.loads(path.read_text())
    return figures


def test_fc_dqsg_m1_paper_bits_are_n_log2_3_plus_scales(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the paper's one scale per tensor (the library's default is 512-entry buckets)
    figures = run_bits(
        tmp_path,
        *("--model", "fc-300-100", "--compressor", "dqsg", "--param", "M=1", "bucket_size=none"),
    )
    out = capsys.readouterr().out
    expected = FC_N * math.log2(3) + 6 * 32
    assert figures["parameters"] == FC_N
    assert figures["paper_bits"] == pytest.approx(expected, rel=1e-4)
    assert figures["baseline_bits"] == 32 * FC_N
    assert "422.8" in out and "8531.5" in out and "Baseline 32n" in out
    # entropy of a ternary stream never exceeds log2(3) bits per symbol
    assert 0 < figures["entropy_bits"] <= figures["paper_bits"]
    assert len(figures["tensors"]) == 6


def test_the_default_dqsg_has_one_scale_per_512_entries(tmp_path: Path) -> None:
    figures = run_bits(tmp_path, "--model", "fc-300-100", "--compressor", "dqsg", "--param", "M=1")
    scales = sum(-(-math.prod(shape) // 512) for shape in MODEL_SHAPES["FC-300-100"])
    assert figures["paper_bits"] == pytest.approx(FC_N * math.log2(3) + 32 * scales, rel=1e-4)


def test_wire_bits_are_the_real_payload_sizes(tmp_path: Path) -> None:
    figures = run_bits(
        tmp_path, "--model", "fc-300-100", "--compressor", "dqsg", "--param", "M=1", "--seed", "3"
    )
    codec = create("dqsg", M=1)
    total = 0
    for i, g in enumerate(model_gradient("fc-300-100", seed=3)):
        key = StreamKey(run_seed=3, rank=0, step=0, tensor_index=i)
        enc = codec.encode(g, key)
        total += 8 * len(enc.payload)
        assert figures["tensors"][i]["payload_bytes"] == len(enc.payload)
        # the key is in the header: a receiver expecting it decodes the payload
        assert codec.decode(enc.payload, expected_key=key).shape == g.shape
    assert figures["wire_bits"] == total
    assert figures["wire_bits"] == sum(t["wire_bits"] for t in figures["tensors"])


@pytest.mark.parametrize(("model", "paper_kbit"), [("fc-300-100", 342.6), ("lenet", 1897.8)])
def test_onebit_paper_bits_match_table1(model: str, paper_kbit: float) -> None:
    # one (mu+, mu-) pair per row of the authors' [in, out] weights: n + 64 * #rows
    report = measure_bits(model, "onebit")
    assert report.paper_bits / 1000 == pytest.approx(paper_kbit, rel=0.0025)


def test_real_gradient_is_seeded() -> None:
    a, b, c = (model_gradient("lenet", seed=s, batch=2) for s in (1, 1, 2))
    assert all(x.equal(y) for x, y in zip(a, b, strict=True))
    assert not a[0].equal(c[0])
    assert all(g.abs().sum() > 0 for g in a)


def test_param_values_are_typed_by_the_signature() -> None:
    assert compressor_params("dqsg", ["M=2", "bucket_size=none", "packing=dense"]) == {
        "M": 2,
        "bucket_size": None,
        "packing": "dense",
    }
    assert compressor_params("threshold", ["tau=1", "rice_k=auto"]) == {
        "tau": 1.0,
        "rice_k": "auto",
    }
    assert compressor_params("onebit", ["sample=true"]) == {"sample": True}
    with pytest.raises(ParamError, match="expects int"):
        compressor_params("dqsg", ["M=1.5"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "vgg", "--compressor", "dqsg"], "unknown model 'vgg'; choices: fc-300-100"),
        (["--model", "lenet", "--compressor", "zip"], "unknown compressor 'zip'; choices: "),
        (["--model", "lenet", "--compressor", "dqsg", "--param", "foo=1"], "choices: M, "),
        (["--model", "lenet", "--compressor", "dqsg", "--param", "M=abc"], "expects int"),
        (["--model", "lenet", "--compressor", "dqsg", "--param", "M"], "KEY=VALUE"),
        (["--model", "lenet", "--compressor", "dqsg", "--param", "M=0"], "dqsg: M must be"),
        (["--model", "lenet", "--compressor", "threshold"], "needs --param tau=VALUE"),
        (["--model", "lenet", "--compressor", "identity", "--param", "a=1"], "choices: none"),
        (["--model", "lenet", "--compressor", "dqsg", "--batch", "0"], "batch must be >= 1"),
        (["--model", "lenet"], "give --model and --compressor"),
    ],
)
def test_bad_inputs_exit_2_with_one_line(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bits", *args]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1


def test_the_table1_subcommand_is_gone(capsys: pytest.CaptureFixture[str]) -> None:
    # Table 1 is made by `gradzip reproduce dqsg-table1`, in one place
    assert main(["bits", "table1"]) == 2
    assert "run `gradzip reproduce dqsg-table1`" in capsys.readouterr().err
    assert main(["bits", "--model", "lenet", "--compressor", "dqsg", "table2"]) == 2
    assert "unexpected argument 'table2'" in capsys.readouterr().err
