"""The one grammar of ``--param``, ``--scheme-param`` and ``--method-param``: ``KEY=VALUE``.

The keys are the keyword parameters of a *target* (a compressor's or a scheme's constructor,
a training method's options dataclass); a key it does not take is refused with the keys it
does take. The value is converted by the key's annotation where it is one of ``int``,
``float``, ``bool``, ``str``, ``None`` (an ``Optional``/``X | None``), a ``Literal`` of those,
or a ``tuple``/``list`` of them (comma-separated, or a JSON list); for any other annotation
(or none) a JSON literal is read, and text that is not JSON is kept as a string. Booleans read
``true/false/yes/no/1/0`` and ``None`` reads ``none`` or ``null``, in any case; a JSON string
(``"text"``) is accepted wherever a string is. A key may be given once.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from gradzip.errors import GradzipError
from gradzip.experiments.exchange import keyword_parameters

_TRUE = ("true", "yes", "1")
_FALSE = ("false", "no", "0")
_NONE = ("none", "null")


class ParamError(GradzipError, ValueError):
    """A ``KEY=VALUE`` the target does not take; one line naming the key, the value and what
    is expected (the accepted keys, or the expected type)."""


@dataclass(frozen=True)
class Target:
    """What a set of ``KEY=VALUE`` pairs configures: a name for the messages (``compressor
    'dqsg'``), the keys it accepts in order, and the annotation of each (None: unknown)."""

    name: str
    hints: Mapping[str, Any]

    @property
    def keys(self) -> list[str]:
        return list(self.hints)

    @classmethod
    def of_callable(cls, name: str, target: Callable[..., Any], skip: Iterable[str] = ()) -> Target:
        """The keyword parameters of ``target`` (a class: its ``__init__``) but ``skip``."""
        function = target.__init__ if isinstance(target, type) else target  # type: ignore[misc]
        try:
            hints = typing.get_type_hints(function)
        except (NameError, TypeError):  # an annotation that does not resolve: JSON for all
            hints = {}
        return cls(
            name,
            {p.name: hints.get(p.name) for p in keyword_parameters(target) if p.name not in skip},
        )

    @classmethod
    def of_dataclass(cls, name: str, options: type) -> Target:
        """The fields of the dataclass ``options``."""
        assert is_dataclass(options)
        hints = typing.get_type_hints(options)
        return cls(name, {f.name: hints.get(f.name) for f in fields(options)})


def parse_params(items: Iterable[str], target: Target, option: str = "--param") -> dict[str, Any]:
    """``KEY=VALUE`` strings (``option``'s) to keyword arguments of ``target``, typed by their
    annotations; :class:`ParamError` for a malformed pair, an unknown or repeated key, or a
    value of the wrong type."""
    params: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ParamError(f"{option} takes KEY=VALUE, got {item!r}")
        if key not in target.hints:
            choices = ", ".join(target.keys) or "none"
            raise ParamError(
                f"{option}: {target.name} has no parameter {key!r}; choices: {choices}"
            )
        if key in params:
            raise ParamError(f"{option}: {target.name} parameter {key} is given twice")
        try:
            params[key] = convert(text, target.hints[key])
        except ValueError:
            raise ParamError(
                f"{option}: {target.name} parameter {key} expects "
                f"{describe(target.hints[key])}, got {text!r}"
            ) from None
    return params


def convert(text: str, hint: Any) -> Any:
    """``text`` as a value of the annotation ``hint`` (None: any JSON literal, else the text);
    ``ValueError`` if it is none of the types ``hint`` allows."""
    if hint is None or hint is Any:
        return _json_or_text(text)
    options = _union_members(hint)
    lowered = text.strip().lower()
    if type(None) in options and lowered in _NONE:
        return None
    for option in options:
        try:
            return _convert_one(text, option)
        except ValueError:
            continue
    raise ValueError(text)


def describe(hint: Any) -> str:
    """An annotation as the messages name it: ``int or None``, ``tuple of int``, ``JSON``."""
    if hint is None or hint is Any:
        return "a JSON literal"
    names = []
    members = _union_members(hint)
    for option in sorted(members, key=lambda m: m is type(None)):  # "int or None"
        origin = typing.get_origin(option)
        if option is type(None):
            names.append("None")
        elif origin is typing.Literal:
            names.append("one of " + ", ".join(map(str, typing.get_args(option))))
        elif origin in (tuple, list):
            inner = [a for a in typing.get_args(option) if a is not Ellipsis]
            names.append(f"{origin.__name__} of {' or '.join(describe(a) for a in inner)}")
        else:
            names.append(getattr(option, "__name__", str(option)))
    return " or ".join(names)


#: the order in which a union's members are tried: the narrowest reading of the text first
_PRIORITY = {type(None): 0, bool: 1, int: 2, float: 3, str: 5}


def _union_members(hint: Any) -> tuple[Any, ...]:
    """The members of a union annotation (``hint`` itself otherwise), narrowest first."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        members = typing.get_args(hint)
        return tuple(sorted(members, key=lambda m: _PRIORITY.get(m, 4)))
    return (hint,)


def _convert_one(text: str, hint: Any) -> Any:
    """``text`` as the single (non-union) type ``hint``; ``ValueError`` if it is not one."""
    stripped, lowered = text.strip(), text.strip().lower()
    origin = typing.get_origin(hint)
    if hint is bool:
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise ValueError(text)
    if hint is int:
        return int(stripped)
    if hint is float:
        return float(stripped)
    if hint is str:
        return _text(text)
    if hint is type(None):
        raise ValueError(text)  # handled by the caller (none/null)
    if origin is typing.Literal:
        for allowed in typing.get_args(hint):
            try:
                if _convert_one(text, type(allowed)) == allowed:
                    return allowed
            except ValueError:
                continue
        raise ValueError(text)
    if origin in (tuple, list):
        inner = [a for a in typing.get_args(hint) if a is not Ellipsis] or [None]
        if len(set(map(str, inner))) > 1:  # a fixed tuple of mixed types: JSON only
            return _json_or_text(text)
        parts = _sequence_items(text)
        return origin(convert(part, inner[0]) for part in parts)
    return _json_or_text(text)


def _sequence_items(text: str) -> list[str]:
    """A list's items as texts: a JSON list, or comma-separated values."""
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            decoded = json.loads(stripped)
        except json.JSONDecodeError:
            raise ValueError(text) from None
        if not isinstance(decoded, list):
            raise ValueError(text)
        return [item if isinstance(item, str) else json.dumps(item) for item in decoded]
    return [part for part in stripped.split(",") if part.strip()] if stripped else []


def _text(text: str) -> str:
    """A string value: a JSON string literal decoded, anything else as written."""
    stripped = text.strip()
    if len(stripped) >= 2 and stripped[0] == stripped[-1] == '"':
        try:
            decoded = json.loads(stripped)
        except json.JSONDecodeError:
            return text
        if isinstance(decoded, str):
            return decoded
    return text


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def compressor_params(
    compressor: str, items: Iterable[str], option: str = "--param"
) -> dict[str, Any]:
    """``items`` as keyword arguments of the registered compressor ``compressor``."""
    from gradzip.compressors import get, names

    if compressor not in names():
        raise ParamError(f"unknown compressor {compressor!r}; choices: {', '.join(names())}")
    return parse_params(
        items, Target.of_callable(f"compressor {compressor!r}", get(compressor)), option
    )


def scheme_params(
    variant: str, items: Iterable[str], option: str = "--scheme-param"
) -> dict[str, Any]:
    """``items`` as keyword arguments of the scheme ``variant`` (a scheme spec,
    :mod:`gradzip.schemes.spec`; its compressor and run seed are not among them: the run sets
    those)."""
    from gradzip.schemes import SchemeSpec

    try:
        cls = SchemeSpec.parse(variant).scheme_class
    except ValueError as err:
        raise ParamError(str(err)) from None
    target = Target.of_callable(f"scheme {variant!r}", cls, skip=("compressor", "run_seed"))
    return parse_params(items, target, option)
