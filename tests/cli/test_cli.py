"""The command line: list, the parameters' errors, the usage and defaults in the help (the lab's
``gradzip bench codecs``: tests/lab/bench/test_bench_codecs.py)."""

from __future__ import annotations

import pytest

from gradzip.cli import main
from gradzip.compressors import names


def test_list_names_every_compressor(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "-v"]) == 0
    out = capsys.readouterr().out
    for name in names():
        assert f"\n{name} " in "\n" + out
    assert "codec id 10" in out


def test_list_experiments_models_and_schemes(capsys: pytest.CaptureFixture[str]) -> None:
    from gradzip.schemes import VARIANTS
    from gradzip_lab.reproduce import EXPERIMENTS

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
