"""The training methods of ``gradzip train`` (``--method NAME``), by name.

A method is one :class:`~gradzip.experiments.methods.base.TrainingMethod` subclass in one file;
:func:`register` an instance and ``gradzip train --method`` offers it, ``--method-param``
fills in its options and its ``--help`` lists it.
"""

from __future__ import annotations

from gradzip.errors import ConfigError
from gradzip.experiments.methods.base import NoOptions, RankSetup, TrainingMethod, gather_metrics
from gradzip.experiments.methods.compressed import CompressedGradients
from gradzip.experiments.methods.qesgd import QESGD

#: every registered method by name (the default first)
METHODS: dict[str, TrainingMethod] = {}


def register(method: TrainingMethod) -> TrainingMethod:
    """Offer ``method`` to ``gradzip train --method`` under its name (a name once)."""
    if method.name in METHODS:
        raise ValueError(f"a training method {method.name!r} is already registered")
    METHODS[method.name] = method
    return method


def get_method(name: str) -> TrainingMethod:
    """The method called ``name``; :class:`ConfigError` naming the registered ones."""
    try:
        return METHODS[name]
    except KeyError:
        raise ConfigError(f"unknown method {name!r}; choose one of {', '.join(METHODS)}") from None


register(CompressedGradients())
register(QESGD())

__all__ = [
    "METHODS",
    "QESGD",
    "CompressedGradients",
    "NoOptions",
    "RankSetup",
    "TrainingMethod",
    "gather_metrics",
    "get_method",
    "register",
]
