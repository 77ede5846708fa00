"""The names the command line validates before anything heavy is imported.

The registries themselves (compressors, scheme variants, models, training methods) live in
modules that import torch, which takes seconds; a mistyped name must be refused in a fraction
of a second. So the command line checks names against these plain
copies of the built-in names first. ``tests/cli/test_catalog.py`` asserts that each copy
equals its registry, so a name added to a registry and forgotten here fails the tests instead
of being refused.

A registry can also grow at run time (a program that registers its own compressor or method,
then calls :func:`gradzip.cli.main`). Only a registry whose module is imported can hold such a
name, so the functions at the end ask the registry itself once its module is loaded (which
costs nothing then), and use the copies otherwise.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from types import ModuleType

#: gradzip.compressors.names(), in registration order
COMPRESSORS = (
    "identity",
    "fp16",
    "bf16",
    "dqsg",
    "half_dither",
    "ndqsg",
    "qsgd",
    "terngrad",
    "hou",
    "lpc",
    "qesgd",
    "qsgd_l2",
    "onebit",
    "threshold",
    "adaptive",
    "topk",
    "randk",
)

#: gradzip.schemes.VARIANTS
SCHEME_VARIANTS = (
    "allgather",
    "ps[fp32]",
    "ps[requantize]",
    "ps_intsum[sum]",
    "ps_intsum[requantize]",
    "allreduce",
    "ring",
    "ring_allreduce",
    "hierarchical[ranks_per_node=1]",
    "nested[allgather]",
    "nested[server]",
    "nested[server,dqsg-downlink]",
    "powersgd[r1]",
    "powersgd[r4]",
    "powersgd[r1,allreduce]",
    "powersgd[r1,start2]",
    "powersgd[r1,allreduce,start2]",
)

#: gradzip.schemes.SCHEMES: the scheme names above without their [options]
SCHEMES = tuple(dict.fromkeys(variant.partition("[")[0] for variant in SCHEME_VARIANTS))

#: gradzip.models.paper.MODELS
MODELS = ("fc-300-100", "lenet", "cifarnet", "dryden-mlp")

#: gradzip.experiments.methods.METHODS
METHODS = ("compressed-gradients", "qesgd")


def registered(
    module: str, read: Callable[[ModuleType], Iterable[str]], builtin: tuple[str, ...]
) -> tuple[str, ...]:
    """The names in the registry of ``module`` if it is imported, else the built-in ones."""
    loaded = sys.modules.get(module)
    return builtin if loaded is None else tuple(read(loaded))


def compressors() -> tuple[str, ...]:
    return registered("gradzip.compressors", lambda m: m.names(), COMPRESSORS)


def scheme_variants() -> tuple[str, ...]:
    return registered("gradzip.schemes", lambda m: m.VARIANTS, SCHEME_VARIANTS)


def schemes() -> tuple[str, ...]:
    return registered("gradzip.schemes", lambda m: m.SCHEMES, SCHEMES)


def models() -> tuple[str, ...]:
    return registered("gradzip.models.paper", lambda m: m.MODELS, MODELS)


def methods() -> tuple[str, ...]:
    return registered("gradzip.experiments.methods", lambda m: m.METHODS, METHODS)
