"""The one check of an enumeration parameter: a value among its ``Literal`` alias's values.

Every parameter that takes one of a few fixed strings is annotated with a ``Literal`` alias
defined beside its meaning (``Packing`` in :mod:`gradzip.codecs.symbols`, ``Downlink`` in
:mod:`gradzip.schemes.parameter_server`, ...), so type checkers see the choices; at run time
:func:`check_choice` refuses anything else with one line naming the parameter and the choices.
"""

from __future__ import annotations

from typing import Any, TypeVar, get_args

T = TypeVar("T")


def choices_of(alias: Any) -> tuple[Any, ...]:
    """The values a ``Literal`` alias allows, in their written order (nested aliases and
    unions of ``Literal`` s flattened)."""
    values: list[Any] = []
    for arg in get_args(alias):
        values.extend(choices_of(arg) if get_args(arg) else [arg])
    return tuple(dict.fromkeys(values))


def check_choice(parameter: str, value: T, choices: tuple[T, ...], where: str = "") -> T:
    """``value`` if it is among ``choices`` (a ``Literal`` alias's values), else ``ValueError``:
    ``"<where>: <parameter> must be one of (...), got <value>"``."""
    if not isinstance(value, str | int | bool | type(None)) or value not in choices:
        prefix = f"{where}: " if where else ""
        raise ValueError(f"{prefix}{parameter} must be one of {choices}, got {value!r}")
    return value
