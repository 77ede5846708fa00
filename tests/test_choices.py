"""Every enumeration parameter is a ``Literal`` alias, and a value outside it is refused at run
time with one line naming the parameter and the values it allows."""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any

import pytest
import torch

import gradzip
from gradzip.choices import check_choice, choices_of
from gradzip.comm.local import LocalGroup
from gradzip.schemes import SCHEMES

BAD = "no-such-choice"


def literal_parameters(target: Callable[..., Any]) -> dict[str, tuple[Any, ...]]:
    """The parameters of ``target`` (a class: its ``__init__``) annotated with a ``Literal``
    (alone or in a union), and the string values each allows."""
    function = target.__init__ if isinstance(target, type) else target  # type: ignore[misc]
    found = {}
    for name, hint in typing.get_type_hints(function).items():
        members = typing.get_args(hint) if typing.get_origin(hint) is not typing.Literal else ()
        literals = [hint] if typing.get_origin(hint) is typing.Literal else []
        literals += [m for m in members if typing.get_origin(m) is typing.Literal]
        values = tuple(v for lit in literals for v in choices_of(lit) if isinstance(v, str))
        if values and name != "return":
            found[name] = values
    return found


def assert_refused(build: Callable[[], object], parameter: str, allowed: tuple[Any, ...]) -> None:
    with pytest.raises(ValueError) as info:
        build()
    message = str(info.value)
    assert parameter in message and BAD in message, message
    for value in allowed:
        assert repr(value) in message, message


def _compressor_cases() -> list[tuple[str, str, tuple[Any, ...]]]:
    return [
        (name, param, allowed)
        for name in gradzip.names()
        for param, allowed in literal_parameters(gradzip.get(name)).items()
    ]


COMPRESSOR_CASES = _compressor_cases()


def test_the_enumerations_are_literals() -> None:
    """Each parameter the issue names as an enumeration is a ``Literal`` now."""
    from gradzip.integrations.ddp import GradzipHookState
    from gradzip.schemes import NestedScheme, ParameterServer, PowerSGD, ServerIntegerSum
    from gradzip.sync import GradientSync

    assert set(literal_parameters(GradientSync)) == {"on_nonfinite"}
    assert "on_nonfinite" in literal_parameters(GradzipHookState)
    assert set(literal_parameters(NestedScheme)) == {"topology", "downlink"}
    assert set(literal_parameters(ParameterServer)) == {"downlink"}
    assert set(literal_parameters(ServerIntegerSum)) == {"downlink"}
    assert set(literal_parameters(PowerSGD)) == {"factor_scheme"}
    params = {(name, param) for name, param, _ in COMPRESSOR_CASES}
    assert {("qsgd", "packing"), ("qsgd", "norm"), ("topk", "index_coding")} <= params
    assert {("dqsg", "seed_schedule"), ("onebit", "group"), ("threshold", "rice_k")} <= params


@pytest.mark.parametrize(("name", "param", "allowed"), COMPRESSOR_CASES, ids=str)
def test_compressor_enumerations_refuse_other_values(
    name: str, param: str, allowed: tuple[Any, ...]
) -> None:
    cls = gradzip.get(name)
    params = {**cls.example_params, param: BAD}
    assert_refused(lambda: cls(**params), param, allowed)


SCHEME_CASES = [
    (name, param, allowed)
    for name, cls in SCHEMES.items()
    for param, allowed in literal_parameters(cls).items()
]


@pytest.mark.parametrize(("name", "param", "allowed"), SCHEME_CASES, ids=str)
def test_scheme_enumerations_refuse_other_values(
    name: str, param: str, allowed: tuple[Any, ...]
) -> None:
    compressor = gradzip.create("ndqsg" if name == "nested" else "dqsg")
    assert_refused(lambda: SCHEMES[name](compressor, **{param: BAD}), param, allowed)


def _other_cases() -> list[tuple[str, Callable[[], object], str, tuple[Any, ...]]]:
    from gradzip.algorithms.qesgd.codec import OffsetCodec
    from gradzip.algorithms.qesgd.state import check_output
    from gradzip.algorithms.svrg.channel import make_inner_scheme
    from gradzip.algorithms.svrg.config import LPCSVRGConfig, SGDConfig
    from gradzip.integrations.ddp import GradzipHookState
    from gradzip.keys import StreamKey
    from gradzip.models.layers import Dense
    from gradzip.rng import derive_seed
    from gradzip.seed_schedule import SeedSchedule
    from gradzip.sync import GradientSync
    from gradzip_lab.reproduce.dqgan.gaussian_ring import mlp

    def transport() -> Any:
        return LocalGroup(1).endpoint(0)

    comp = gradzip.create("dqsg")
    on_nonfinite = ("raise", "skip")
    return [
        (
            "GradientSync.on_nonfinite",
            lambda: GradientSync(transport(), comp, on_nonfinite=BAD),  # type: ignore[arg-type]
            "on_nonfinite",
            on_nonfinite,
        ),
        (
            "GradzipHookState.on_nonfinite",
            lambda: GradzipHookState(
                gradzip.schemes.AllGatherDecode(comp),
                torch.nn.Linear(2, 2),
                on_nonfinite=BAD,  # type: ignore[arg-type]
            ),
            "on_nonfinite",
            on_nonfinite,
        ),
        (
            "SeedSchedule.seed_schedule",
            lambda: SeedSchedule(BAD),  # type: ignore[arg-type]
            "seed_schedule",
            ("keyed", "chain"),
        ),
        (
            "derive_seed.domain",
            lambda: derive_seed(StreamKey(0, 0, 0, 0), domain=BAD),  # type: ignore[arg-type]
            "domain",
            ("shared", "local"),
        ),
        (
            "Dense.layout",
            lambda: Dense(2, 2, layout=BAD),  # type: ignore[arg-type]
            "layout",
            ("in_out", "out_in"),
        ),
        (
            "mlp.activation",
            lambda: mlp([2, 2], torch.Generator(), activation=BAD),  # type: ignore[arg-type]
            "activation",
            ("relu", "tanh"),
        ),
        (
            "qesgd output",
            lambda: check_output(BAD),  # type: ignore[arg-type]
            "output",
            ("average", "last"),
        ),
        (
            "OffsetCodec.packing",
            lambda: OffsetCodec(packing=BAD),  # type: ignore[arg-type]
            "packing",
            ("fixed", "dense", "entropy"),
        ),
        (
            "make_inner_scheme.scheme",
            lambda: make_inner_scheme(BAD, 4),  # type: ignore[arg-type]
            "scheme",
            ("a", "b", "c"),
        ),
        (
            "LPCSVRGConfig.output",
            lambda: LPCSVRGConfig(output=BAD),  # type: ignore[arg-type]
            "output",
            ("last", "random"),
        ),
        (
            "SGDConfig.method",
            lambda: SGDConfig(method=BAD),  # type: ignore[arg-type]
            "method",
            ("sgd", "qsgd", "ecq-sgd"),
        ),
    ]


OTHER_CASES = _other_cases()


@pytest.mark.parametrize(
    ("build", "param", "allowed"),
    [case[1:] for case in OTHER_CASES],
    ids=[case[0] for case in OTHER_CASES],
)
def test_other_enumerations_refuse_other_values(
    build: Callable[[], object], param: str, allowed: tuple[Any, ...]
) -> None:
    assert_refused(build, param, allowed)


@pytest.mark.parametrize("field", ["optimizer", "backend"])
def test_train_config_enumerations_refuse_other_values(field: str) -> None:
    from gradzip.experiments.config import BACKENDS, OPTIMIZERS, TrainConfig

    allowed = {"optimizer": OPTIMIZERS, "backend": BACKENDS}[field]
    with pytest.raises(gradzip.errors.ConfigError) as info:
        TrainConfig(**{field: BAD}).check_values()  # type: ignore[arg-type]
    assert field in str(info.value) and all(value in str(info.value) for value in allowed)


def test_check_choice_names_the_parameter_and_the_choices() -> None:
    assert check_choice("packing", "dense", ("fixed", "dense")) == "dense"
    with pytest.raises(ValueError, match=r"^qsgd: norm must be one of \('max', 'l2'\), got 'x'$"):
        check_choice("norm", "x", ("max", "l2"), "qsgd")
    with pytest.raises(ValueError, match="got \\['max'\\]"):  # unhashable: refused, not a crash
        check_choice("norm", ["max"], ("max", "l2"))  # type: ignore[arg-type]
