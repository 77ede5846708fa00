"""The one grammar of scheme names: ``powersgd[r1,start2]``, and the exchange names of the
benchmarks, ``gradzip:<compressor>[<params>][+ef]:<scheme>``.

A *scheme spec* is a scheme's name with its options in brackets:
``<name>[<option>,<option>,...]``, the brackets left out when there are none (``ps``,
``allgather``). An option is

* ``key=value``: any keyword parameter of the scheme's class that a text can give (a number, a
  flag, a choice), converted by its annotation (``powersgd[min_compression_rate=4]``);
* a choice of the scheme's main parameter on its own (``ps[requantize]``: ``downlink``;
  ``nested[server]``: ``topology``; ``powersgd[allreduce]``: ``factor_scheme``);
* ``<choice>-<parameter>`` for any other choice (``nested[server,dqsg-downlink]``);
* PowerSGD's ``r<N>`` (``rank``) and ``start<N>`` (``start_step``).

:class:`SchemeSpec` reads one (:meth:`SchemeSpec.parse`), writes it back in that form with the
options in the order of the class's parameters (``str``; ``parse(str(spec)) == spec``), and
builds the scheme around a compressor (:meth:`SchemeSpec.build`). The run seed and error
feedback are not options of a spec: they are the build's arguments (error feedback is said one
way, the scheme's ``error_feedback=`` flag). :class:`ExchangeSpec` adds the compressor, its
parameters and the error-feedback flag: ``gradzip:dqsg[M=2]:allgather``,
``gradzip:fp16+ef:powersgd[r1,start2]`` (the variants of ``gradzip bench cluster``).
"""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gradzip.compressors.base import Compressor
    from gradzip.schemes.base import Scheme

#: a value a spec's text can give
Value = bool | int | float | str | None
Options = tuple[tuple[str, Value], ...]

#: per scheme, the parameter whose choices stand alone in a spec (``ps[requantize]``)
_BARE: dict[str, str] = {
    "ps": "downlink",
    "ps_intsum": "downlink",
    "nested": "topology",
    "powersgd": "factor_scheme",
}
#: per scheme, the integer parameters written as a prefix and the number (``powersgd[r4]``)
_NUMBERED: dict[str, dict[str, str]] = {"powersgd": {"r": "rank", "start": "start_step"}}
#: parameters a spec never sets: the build's arguments
_NOT_OPTIONS = ("compressor", "run_seed", "error_feedback")
_SPEC = re.compile(r"([A-Za-z_][\w-]*)(?:\[([^\[\]]*)\])?")
_EXCHANGE = re.compile(r"gradzip:([A-Za-z_][\w-]*)(?:\[([^\[\]]*)\])?(\+ef)?:(.+)")


@dataclass(frozen=True)
class SchemeSpec:
    """A scheme's name (a key of :data:`gradzip.schemes.SCHEMES`) and its options (keyword
    arguments of the class, in the order of its parameters)."""

    name: str
    options: Options = ()

    @classmethod
    def parse(cls, text: str) -> SchemeSpec:
        """``name[option,...]`` (see the module docstring); ``ValueError`` naming what is wrong
        and what the scheme accepts."""
        match = _SPEC.fullmatch(text.strip())
        if match is None:
            raise ValueError(f"a scheme is written name[option,...], got {text!r}")
        name, inside = match.group(1), match.group(2)
        scheme = scheme_class(name)
        hints = option_hints(scheme)
        options: dict[str, Value] = {}
        for token in _split(inside, text):
            key, value = _read_option(name, hints, token)
            if key in options:
                raise ValueError(f"scheme {text!r}: {key} is given twice")
            options[key] = value
        return cls.of(name, **options)

    @classmethod
    def of(cls, name: str, **options: Value) -> SchemeSpec:
        """The spec of scheme ``name`` with ``options`` (checked against the class's
        parameters, put in their order)."""
        hints = option_hints(scheme_class(name))
        unknown = sorted(set(options) - set(hints))
        if unknown:
            raise ValueError(
                f"scheme {name!r} has no option {', '.join(unknown)}; its options: "
                f"{', '.join(hints) or 'none'}"
            )
        return cls(name, tuple((key, options[key]) for key in hints if key in options))

    @property
    def scheme_class(self) -> type[Scheme]:
        return scheme_class(self.name)

    def kwargs(self) -> dict[str, Value]:
        return dict(self.options)

    def build(
        self,
        compressor: Compressor,
        *,
        run_seed: int = 0,
        error_feedback: bool = False,
        **overrides: Any,
    ) -> Scheme:
        """The scheme around ``compressor``; ``overrides`` add to or replace the spec's options
        (including those a text cannot give, such as the nested scheme's ``coarse``)."""
        options = {**self.kwargs(), **overrides}
        return self.scheme_class(
            compressor, run_seed=run_seed, error_feedback=error_feedback, **options
        )

    def __str__(self) -> str:
        if not self.options:
            return self.name
        hints = option_hints(self.scheme_class)
        parts = [_write_option(self.name, hints, key, value) for key, value in self.options]
        return f"{self.name}[{','.join(parts)}]"


@dataclass(frozen=True)
class ExchangeSpec:
    """``gradzip:<compressor>[<params>][+ef]:<scheme spec>``: a compressor with its
    parameters, whether error feedback is on, and the scheme."""

    compressor: str
    params: Options
    error_feedback: bool
    scheme: SchemeSpec

    @classmethod
    def parse(cls, text: str) -> ExchangeSpec:
        match = _EXCHANGE.fullmatch(text.strip())
        if match is None:
            raise ValueError(
                f"an exchange is written gradzip:<compressor>[<params>][+ef]:<scheme>, got {text!r}"
            )
        compressor, inside, ef, scheme = match.groups()
        hints = compressor_hints(compressor)
        params: dict[str, Value] = {}
        for token in _split(inside, text):
            key, sep, value = token.partition("=")
            if not sep or key.strip() not in hints:
                raise ValueError(
                    f"{text!r}: compressor {compressor!r} takes key=value parameters of "
                    f"{', '.join(hints) or 'none'}, got {token!r}"
                )
            params[key.strip()] = _convert(value, hints[key.strip()], f"{compressor} {key}")
        return cls.of(compressor, params, ef is not None, SchemeSpec.parse(scheme))

    @classmethod
    def of(
        cls,
        compressor: str,
        params: typing.Mapping[str, Value],
        error_feedback: bool,
        scheme: SchemeSpec | str,
    ) -> ExchangeSpec:
        """The spec with ``params`` checked against the compressor's and in its order."""
        hints = compressor_hints(compressor)
        unknown = sorted(set(params) - set(hints))
        if unknown:
            raise ValueError(f"compressor {compressor!r} has no parameter {', '.join(unknown)}")
        ordered = tuple((key, params[key]) for key in hints if key in params)
        spec = SchemeSpec.parse(scheme) if isinstance(scheme, str) else scheme
        return cls(compressor, ordered, error_feedback, spec)

    def build(self, run_seed: int = 0) -> Scheme:
        """The scheme around a fresh compressor."""
        from gradzip.compressors import create

        compressor = create(self.compressor, **dict(self.params))
        return self.scheme.build(compressor, run_seed=run_seed, error_feedback=self.error_feedback)

    def __str__(self) -> str:
        params = ",".join(f"{key}={_text(value)}" for key, value in self.params)
        inside = f"[{params}]" if params else ""
        ef = "+ef" if self.error_feedback else ""
        return f"gradzip:{self.compressor}{inside}{ef}:{self.scheme}"


def scheme_class(name: str) -> type[Scheme]:
    """The class of the scheme called ``name``; ``ValueError`` naming the schemes."""
    from gradzip.schemes.registry import SCHEMES

    try:
        return SCHEMES[name]
    except KeyError:
        raise ValueError(f"unknown scheme {name!r}; choose one of {', '.join(SCHEMES)}") from None


def option_hints(scheme: type[Scheme]) -> dict[str, Any]:
    """The keyword parameters of ``scheme`` a spec can set, with their annotations."""
    return _hints(scheme, _NOT_OPTIONS)


def compressor_hints(name: str) -> dict[str, Any]:
    """The parameters of the registered compressor ``name`` with their annotations."""
    from gradzip.compressors import get

    try:
        cls = get(name)
    except (KeyError, ValueError) as err:
        raise ValueError(str(err).strip("'\"")) from None
    return _hints(cls, ())


def _hints(cls: type, skip: tuple[str, ...]) -> dict[str, Any]:
    function = cls.__init__  # type: ignore[misc]
    try:
        hints = typing.get_type_hints(function)
    except (NameError, TypeError):
        hints = {}
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {
        p.name: hints.get(p.name)
        for p in inspect.signature(function).parameters.values()
        if p.name != "self" and p.kind in kinds and p.name not in skip
    }


def _split(inside: str | None, text: str) -> list[str]:
    if inside is None:
        return []
    tokens = [token.strip() for token in inside.split(",")]
    if not all(tokens):
        raise ValueError(f"{text!r}: an empty option between the brackets")
    return tokens


def _choices(hint: Any) -> tuple[str, ...]:
    """The string values of the ``Literal`` s in ``hint`` (a union's members included)."""
    from gradzip.choices import choices_of

    members = [hint, *typing.get_args(hint)] if _is_union(hint) else [hint]
    found: list[str] = []
    for member in members:
        if typing.get_origin(member) is typing.Literal:
            found.extend(v for v in choices_of(member) if isinstance(v, str))
    return tuple(found)


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _read_option(name: str, hints: dict[str, Any], token: str) -> tuple[str, Value]:
    key, sep, text = token.partition("=")
    if sep:
        key = key.strip()
        if key not in hints:
            raise ValueError(
                f"scheme {name!r} has no option {key!r}; its options: {', '.join(hints) or 'none'}"
            )
        return key, _convert(text, hints[key], f"scheme {name!r} option {key}")
    for prefix, param in _NUMBERED.get(name, {}).items():
        number = re.fullmatch(rf"{prefix}(\d+)", token)
        if number is not None:
            return param, int(number.group(1))
    bare = _BARE.get(name)
    if bare is not None and token in _choices(hints[bare]):
        return bare, token
    value, dash, param = token.rpartition("-")
    if dash and param in hints and value in _choices(hints[param]):
        return param, value
    raise ValueError(f"scheme {name!r} has no option {token!r}; {_forms(name, hints)}")


def _forms(name: str, hints: dict[str, Any]) -> str:
    """What the options of scheme ``name`` may be, for a message."""
    forms = []
    bare = _BARE.get(name)
    if bare is not None:
        forms.append(f"{' or '.join(_choices(hints[bare]))} ({bare})")
    forms += [f"{prefix}<N> ({param})" for prefix, param in _NUMBERED.get(name, {}).items()]
    forms += [
        f"<{'|'.join(_choices(h))}>-{p}" for p, h in hints.items() if _choices(h) and p != bare
    ]
    forms.append(f"key=value for {', '.join(hints)}" if hints else "no key=value")
    return "its options: " + "; ".join(forms)


def _write_option(name: str, hints: dict[str, Any], key: str, value: Value) -> str:
    for prefix, param in _NUMBERED.get(name, {}).items():
        if key == param and isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return f"{prefix}{value}"
    if isinstance(value, str) and value in _choices(hints.get(key)):
        return value if _BARE.get(name) == key else f"{value}-{key}"
    return f"{key}={_text(value)}"


def _text(value: Value) -> str:
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    return repr(value) if isinstance(value, float) else str(value)


def _convert(text: str, hint: Any, what: str) -> Value:
    """``text`` as a value of the annotation ``hint``: a choice of its ``Literal``, a bool
    (``true``/``false``), ``none``, an int, a float, a string; ``ValueError`` otherwise."""
    text = text.strip()
    members = typing.get_args(hint) if _is_union(hint) else (hint,)
    choices = _choices(hint)
    if text in choices:
        return text
    if type(None) in members and text.lower() in ("none", "null"):
        return None
    if bool in members and text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        if kind in members or hint is None:
            try:
                return kind(text)
            except ValueError:
                continue
    if str in members or hint is None:
        return text
    expected = ", ".join(repr(c) for c in choices) if choices else _describe(hint)
    raise ValueError(f"{what} takes {expected}, got {text!r}")


def _describe(hint: Any) -> str:
    members = typing.get_args(hint) if _is_union(hint) else (hint,)
    return " or ".join(getattr(m, "__name__", str(m)) for m in members)
