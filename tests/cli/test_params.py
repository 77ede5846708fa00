"""The one ``KEY=VALUE`` grammar of ``--param``, ``--scheme-param`` and ``--method-param``
(:mod:`gradzip.cli.params`): values typed by the target's annotations, JSON for the rest,
one-line errors naming the key, the value and what was expected."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import pytest

from gradzip.cli import main
from gradzip.cli.params import ParamError, Target, compressor_params, parse_params, scheme_params


@dataclass(frozen=True)
class Options:
    count: int = 1
    rate: float = 0.5
    flag: bool = False
    name: str = "a"
    limit: int | None = None
    mode: Literal["fast", "slow"] = "fast"
    sizes: tuple[int, ...] = ()
    weights: list[float] | None = None
    extra: Any = None


TARGET = Target.of_dataclass("toy", Options)


def parse(*items: str) -> dict[str, Any]:
    return parse_params(items, TARGET, "--method-param")


@pytest.mark.parametrize(
    ("item", "value"),
    [
        ("count=3", 3),
        ("count= 3 ", 3),
        ("rate=2", 2.0),
        ("rate=1e-3", 1e-3),
        ("flag=true", True),
        ("flag=No", False),
        ("flag=1", True),
        ("name=b c", "b c"),
        ("name=3", "3"),  # a str stays a str
        ('name="quoted"', "quoted"),  # a JSON string literal
        ("name=", ""),
        ("limit=none", None),
        ("limit=null", None),
        ("limit=7", 7),
        ("mode=slow", "slow"),
        ("sizes=1,2,3", (1, 2, 3)),
        ("sizes=[4, 5]", (4, 5)),
        ("sizes=", ()),
        ("weights=0.5,1", [0.5, 1.0]),
        ("weights=None", None),
        ('extra=[1, {"a": 2}]', [1, {"a": 2}]),  # unknown type: a JSON literal
        ("extra=text", "text"),  # ... or the text itself
    ],
)
def test_values_are_typed_by_the_annotation(item: str, value: Any) -> None:
    key = item.partition("=")[0]
    parsed = parse(item)[key]
    assert parsed == value and type(parsed) is type(value)


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["count"], "--method-param takes KEY=VALUE, got 'count'"),
        (["=3"], "takes KEY=VALUE"),
        (["cnt=3"], "toy has no parameter 'cnt'; choices: count, rate, flag, name, limit, mode"),
        (["count=1", "count=2"], "toy parameter count is given twice"),
        (["count=1.5"], "toy parameter count expects int, got '1.5'"),
        (["count=true"], "expects int, got 'true'"),
        (["rate=fast"], "toy parameter rate expects float, got 'fast'"),
        (["flag=maybe"], "toy parameter flag expects bool, got 'maybe'"),
        (["limit=lots"], "toy parameter limit expects int or None, got 'lots'"),
        (["mode=medium"], "toy parameter mode expects one of fast, slow, got 'medium'"),
        (["sizes=1,x"], "toy parameter sizes expects tuple of int, got '1,x'"),
        (["sizes=[1,"], "expects tuple of int"),
        (["weights=a"], "expects list of float or None, got 'a'"),
    ],
)
def test_each_error_names_the_key_the_value_and_what_is_expected(
    items: list[str], message: str
) -> None:
    with pytest.raises(ParamError) as err:
        parse(*items)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).startswith("--method-param")


def test_compressor_and_scheme_targets_come_from_their_signatures() -> None:
    assert compressor_params("dqsg", ["M=4", "bucket_size=null"]) == {"M": 4, "bucket_size": None}
    with pytest.raises(ParamError, match="unknown compressor 'zip'"):
        compressor_params("zip", ["M=1"])
    with pytest.raises(
        ParamError, match="compressor 'dqsg' has no parameter 'levels'; choices: M,"
    ):
        compressor_params("dqsg", ["levels=3"])
    options = scheme_params("nested[server,dqsg-downlink]", ["ratio=0.25", "downlink_M=4"])
    assert options == {"ratio": 0.25, "downlink_M": 4}
    with pytest.raises(ParamError, match="unknown scheme 'nope'"):
        scheme_params("nope", ["x=1"])
    with pytest.raises(ParamError, match="--scheme-param: scheme 'allgather' has no parameter"):
        scheme_params("allgather", ["compressor=1"])  # set by the run, not the command line


@pytest.mark.parametrize(
    "argv",
    [
        ["bits", "--model", "lenet", "--compressor", "dqsg", "--param", "M=x"],
        ["train", "--no-progress", "--compressor", "dqsg", "--param", "M=x"],
    ],
)
def test_bits_and_train_give_the_same_message(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("--param: compressor 'dqsg' parameter M expects int, got 'x'"), err


def test_several_pairs_after_one_option_and_repeated_options_add_up() -> None:
    from gradzip.cli import build_parser

    args = build_parser().parse_args(
        ["train", "--param", "M=2", "bucket_size=none", "--param", "packing=dense"]
    )
    assert args.param == ["M=2", "bucket_size=none", "packing=dense"]
