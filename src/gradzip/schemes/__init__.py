"""Aggregation schemes: how the ranks' payloads become one averaged tensor.

Every scheme is a :class:`~gradzip.schemes.base.Scheme`; :data:`SCHEMES` maps the names that the
command line and the benchmarks use to the classes, and :func:`make_scheme` builds one.
"""

from __future__ import annotations

from typing import Any

from gradzip.compressors.base import Compressor
from gradzip.schemes.allgather_decode import AllGatherDecode
from gradzip.schemes.base import Scheme
from gradzip.schemes.integer_allreduce import IntegerAllreduce
from gradzip.schemes.nested import NestedScheme
from gradzip.schemes.parameter_server import ParameterServer
from gradzip.schemes.powersgd import PowerSGD
from gradzip.schemes.ring_requantize import RingRequantize
from gradzip.schemes.server_integer_sum import ServerIntegerSum

SCHEMES: dict[str, type[Scheme]] = {
    cls.name: cls
    for cls in (
        AllGatherDecode,
        ParameterServer,
        ServerIntegerSum,
        IntegerAllreduce,
        RingRequantize,
        NestedScheme,
        PowerSGD,
    )
}

#: Named configurations worth comparing: ``"name[option]" -> (scheme name, its options)``.
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "allgather": ("allgather", {}),
    "ps[fp32]": ("ps", {"downlink": "fp32"}),
    "ps[requantize]": ("ps", {"downlink": "requantize"}),
    "ps_intsum[sum]": ("ps_intsum", {"downlink": "sum"}),
    "ps_intsum[requantize]": ("ps_intsum", {"downlink": "requantize"}),
    "allreduce": ("allreduce", {}),
    "ring": ("ring", {}),
    "nested[allgather]": ("nested", {"topology": "allgather"}),
    "nested[server]": ("nested", {"topology": "server"}),
    "nested[server,dqsg-downlink]": ("nested", {"topology": "server", "downlink": "dqsg"}),
    "powersgd[r1]": ("powersgd", {"rank": 1}),
    "powersgd[r4]": ("powersgd", {"rank": 4}),
    "powersgd[r1,allreduce]": ("powersgd", {"rank": 1, "factor_scheme": "allreduce"}),
    # as PyTorch's hook is usually run (and in gradzip bench cluster): two uncompressed steps
    "powersgd[r1,start2]": ("powersgd", {"rank": 1, "start_step": 2}),
    "powersgd[r1,allreduce,start2]": (
        "powersgd",
        {"rank": 1, "factor_scheme": "allreduce", "start_step": 2},
    ),
}


def make_variant(variant: str, compressor: Compressor, **options: Any) -> Scheme:
    """The configuration ``variant`` of :data:`VARIANTS` (``options`` add to or override it)."""
    try:
        name, preset = VARIANTS[variant]
    except KeyError:
        raise ValueError(
            f"unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}"
        ) from None
    return make_scheme(name, compressor, **{**preset, **options})


def variant_accepts(variant: str, compressor: Compressor) -> bool:
    """Whether :func:`make_variant` builds ``variant`` around ``compressor`` (the variant's
    options included: PowerSGD's integer-sum factors need a quantizer on a shared grid)."""
    try:
        make_variant(variant, compressor)
    except ValueError:
        return False
    return True


def make_scheme(name: str, compressor: Compressor, **options: Any) -> Scheme:
    """The scheme called ``name`` around ``compressor`` (``options``: ``run_seed``,
    ``error_feedback`` and the scheme's own keyword arguments)."""
    try:
        cls = SCHEMES[name]
    except KeyError:
        raise ValueError(f"unknown scheme {name!r}; choose one of {', '.join(SCHEMES)}") from None
    return cls(compressor, **options)


__all__ = [
    "SCHEMES",
    "VARIANTS",
    "AllGatherDecode",
    "IntegerAllreduce",
    "NestedScheme",
    "ParameterServer",
    "PowerSGD",
    "RingRequantize",
    "Scheme",
    "ServerIntegerSum",
    "make_scheme",
    "make_variant",
    "variant_accepts",
]
